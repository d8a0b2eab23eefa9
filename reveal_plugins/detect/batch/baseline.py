"""Baselines across runs: what healthy runs of a workload class look like, per channel.

``reveal baseline fit RUN_DIR... --out FILE`` stores, for every channel present in all the given
runs, the typical level of its 3-s window means (median) and how much it varies (MAD, the spread
between runs' medians, a practical floor and 5 % of the level).  ``reveal analyze DIR --baseline
FILE`` then scores every window of a new run against it, so a run that is abnormal from its
first second to its last (a persistent misconfiguration: a CPU hog left running, a throttled
link, a wrong governor) is flagged although nothing changes *within* the run.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

import numpy as np

from .features import channel_floors

SCHEMA = "reveal.baseline/1"
REL_FLOOR = 0.05


#: Memory "level" gauges that drift between runs with the page cache, not with the job.
_SKIP = ("memory.Cached", "memory.Buffers", "memory.MemFree", "memory.Inactive",
         "memory.Active", "memory.Dirty", "memory.Writeback", "memory.Mapped",
         "memory.Slab", "memory.SReclaimable", "memory.SUnreclaim", "memory.KReclaimable",
         "memory.Shmem", "memory.PageTables", "memory.KernelStack", "memory.Unevictable",
         "memory.Mlocked", "memory.Vmalloc", "memory.Percpu", "memory.MemTotal",
         "memory.Hugepages", "memory.HugePages", "memory.DirectMap", "memory.CmaFree")


def columns(names: Sequence[str], baseline: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Columns of ``names`` the baseline covers, with its centre and scale for each (the
    analysis scores every window against them: the baseline evidence family)."""
    bch = {c["name"]: c for c in baseline.get("channels", [])}
    cols, cen, sca = [], [], []
    for i, n in enumerate(names):
        c = bch.get(n)
        if c is None or n.startswith(_SKIP):
            continue
        cols.append(i)
        cen.append(float(c["center"]))
        sca.append(float(c["scale"]))
    return np.array(cols, np.intp), np.array(cen), np.array(sca)


class BaselineError(ValueError):
    """A baseline file cannot be used; the message names the file and the key."""


def fit_baseline(run_dirs: Sequence[str], config: dict | None = None,
                 name: str | None = None) -> dict[str, Any]:
    from ...store import store
    from ...types import ChannelMeta
    from .boundaries import boundaries, suppressed
    from ..config import FOREIGN_KEYS, detect_config
    from .prepare import load_prepared
    from .windows import windows_pieces as sliding_windows

    cfg = detect_config(config, ignore=FOREIGN_KEYS)
    if not run_dirs:
        raise BaselineError("no run directory given")
    per_run: list[dict[str, np.ndarray]] = []
    units: dict[str, str] = {}
    runs = []
    for d in run_dirs:
        meta = store.read_meta(d)
        P, _, _, _ = load_prepared(d, [ChannelMeta.from_dict(c) for c in meta["channels"]])
        events = store.read_events(d)
        if len(P.t) < 2:
            raise BaselineError(f"{d}: run holds {len(P.t)} sample(s); a baseline needs "
                                "healthy runs with telemetry")
        win = sliding_windows(P.t, P.X, cfg.window_s, cfg.stride_s, P.interval_s,
                              stats=("mean",))
        starts, ends = boundaries(meta, events, float(P.t[0]), float(P.t[-1]))
        rows = win.valid & ~suppressed(win.start, win.end, starts, ends, cfg.warmup_s,
                                        cfg.cooldown_s)
        if rows.sum() < 5:
            raise BaselineError(f"{d}: only {int(rows.sum())} usable window(s) "
                                f"({P.t[-1] - P.t[0]:.0f} s of samples); use longer runs")
        M = win.stats["mean"][rows]
        per_run.append({n: M[:, i] for i, n in enumerate(P.names)})
        units.update(zip(P.names, P.units))
        runs.append({"run_dir": os.path.abspath(d),
                     "run_id": (meta.get("run") or {}).get("run_id"),
                     "samples": int(len(P.t)), "windows": int(rows.sum()),
                     "start": float(P.t[0]), "end": float(P.t[-1])})
    common = [n for n in per_run[0] if all(n in r for r in per_run)]
    chans = []
    floors = channel_floors(common, [units[n] for n in common])
    for n, fl in zip(common, floors):
        cols = [r[n][np.isfinite(r[n])] for r in per_run]
        if any(len(c) == 0 for c in cols):
            continue
        allv = np.concatenate(cols)
        med = float(np.median(allv))
        mad = 1.4826 * float(np.median(np.abs(allv - med)))
        between = float(np.std([np.median(c) for c in cols])) if len(cols) > 1 else 0.0
        scale = max(mad, between, float(fl), REL_FLOOR * abs(med), 1e-9)
        chans.append({"name": n, "unit": units[n], "center": med, "scale": scale,
                      "p05": float(np.quantile(allv, 0.05)),
                      "p95": float(np.quantile(allv, 0.95))})
    return {"schema": SCHEMA, "name": name, "created": time.time(), "runs": runs,
            "window_s": cfg.window_s, "stride_s": cfg.stride_s,
            "windows": int(sum(r["windows"] for r in runs)), "channels": chans}


def save(baseline: dict, path: str) -> None:
    data = {k: v for k, v in baseline.items() if not k.startswith("_")}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def load(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            b = json.load(f)
    except FileNotFoundError:
        raise BaselineError(f"{path}: baseline file not found") from None
    except json.JSONDecodeError as e:
        raise BaselineError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
    if not isinstance(b, dict) or b.get("schema") != SCHEMA:
        raise BaselineError(f"{path}: not a baseline (key 'schema' must be {SCHEMA!r}, got "
                            f"{b.get('schema') if isinstance(b, dict) else type(b).__name__!r})")
    for i, c in enumerate(b.get("channels") or []):
        for k in ("name", "center", "scale"):
            if k not in c:
                raise BaselineError(f"{path}: channels[{i}] lacks key {k!r}")
        if not (isinstance(c["scale"], (int, float)) and c["scale"] > 0):
            raise BaselineError(f"{path}: channels[{i}] ({c['name']}): 'scale' must be > 0, "
                                f"got {c['scale']!r}")
    b.setdefault("runs", [])
    b.setdefault("channels", [])
    b["_path"] = os.path.abspath(path)
    return b
