"""Finding run directories and their reports for ``reveal report``.

A target is a run directory (holds ``meta.json``), a job directory of the spool (holds one run
directory per node), a ``report.json`` file, or a Slurm job id looked up in the spool
(:func:`reveal_plugins.spool.job_run_dirs`).  A run directory without ``report.json`` is
analysed on the spot through the ``reveal_analyze`` hook.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from .. import spool
from ..store import store
from . import views

REQUIRED = ("schema", "run", "telemetry", "anomalies", "summary")


class ReportError(RuntimeError):
    """The target cannot be shown; the message names the path or job and what is wrong."""


def resolve_target(target: str, spool_dir: str | None = None) -> tuple[list[str], str | None]:
    """Return (run directories, job id or None) for a DIR, a report.json path, or a JOBID.

    For a report.json file the list holds the file path itself.
    """
    if os.path.isfile(target):
        return [target], None
    if os.path.isdir(target):
        if os.path.isfile(os.path.join(target, store.META)) or os.path.isfile(
                os.path.join(target, store.REPORT)):
            return [target], None
        subs = sorted(os.path.join(target, d) for d in os.listdir(target)
                      if os.path.isfile(os.path.join(target, d, store.META)))
        if subs:
            return subs, os.path.basename(os.path.normpath(target))
        raise ReportError(f"{target}: not a run directory (no meta.json) and holds no "
                          "run directories")
    if spool.JOB_ID_RE.match(target):
        dirs = spool.job_run_dirs(target, spool_dir)
        if not dirs:
            root = spool_dir or spool.spool_root()
            raise ReportError(f"job {target}: no run directories under "
                              f"{os.path.join(root, 'jobs', target)} (wrong node, or set "
                              "REVEAL_SPOOL / --spool to the spool the agent writes)")
        return dirs, target
    raise ReportError(f"{target}: no such directory or file, and not a Slurm job id")


def check_report(report: Any, where: str) -> dict:
    """Light structural check (the full schema is a test-time contract)."""
    if not isinstance(report, dict):
        raise ReportError(f"{where}: a report must be a JSON object, got {type(report).__name__}")
    missing = [k for k in REQUIRED if k not in report]
    if missing:
        raise ReportError(f"{where}: missing key(s) {', '.join(missing)}")
    for k in ("start", "end", "nodes"):
        if k not in report["run"]:
            raise ReportError(f"{where}: run: missing key {k!r}")
    for i, a in enumerate(report["anomalies"]):
        for k in ("start", "end", "subsystem", "evidence"):
            if k not in a:
                raise ReportError(f"{where}: anomalies[{i}]: missing key {k!r}")
    return report


def read_report(path: str) -> dict:
    try:
        with open(path) as f:
            rep = json.load(f)
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: "
                          f"{e.msg}") from None
    return check_report(rep, path)


def host_of(meta: dict) -> str:
    """The node name of a run directory's meta.json."""
    h = meta.get("run", {}).get("host") or meta.get("host")
    if isinstance(h, dict):
        h = h.get("hostname") or h.get("name")
    return str(h or "?")


def minimal_report(run_dir: str, reason: str) -> dict:
    """A report that only describes the run (no analysis ran), for display."""
    meta = store.read_meta(run_dir)
    run = meta.get("run", {})
    segs = store.segment_paths(run_dir)
    start = meta.get("start") or 0.0
    return {
        "schema": "reveal.report/1",
        "run": {"source": run.get("source", "local"), "job_id": run.get("job_id"),
                "step_id": run.get("step_id"), "user": run.get("user"),
                "command": run.get("command"), "exit_code": meta.get("exit_code"),
                "start": start, "end": meta.get("end") or start,
                "nodes": [host_of(meta)],
                "steps": meta.get("steps", [])},
        "telemetry": {"interval_s": meta.get("interval_s") or 0.1, "samples": 0,
                      "channels": len(meta.get("channels", [])),
                      "bytes_stored": sum(os.path.getsize(p) for p in segs),
                      "probes": [{"name": p.get("name", "?"), "available": bool(p.get("available")),
                                  "reason": p.get("reason")} for p in meta.get("probes", [])]},
        "anomalies": [],
        "summary": f"Not analysed: {reason}.",
        "analysed": False,
    }


@dataclass
class RunView:
    """What the renderers read from a run directory: metadata, a frame of the channels they
    show, events."""

    run_dir: str
    meta: dict
    frame: Any
    events: list[dict]
    channels: dict[str, dict] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def load_view(run_dir: str | None, extra: list[str] | tuple[str, ...] = ()) -> RunView | None:
    """Load the channels the reports show (plus ``extra``, e.g. evidence channels); None when
    ``run_dir`` is None or not a run directory."""
    if not run_dir or not os.path.isfile(os.path.join(run_dir, store.META)):
        return None
    meta = store.read_meta(run_dir)
    names = [c["name"] for c in meta.get("channels", [])]
    want = set(views.wanted_channels(names)) | (set(extra) & set(names))
    data = store.load_run(run_dir, channels=want)
    return RunView(run_dir, meta, data.frame, data.events,
                   {c["name"]: c for c in meta.get("channels", [])}, data.warnings)
