"""``reveal fleet baseline FLEET --by workload --out DIR``: one baseline per workload class,
from the index's window features of runs without findings.

Healthy runs: analysed with status ``ok``, no anomaly, exit code 0 (or unknown).  Per class,
the most recent ``max_runs`` of them are used.  Each file is a ``reveal.baseline/1`` baseline
(the format ``reveal baseline fit`` writes and ``reveal analyze --baseline`` reads), built from
per-run summaries instead of every window: ``center`` = median of the runs' window-mean
medians (weighted by windows), ``scale`` = max(median within-run MAD, spread between runs'
medians, the channel's unit floor, 5 % of the level) -- the same terms ``fit_baseline`` uses.
``DIR/index.json`` maps each class to its file.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..detect.batch.baseline import REL_FLOOR, SCHEMA


def _weighted_median(v: np.ndarray, w: np.ndarray) -> float:
    o = np.argsort(v)
    v, w = v[o], w[o]
    c = np.cumsum(w)
    return float(v[np.searchsorted(c, 0.5 * c[-1])])


def healthy_runs(fleet: str, by: str = "workload", max_runs: int = 200) -> dict[str, list[dict]]:
    """Per class, the healthy runs to learn from (most recent first)."""
    from .index import part_files
    cols = ["run_key", "run_dir", "run_id", "workload", "node", "partition", "status",
            "anomalous", "n_anomalies", "exit_code", "start", "end"]
    groups: dict[str, list[dict]] = {}
    for path in part_files(fleet, "runs"):
        for r in pq.read_table(path, columns=cols).to_pylist():
            if r["status"] != "ok" or r["n_anomalies"] or r["exit_code"] not in (0, None):
                continue
            cls = r.get(by) or "unknown"
            groups.setdefault(str(cls), []).append(r)
    for cls, runs in groups.items():
        runs.sort(key=lambda r: -(r["start"] or 0))
        del runs[max_runs:]
    return groups


def feature_rows(paths: list[str], keys: list[str]) -> list[dict]:
    """The Dask task: feature rows of the given runs from some part files."""
    ks = set(keys)
    import pyarrow as pa
    out = []
    for path in paths:
        t = pq.read_table(path)
        t = t.filter(pc.is_in(t.column("run_key"), value_set=pa.array(sorted(ks))))
        out += t.to_pylist()
    return out


def combine(name: str, runs: list[dict], rows: list[dict], min_share: float = 0.5
            ) -> dict[str, Any]:
    """A ``reveal.baseline/1`` dict from per-run feature rows of one class."""
    from ..detect.config import FOREIGN_KEYS, detect_config
    from ..detect.batch.features import unit_floor
    cfg = detect_config(None, ignore=FOREIGN_KEYS).as_dict()
    by_ch: dict[str, list[dict]] = {}
    for r in rows:
        by_ch.setdefault(r["channel"], []).append(r)
    have = {r["run_key"] for r in rows}
    used = [r for r in runs if r["run_key"] in have]
    need = max(1, int(np.ceil(min_share * len(used))))
    chans = []
    for ch in sorted(by_ch):
        rs = by_ch[ch]
        if len(rs) < need:
            continue
        med = np.array([r["median"] for r in rs])
        mad = np.array([r["mad"] for r in rs])
        w = np.array([max(1, r["windows"]) for r in rs], dtype=np.float64)
        ok = np.isfinite(med) & np.isfinite(mad)
        if not ok.any():
            continue
        med, mad, w = med[ok], mad[ok], w[ok]
        center = _weighted_median(med, w)
        between = float(np.std(med)) if len(med) > 1 else 0.0
        unit = rs[0].get("unit") or ""
        scale = max(_weighted_median(mad, w), between, float(unit_floor(ch, unit)),
                    REL_FLOOR * abs(center), 1e-9)
        chans.append({"name": ch, "unit": unit, "center": center, "scale": scale,
                      "p05": float(np.min([r["p05"] for r in rs])),
                      "p95": float(np.max([r["p95"] for r in rs])),
                      "runs": int(len(rs))})
    wins = {r["run_key"]: r["windows"] for r in rows}
    return {"schema": SCHEMA, "name": name, "created": time.time(),
            "source": "reveal fleet baseline",
            "runs": [{"run_dir": r["run_dir"], "run_id": r["run_id"], "node": r["node"],
                      "windows": int(wins.get(r["run_key"], 0)), "start": r["start"],
                      "end": r["end"]} for r in used],
            "window_s": cfg["window_s"], "stride_s": cfg["stride_s"],
            "windows": int(sum(wins.values())), "channels": chans}


def slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "workload"
    return s[:80]


def fit_fleet_baselines(fleet: str, out_dir: str, client=None, by: str = "workload",
                        min_runs: int = 3, max_runs: int = 200,
                        progress: bool | None = None) -> dict[str, Any]:
    from .index import check_fleet, part_files
    check_fleet(fleet)
    groups = healthy_runs(fleet, by, max_runs)
    keys = [r["run_key"] for runs in groups.values() if len(runs) >= min_runs for r in runs]
    files = part_files(fleet, "features")
    rows: list[dict] = []
    if keys and files:
        if client is None:
            rows = feature_rows(files, keys)
        else:
            from .dask_runtime import run_tasks
            for part in run_tasks(client, feature_rows, files, "collecting features",
                                  progress=progress, keys=keys):
                rows += part
    per_run: dict[str, list[dict]] = {}
    for r in rows:
        per_run.setdefault(r["run_key"], []).append(r)
    os.makedirs(out_dir, exist_ok=True)
    index: dict[str, Any] = {"schema": "reveal.fleet.baselines/1", "by": by, "baselines": {},
                             "skipped": {}}
    names: set[str] = set()
    for cls, runs in sorted(groups.items()):
        if len(runs) < min_runs:
            index["skipped"][cls] = f"{len(runs)} healthy run(s) < --min-runs {min_runs}"
            continue
        crow = [x for r in runs for x in per_run.get(r["run_key"], [])]
        if not crow:
            index["skipped"][cls] = "no window features in the index (indexed --no-features?)"
            continue
        b = combine(cls, runs, crow)
        fname = slug(cls)
        while fname in names:
            fname += "_"
        names.add(fname)
        path = os.path.join(out_dir, fname + ".json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(b, f, indent=1)
        os.replace(tmp, path)
        index["baselines"][cls] = {"file": fname + ".json", "runs": len(b["runs"]),
                                   "channels": len(b["channels"])}
    tmp = os.path.join(out_dir, ".index.json.tmp")
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, "index.json"))
    return index
