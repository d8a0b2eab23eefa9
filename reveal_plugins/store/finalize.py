"""Closing a run whose agent died (kill -9, OOM, node reboot) so it reads as finished.

The next hook (the Slurm Epilog's detached analysis) calls :func:`finalize_orphan` when the
agent could not close the run: ``end`` becomes the last stored sample's time, the steps still
open end there too, and ``finalized_by`` says who closed it.  Segments are never rewritten.
"""
from __future__ import annotations

import time
from typing import Any

import pyarrow.parquet as pq

from . import store


def last_sample_time(run_dir: str) -> float | None:
    """Time of the last sample in the newest readable segment (a torn one is skipped)."""
    for path in reversed(store.segment_paths(run_dir)):
        try:
            t = pq.read_table(store.segment_source(path), columns=["t_ms"]).column("t_ms")
        except Exception:
            continue
        if len(t):
            return float(t[len(t) - 1].as_py()) / 1000.0
    return None


def finalize_orphan(run_dir: str, exit_code: int | None, by: str) -> dict[str, Any] | None:
    """Close the run if no agent did; returns the new meta, or None when it was closed."""
    meta = store.read_meta(run_dir)
    if meta.get("end") is not None:
        return None
    end = last_sample_time(run_dir) or meta.get("start") or time.time()
    for s in meta.get("steps") or []:
        if s.get("end") is None:
            s["end"] = end
    meta.update(end=end, exit_code=exit_code, finalized_by=by)
    store.write_meta(run_dir, meta)
    try:
        store.clear_running(run_dir)
    except OSError:
        pass
    return meta


def exit_code_of(run_dir: str) -> int | None:
    """The exit code of the ``run_end`` event, when the agent wrote one."""
    code = None
    try:
        for e in store.read_events(run_dir):
            if e.get("event") == "run_end":
                c = e.get("exit_code")
                code = c if isinstance(c, int) and not isinstance(c, bool) else None
    except Exception:
        return None
    return code
