"""The analysis pipeline, stage by stage (:mod:`reveal_plugins.detect.batch.stages`):

    prepare -> windows -> features/detectors -> baseline -> events (with foreign load)
            -> evidence families -> attribution -> hints -> report

:func:`detect` works on plain arrays (tests feed it synthetic frames); :func:`analyze` loads a
run directory and never raises for bad data: an empty, constant, truncated or corrupt run gives
a valid report with a note, and a crash inside the analysis gives a report with ``status:
failed``.  Only a path that is not a run directory at all raises
:class:`reveal_plugins.store.store.StoreError` (its message names the path), and a bad
setting a ValueError naming the key.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Sequence

import numpy as np

from ..types import ChannelMeta
from .batch import stages
from .config import FOREIGN_KEYS, DetectConfig, detect_config
from .batch.detection import Detection  # noqa: F401  (re-exported)
from .evidence.hinting import hints_for  # noqa: F401  (re-exported: live mode and site code use it)
from .batch.prepare import Prepared, load_prepared, prepare
from .batch.report import failed_report, run_section, summary, telemetry_section, verdict_status, SCHEMA

log = logging.getLogger(__name__)

#: Documented defaults (the fields of :class:`reveal_plugins.detect.config.DetectConfig`).
DEFAULTS: dict[str, Any] = {k: f.default for k, f in DetectConfig.model_fields.items()
                            if k not in ("detectors", "live", "peers")}


def _config(config: "dict | DetectConfig | None") -> DetectConfig:
    """Validated settings, the typed model the stages receive as it is (a bad or unknown key
    is a ValueError naming it)."""
    return detect_config(config, ignore=FOREIGN_KEYS)


def detect(t: np.ndarray | None, values: np.ndarray | None, metas: Sequence[ChannelMeta],
           meta: dict | None = None, events: list[dict] | None = None,
           config: dict | None = None, baseline: dict | None = None,
           prepared: "Prepared | None" = None) -> Detection:
    """Find anomalies in one frame of raw samples (counters cumulative), or in an already
    ``prepared`` run (then ``t``/``values`` are ignored)."""
    cfg = _config(config)
    meta = meta or {}
    events = events or []
    out = Detection()
    P = prepared if prepared is not None else prepare(t, values, metas, interval_s=None,
                                                      drop=False)
    out.notes += P.notes
    out.samples = len(P.t)
    if len(P.t):
        out.t_first, out.t_last = float(P.t[0]), float(P.t[-1])
    out.analysis = {"window_s": cfg.window_s, "stride_s": cfg.stride_s,
                    "threshold": cfg.threshold, "channels_in": len(metas)}
    if len(P.t) < 2:
        out.notes.append(f"only {len(P.t)} sample(s): nothing to analyse")
        return out
    W = stages.window_stage(P, cfg, meta, events, out.notes, out.analysis)
    if W is None:
        return out
    M = stages.model_stage(P, W, cfg, out.notes, out.analysis)
    B = stages.baseline_stage(P, W, baseline, cfg, out.notes, out.analysis)
    E = stages.event_stage(P, W, M, B, cfg, out.analysis)
    stages.conclude(P, W, M, B, E, cfg, meta, events, out)
    return out


def load_baseline(baseline: Any) -> dict | None:
    if baseline is None or isinstance(baseline, dict):
        return baseline
    from .batch.baseline import load

    return load(str(baseline))


def analyze(run_dir: str, config: dict | None = None, baseline: Any = None) -> dict:
    """Analyse a run directory and return a ``reveal.report/1`` dict (not written to disk),
    with the job's own efficiency (:mod:`~reveal_plugins.detect.batch.efficiency`) beside the anomalies."""
    rep = _analyze(run_dir, config, baseline)
    try:
        from .batch.efficiency import job_efficiency
        from ..store import store
        eff = job_efficiency(run_dir, store.read_meta(run_dir))
    except Exception as e:  # noqa: BLE001 - a figure we cannot compute costs no report
        log.warning("job efficiency of %s not computed: %s", run_dir, e)
        rep.setdefault("notes", []).append(f"job efficiency not computed: {type(e).__name__}")
        eff = None
    if eff:
        rep["efficiency"] = eff
    return rep


def _analyze(run_dir: str, config: dict | None = None, baseline: Any = None) -> dict:
    from ..store import store

    t0 = time.perf_counter()
    meta = store.read_meta(run_dir)   # StoreError (not a run directory) propagates, clearly
    cfg = _config(config)             # ValueError for a bad setting, naming it
    bl = load_baseline(baseline)
    notes: list[str] = []
    try:
        metas = [ChannelMeta.from_dict(c) for c in meta["channels"]]
    except (ValueError, KeyError, TypeError) as e:
        raise store.StoreError(f"{os.path.join(run_dir, store.META)}: bad channel entry: "
                               f"{e}") from None
    samples, nbytes, t_first, t_last = 0, 0, None, None
    if cfg.full or _duration(run_dir, meta) > cfg.stream_after_s:
        return _analyze_streamed(run_dir, meta, metas, cfg, bl, t0)
    try:
        iv = meta.get("interval_s")
        P, nseg, nbytes, warn = load_prepared(run_dir, metas,
                                              float(iv) if isinstance(iv, (int, float))
                                              and iv > 0 else None)
        notes += warn
        events = store.read_events(run_dir, notes)
        samples = len(P.t)
        if samples:
            t_first, t_last = float(P.t[0]), float(P.t[-1])
        else:
            notes.append("the run holds no telemetry samples (no segment, or all unreadable)")
        det = detect(None, None, metas, meta, events, cfg, bl, prepared=P)
        del P
    except Exception as e:  # never a traceback for a user: a report that says what happened
        log.exception("analysis of %s failed", run_dir)
        return failed_report(meta, f"{type(e).__name__}: {e}", notes, samples=samples,
                             channels=len(metas), bytes_stored=nbytes, t_first=t_first,
                             t_last=t_last)
    return _report(meta, det, notes, samples, len(metas), nbytes, bl, t0)


def _report(meta: dict, det, notes: list[str], samples: int, channels: int, nbytes: int,
            bl: dict | None, t0: float) -> dict:
    """The report of a finished detection (in-memory or streamed)."""
    notes += det.notes
    det.analysis["seconds"] = round(time.perf_counter() - t0, 3)
    if bl is not None:
        det.analysis.setdefault("baseline", {})["file"] = bl.get("_path")
    status, reason = verdict_status(notes, samples)
    rep = {"schema": SCHEMA, "status": status, "status_reason": reason,
           "run": run_section(meta, det.t_first, det.t_last),
           "telemetry": telemetry_section(meta, samples, channels, nbytes, None),
           "anomalies": det.anomalies, "observations": det.observations, "notes": notes,
           "analysis": det.analysis}
    rep["summary"] = summary(rep)
    return rep


def _duration(run_dir: str, meta: dict) -> float:
    """How long the run is (meta.json's start/end, else its segments x their length)."""
    from ..store import store
    a, b = meta.get("start"), meta.get("end")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b >= a:
        return float(b - a)
    seg = meta.get("segment_s")
    return len(store.segment_paths(run_dir)) * (float(seg) if isinstance(seg, (int, float))
                                                 and seg > 0 else 10.0)


def _analyze_streamed(run_dir: str, meta: dict, metas: list, cfg: DetectConfig,
                      bl: dict | None, t0: float) -> dict:
    """A long run (or ``--full``): :mod:`~reveal_plugins.detect.longrun.bounded`, in bounded memory."""
    from ..store import store
    from .longrun.bounded import analyze_long

    notes: list[str] = []
    samples = nbytes = 0
    try:
        events = store.read_events(run_dir, notes)
        det, samples, nseg, nbytes = analyze_long(run_dir, meta, metas, cfg, bl, events,
                                                  cfg.full, notes)
    except Exception as e:  # never a traceback for a user: a report that says what happened
        log.exception("analysis of %s failed", run_dir)
        return failed_report(meta, f"{type(e).__name__}: {e}", notes, samples=samples,
                             channels=len(metas), bytes_stored=nbytes)
    return _report(meta, det, notes, samples, len(metas), nbytes, bl, t0)
