"""One run directory -> the fleet index's rows: identity, findings, window features.

Runs on Dask workers (:func:`extract_batch` is the task), so it never raises for one bad run:
an unreadable run becomes a row with ``status = "unreadable"`` and ``error`` saying why.

The pass runs as root over directories their users write (``reveal-runs/*``): the run
directory is opened once without following a symlink and read through that descriptor, every
file through :func:`reveal_plugins.store.store.open_regular` (no symlink followed, no
FIFO opened blocking, regular files within size caps), segments within the store's expansion
caps.  Who ran it comes from the file system, not from what the run says: a run directory and
``meta.json`` owned by root (the agent's spool, identities from Slurm) are taken at their word;
any other run is its ``meta.json`` owner's, and the workload it names is kept apart as
``user:<owner>/<workload>`` (a user cannot add runs to another team's workload baseline).
"""
from __future__ import annotations

import hashlib
import os
import pwd
import time
from typing import Any

import numpy as np

#: Interpreters and launchers: the workload is named by what they run, not by them.
_LAUNCHERS = {"python", "python3", "bash", "sh", "srun", "mpirun", "mpiexec", "torchrun",
              "reveal-torchrun", "env", "time", "numactl", "taskset", "apptainer",
              "singularity", "nice", "stdbuf", "uv", "conda"}
#: Slurm job names that say nothing about the workload.
_GENERIC_NAMES = {"", "bash", "sh", "interactive", "wrap", "sbatch", "script", "job"}


def run_key(run_dir: str) -> str:
    """Stable identity of a run in the index: its absolute path (a copy is another run)."""
    return hashlib.sha1(os.path.abspath(run_dir).encode(), usedforsecurity=False).hexdigest()[:16]


def signature(run_dir: str) -> str:
    """Changes whenever the run gains telemetry, events, metadata or a (new) report."""
    parts = []
    for name in ("meta.json", "report.json", "events.jsonl", "segments"):
        try:
            st = os.lstat(os.path.join(run_dir, name))
            parts.append(f"{st.st_mtime_ns}:{st.st_size}")
        except OSError:
            parts.append("-")
    return "|".join(parts)


def workload_of(run: dict[str, Any]) -> str:
    """Workload class: an explicit ``extra.workload``, the Slurm job name, else the command
    reduced to what it runs (``python train.py --lr 3`` -> ``python train.py``)."""
    extra = run.get("extra") or {}
    if extra.get("workload"):
        return str(extra["workload"])
    name = str(extra.get("job_name") or "").strip()
    if name.lower() not in _GENERIC_NAMES:
        return name
    cmd = run.get("command")
    if isinstance(cmd, str):
        cmd = cmd.split()
    if not cmd:
        return name or "unknown"
    words = [os.path.basename(str(w)) for w in cmd]
    out = [words[0]]
    base = words[0].rstrip("0123456789.")
    if base in _LAUNCHERS or words[0] in _LAUNCHERS:
        for w in words[1:]:
            if w.startswith("-") or "=" in w:
                continue
            out.append(w)
            if w.rstrip("0123456789.") not in _LAUNCHERS:
                break
    return " ".join(out)


def _day(t: float | None) -> str:
    if t is None or not np.isfinite(t):
        return "unknown"
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def _peer_suspects(report: dict) -> list[str]:
    """Nodes a multi-node report names as the odd one out (``peer_suspects`` or ``peers``)."""
    got = report.get("peer_suspects")
    for key in ("job_peers", "peers"):   # reveal analyze JOBDIR puts the job's verdict here
        if got is None and isinstance(report.get(key), dict):
            got = report[key].get("suspects")
    out = []
    for p in got or []:
        out.append(str(p.get("node") if isinstance(p, dict) else p))
    return out


def _stored_windows(run_dir: str, meta: dict, window_s: float):
    """Window means from the run's feature store (``DIR/features/``, written while the run
    went on) when it covers every segment: ``(start, end, valid, mean, names, units)``, else
    None (the caller recomputes from the segments)."""
    from ..detect.longrun import featstore
    from ..store import store
    fs = featstore.FeatureStore.for_run(run_dir)
    seqs = [int(store.SEGMENT_RE.match(os.path.basename(p)).group(1))
            for p in store.segment_paths(run_dir)]
    cover = fs.cover(seqs) if seqs else []
    if not cover or cover[-1][1] != seqs[-1]:
        return None
    names = None
    parts = []
    for _, _, path in cover:
        n = featstore.read_names(path)
        if names is not None and n != names:
            return None
        names = n
        parts.append(featstore.read(path, stats=("mean",)))
    ch = featstore.merge(parts)
    units = {c["name"]: (c.get("unit") or "") + ("/s" if c.get("kind") == "counter" else "")
             for c in meta.get("channels") or []}
    un = [units.get(n, "%" if n.endswith("_pct") else "") for n in names]
    return ch.start, ch.start + window_s, ch.valid, ch.stats["mean"], names, un


def run_features(run_dir: str, meta: dict, feature_store: bool = True
                 ) -> list[dict[str, Any]]:
    """Per channel: how its 3-s window means are distributed over the run's steady part (the
    same windows, warm-up/cool-down cut and derived channels ``reveal baseline fit`` uses).
    Read from the run's feature store when it has one (and ``feature_store``: only runs root
    wrote), else computed from the segments."""
    from ..detect.batch.boundaries import boundaries, suppressed
    from ..detect.config import FOREIGN_KEYS, detect_config
    from ..store import store

    cfg = detect_config(None, ignore=FOREIGN_KEYS).as_dict()
    got = None
    try:
        if feature_store:
            got = _stored_windows(run_dir, meta, cfg["window_s"])
    except Exception:   # a damaged feature file: the segments are the truth
        got = None
    if got is None:
        from ..detect.batch.prepare import load_prepared
        from ..detect.batch.windows import windows_pieces
        from ..types import ChannelMeta
        P, _, _, _ = load_prepared(run_dir, [ChannelMeta.from_dict(c)
                                             for c in meta["channels"]])
        if len(P.t) < 2:
            return []
        win = windows_pieces(P.t, P.X, cfg["window_s"], cfg["stride_s"], P.interval_s,
                             stats=("mean",))
        got = (win.start, win.end, win.valid, win.stats["mean"], P.names, P.units)
        t_first, t_last = float(P.t[0]), float(P.t[-1])
    else:
        t_first, t_last = float(got[0][0]), float(got[1][-1]) if len(got[1]) else 0.0
    wstart, wend, valid, mean, names, units = got
    if len(wstart) == 0:
        return []
    starts, ends = boundaries(meta, store.read_events(run_dir), t_first, t_last)
    rows = valid & ~suppressed(wstart, wend, starts, ends, cfg["warmup_s"], cfg["cooldown_s"])
    if rows.sum() < 1:
        return []
    M = mean[rows].astype(np.float64)
    out = []
    for i, (name, unit) in enumerate(zip(names, units)):
        col = M[:, i]
        col = col[np.isfinite(col)]
        if len(col) == 0:
            continue
        med = float(np.median(col))
        q05, q95 = np.quantile(col, [0.05, 0.95])
        out.append({"channel": name, "unit": unit, "windows": int(len(col)),
                    "mean": float(col.mean()), "median": med,
                    "mad": 1.4826 * float(np.median(np.abs(col - med))),
                    "p05": float(q05), "p95": float(q95)})
    return out


def _host_name(meta: dict) -> str | None:
    h = meta.get("host")
    if isinstance(h, dict):
        return h.get("hostname") or h.get("name")
    return h if isinstance(h, str) else None


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if np.isfinite(f) else None


def _user_name(uid: Any) -> str | None:
    if not isinstance(uid, int) or isinstance(uid, bool) or uid < 0:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"


def _trusted(dir_st: os.stat_result, meta_st: os.stat_result) -> bool:
    """``meta.json`` was written by root (or by whoever runs this pass) into a directory
    nobody else can write: the agent's spool, whose identities come from Slurm."""
    writers = {0, os.geteuid()}
    return (dir_st.st_uid in writers and meta_st.st_uid == dir_st.st_uid
            and not (dir_st.st_mode | meta_st.st_mode) & 0o022)


def _read_json(path: str, max_bytes: int, what: str):
    from ..store import store
    data, st = store.read_bounded(path, max_bytes, what)
    return store.parse_json(data, path), st


def extract_run(run_dir: str, features: bool = True) -> dict[str, Any]:
    """``{"run": row, "anomalies": [rows], "features": [rows], "day": "YYYY-MM-DD"}``."""
    run_dir = os.path.abspath(run_dir)
    key = run_key(run_dir)
    row: dict[str, Any] = {"run_key": key, "run_dir": run_dir, "indexed_at": time.time(),
                           "status": "unreadable", "error": None, "analysed": False,
                           "n_anomalies": 0, "anomalous": False, "subsystems": [],
                           "peer_suspects": []}
    out: dict[str, Any] = {"run": row, "anomalies": [], "features": [], "day": "unknown",
                           "signature": signature(run_dir)}
    try:
        dfd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        row["error"] = f"{run_dir}: {e.strerror} (a symlinked run directory is not followed)"
        return out
    try:
        # Every read below goes through this descriptor: a run directory swapped for a
        # symlink after discovery is not followed.
        pinned = f"/proc/self/fd/{dfd}"
        if not os.path.isdir(pinned):
            pinned = run_dir
        _extract(run_dir, pinned, os.fstat(dfd), row, out, key, features)
    finally:
        os.close(dfd)
    for k in ("error", "status_reason"):
        if isinstance(row.get(k), str) and pinned != run_dir:
            row[k] = row[k].replace(pinned, run_dir)
    return out


def _extract(run_dir: str, d: str, dir_st: os.stat_result, row: dict, out: dict, key: str,
             features: bool) -> None:
    from ..store import store
    try:
        meta, meta_st = _read_json(os.path.join(d, "meta.json"), store.MAX_META_BYTES,
                                   "meta.json")
        run = meta.get("run") or {}
        extra = run.get("extra") or {}
        cmd = run.get("command")
        trusted = _trusted(dir_st, meta_st)
        if trusted:
            user = run.get("user") or _user_name(run.get("uid"))
            workload = workload_of(run)
        else:   # the owner ran it, whatever the run says; its workload names are its own
            user = _user_name(meta_st.st_uid)
            workload = f"user:{user}/{workload_of(run)}"
        row.update(run_id=run.get("run_id"), source=run.get("source"),
                   job_id=None if run.get("job_id") is None else str(run["job_id"]),
                   step_id=None if run.get("step_id") is None else str(run["step_id"]),
                   user=None if user is None else str(user),
                   node=run.get("host") or _host_name(meta),
                   partition=extra.get("partition"), account=extra.get("account"),
                   workload=workload,
                   command=" ".join(map(str, cmd)) if isinstance(cmd, list) else cmd,
                   start=_num(meta.get("start")), end=_num(meta.get("end")),
                   exit_code=meta.get("exit_code"), channels=len(meta.get("channels") or []),
                   status="unanalysed")
        row["node"] = row["node"] or "unknown"
    except FileNotFoundError as e:
        row["error"] = f"{run_dir}/meta.json: {type(e).__name__}: {e}"
        return
    except store.StoreError as e:
        row["error"] = str(e)
        return
    except (OSError, ValueError, AttributeError, TypeError) as e:
        row["error"] = f"{run_dir}/meta.json: {type(e).__name__}: {e}"
        return
    report = None
    try:
        report, _ = _read_json(os.path.join(d, "report.json"), store.MAX_REPORT_BYTES,
                               "report.json")
    except FileNotFoundError:
        pass
    except store.StoreError as e:
        row["error"] = str(e)
    except (OSError, ValueError) as e:
        row["error"] = f"{run_dir}/report.json: {type(e).__name__}: {e}"
    if isinstance(report, dict):
        rr = report.get("run") or {}
        row["start"] = row["start"] if row["start"] is not None else _num(rr.get("start"))
        row["end"] = row["end"] if row["end"] is not None else _num(rr.get("end"))
        if row.get("exit_code") is None:
            row["exit_code"] = rr.get("exit_code")
        row["status"] = str(report.get("status") or "ok")
        row["status_reason"] = report.get("status_reason")
        row["analysed"] = row["status"] in ("ok", "partial")
        row["samples"] = (report.get("telemetry") or {}).get("samples")
        anoms = [a for a in report.get("anomalies") or [] if isinstance(a, dict)]
        subs: dict[str, float] = {}
        for a in anoms:
            sub = str(a.get("subsystem") or "system")
            s, e = _num(a.get("start")), _num(a.get("end"))
            dur = max(0.0, e - s) if s is not None and e is not None else 0.0
            subs[sub] = subs.get(sub, 0.0) + dur + 1e-9
            ev = (a.get("evidence") or [{}])[0] or {}
            hints = a.get("hints") or []
            sev = [h.get("severity") for h in hints if isinstance(h, dict)]
            out["anomalies"].append({
                "run_key": key, "node": a.get("node") or row["node"], "user": row.get("user"),
                "workload": row.get("workload"), "job_id": row.get("job_id"),
                "anomaly_id": str(a.get("id")), "subsystem": sub, "score": _num(a.get("score")),
                "start": s, "end": e, "duration_s": dur,
                "top_channel": ev.get("channel"), "top_deviation": _num(ev.get("deviation")),
                "hint": (hints[0] or {}).get("title") if hints else None,
                "severity": next((x for x in ("critical", "warning", "info") if x in sev),
                                 None)})
        row["n_anomalies"] = len(anoms)
        row["anomalous"] = bool(anoms) and row["analysed"]
        row["subsystems"] = sorted(subs)
        row["dominant_subsystem"] = max(subs, key=subs.get) if subs else None
        row["max_score"] = max((x["score"] for x in out["anomalies"] if x["score"] is not None),
                               default=None)
        row["anomaly_s"] = float(sum(x["duration_s"] for x in out["anomalies"]))
        row["peer_suspects"] = _peer_suspects(report)
    if row.get("start") is not None and row.get("end") is not None:
        row["duration_s"] = row["end"] - row["start"]
    if isinstance(row.get("exit_code"), bool) or not isinstance(row.get("exit_code"),
                                                                (int, type(None))):
        row["exit_code"] = None
    out["day"] = _day(row.get("start"))
    if features:
        try:
            feats = run_features(d, meta, feature_store=trusted)
        except Exception as e:  # a broken segment set never stops the fleet pass
            feats = []
            row["error"] = row["error"] or f"{run_dir}: features: {type(e).__name__}: {e}"
        for fr in feats:
            fr.update(run_key=key, workload=row.get("workload"), node=row["node"])
        out["features"] = feats


def extract_batch(run_dirs: list[str], features: bool = True) -> list[dict[str, Any]]:
    """The Dask task: a batch of runs (keeps the number of tasks small)."""
    return [extract_run(d, features) for d in run_dirs]
