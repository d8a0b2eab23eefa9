"""The analysis pipeline: prepare -> windows -> features -> prune -> detectors -> fuse ->
events -> attribution -> hints -> report.

:func:`detect` works on plain arrays (tests feed it synthetic frames); :func:`analyze` loads a
run directory and never raises for bad data: an empty, constant, truncated or corrupt run gives
a valid report with a note.  Only a path that is not a run directory at all raises
:class:`reveal_plugins.telemetry.store.StoreError` (its message names the path).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..types import ChannelMeta
from . import attribution as attr
from . import foreign as fl
from .detectors import builtin_detectors, fuse, normalize
from .events import group, hysteresis, span
from .features import channel_floors, feature_floors, feature_matrix, fit_scaler, rel_floors
from .prepare import PER_CORE, Prepared, informative, load_prepared, prepare
from .prune import prune
from .report import failed_report, partial_reason, run_section, summary, telemetry_section, SCHEMA
from .windows import STATS, windows_pieces as sliding_windows

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "window_s": 3.0,          # window length (paper: 3 s)
    "stride_s": 1.0,          # window stride (paper: 1 s)
    "prune_threshold": 0.5,   # |r| above which correlated channels are pruned (paper: 0.5)
    "threshold": 4.0,         # fused score (robust sigmas of the detectors' own scores)
    "low_fraction": 0.5,      # neighbours of a flagged window down to this share of it join
    "min_windows": 3,         # flagged windows an event needs
    "gap_s": 3.0,             # flagged windows closer than this merge into one event
    "warmup_s": 10.0,         # start of every run/step: interpreter start-up, data loading
    "cooldown_s": 3.0,        # end of every run/step: teardown
    "min_deviation": 4.0,     # an event needs a channel this far out (floored robust units)
    "baseline_threshold": 6.0,
    "max_anomalies": 50,
    "core_quantile": 0.6,     # detectors are fitted on this central share of the windows
    "require_symptom": True,  # activity without evidence (symptom, foreign load, slowdown,
                              # baseline) -> observation, not anomaly
    "foreign_z": 4.0,         # foreign load above its normal level by this many robust spreads
    "min_slowdown_pct": 10.0, # ...unless iteration markers show at least this slowdown
}


@dataclass
class Detection:
    """What :func:`detect` found, plus what the report needs to describe the analysis."""

    anomalies: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    analysis: dict = field(default_factory=dict)
    observations: list[dict] = field(default_factory=list)
    samples: int = 0
    t_first: float | None = None
    t_last: float | None = None


def _config(config: dict | None) -> dict:
    cfg = dict(DEFAULTS)
    for k, v in (config or {}).items():
        if k in DEFAULTS and v is not None:
            cfg[k] = type(DEFAULTS[k])(v)
        else:
            cfg[k] = v
    if cfg["stride_s"] <= 0 or cfg["window_s"] <= 0:
        raise ValueError(f"window_s/stride_s must be > 0 (got {cfg['window_s']}/"
                         f"{cfg['stride_s']})")
    return cfg


def _detectors(cfg: dict) -> list:
    try:
        from ..hooks.manager import call_safely

        dets = [d for lst in call_safely("reveal_detectors", config=cfg) for d in (lst or [])]
    except Exception as e:  # plugin manager unusable: keep the built-ins
        log.warning("detector plugins unavailable (%s); using built-ins", e)
        dets = []
    return dets or builtin_detectors(cfg)


def _boundaries(meta: dict, events: list[dict], t_first: float, t_last: float
                ) -> tuple[list[float], list[float]]:
    starts, ends = [t_first], [t_last]
    for s in meta.get("steps") or []:
        if isinstance(s, dict):
            if isinstance(s.get("start"), (int, float)):
                starts.append(float(s["start"]))
            if isinstance(s.get("end"), (int, float)):
                ends.append(float(s["end"]))
    for e in events:
        if e.get("event") == "step_start":
            starts.append(float(e["t"]))
        elif e.get("event") == "step_end":
            ends.append(float(e["t"]))
    return sorted(set(starts)), sorted(set(ends))


def _suppressed(ws: np.ndarray, we: np.ndarray, starts: list[float], ends: list[float],
                warmup: float, cooldown: float) -> np.ndarray:
    s = np.zeros(len(ws), bool)
    for a in starts:
        s |= (we > a) & (ws < a + warmup)
    for b in ends:
        s |= (we > b - cooldown) & (ws < b)
    return s


def _edge(s0: float, s1: float, starts: list[float], ends: list[float], cfg: dict) -> bool:
    """An event that begins right where the start-up grace ends (the start-up simply took
    longer), or a short one that ends where the teardown grace begins."""
    slack = cfg["window_s"] + cfg["stride_s"]
    for a in starts:
        if a <= s0 <= a + cfg["warmup_s"] + slack:
            return True
    for b in ends:
        if b - cfg["cooldown_s"] - slack <= s1 <= b and s1 - s0 <= 15.0:
            return True
    return False


def _steady_before(events: list[dict], s0: float, cfg: dict) -> bool:
    """Iteration markers show training already running steadily before ``s0``: then an event
    that begins near the start-up boundary and slows the iterations is not start-up."""
    its = [float(e["t"]) for e in events if e.get("event") == "iteration" and "t" in e]
    if len(its) < 5:
        return False
    first = min(its)
    return sum(1 for t in its if first < t < s0) >= 3 and first + cfg["window_s"] < s0


#: Memory "level" gauges that drift between runs with the page cache, not with the job.
_BASELINE_SKIP = ("memory.Cached", "memory.Buffers", "memory.MemFree", "memory.Inactive",
                  "memory.Active", "memory.Dirty", "memory.Writeback", "memory.Mapped",
                  "memory.Slab", "memory.SReclaimable", "memory.SUnreclaim", "memory.KReclaimable",
                  "memory.Shmem", "memory.PageTables", "memory.KernelStack", "memory.Unevictable",
                  "memory.Mlocked", "memory.Vmalloc", "memory.Percpu", "memory.MemTotal",
                  "memory.Hugepages", "memory.HugePages", "memory.DirectMap", "memory.CmaFree")


def baseline_columns(names: Sequence[str], baseline: dict) -> tuple[np.ndarray, np.ndarray,
                                                                     np.ndarray]:
    """Columns of ``names`` the baseline covers, with its centre and scale for each."""
    bch = {c["name"]: c for c in baseline.get("channels", [])}
    cols, cen, sca = [], [], []
    for i, n in enumerate(names):
        c = bch.get(n)
        if c is None or n.startswith(_BASELINE_SKIP):
            continue
        cols.append(i)
        cen.append(float(c["center"]))
        sca.append(float(c["scale"]))
    return np.array(cols, np.intp), np.array(cen), np.array(sca)


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
    out.analysis = {"window_s": cfg["window_s"], "stride_s": cfg["stride_s"],
                    "threshold": cfg["threshold"], "channels_in": len(metas)}
    if len(P.t) < 2:
        out.notes.append(f"only {len(P.t)} sample(s): nothing to analyse")
        return out
    keep, reasons = informative(P.X)
    out.analysis["channels_dropped"] = {k: int(v.sum()) for k, v in reasons.items()}
    per_core = np.array([bool(PER_CORE.match(n)) for n in P.names], bool)
    keep &= ~per_core      # modelled through cpu.cores.* aggregates (see prepare._derive)
    # Means of every channel (attribution, pruning); full statistics only for the modelled ones.
    win = sliding_windows(P.t, P.X, cfg["window_s"], cfg["stride_s"], P.interval_s,
                          stats=("mean",))
    m = len(win)
    out.analysis["windows"] = m
    if m < 2 * cfg["min_windows"] + 2:
        out.notes.append(f"run too short for {cfg['window_s']:g} s windows every "
                         f"{cfg['stride_s']:g} s ({P.t[-1] - P.t[0]:.1f} s of samples): "
                         "nothing to analyse")
        return out
    starts, ends = _boundaries(meta, events, out.t_first, out.t_last)
    supp = _suppressed(win.start, win.end, starts, ends, cfg["warmup_s"], cfg["cooldown_s"])
    valid = win.valid.copy()
    fitrows = valid & ~supp
    if fitrows.sum() < 10:
        fitrows = valid.copy()
    if fitrows.sum() < 4:
        out.notes.append("too few complete windows (gaps or missing samples): nothing to analyse")
        return out
    means = win.stats["mean"]
    floors = channel_floors(P.names, P.units)
    rels = rel_floors(P.units)
    det_cols = np.nonzero(keep)[0]
    base_cols = np.zeros(0, np.intp)
    if baseline is not None:
        base_cols, b_center, b_scale = baseline_columns(P.names, baseline)
        out.analysis["baseline"] = {"runs": len(baseline.get("runs", [])),
                                    "channels": int(len(base_cols))}
        if len(base_cols) == 0:
            out.notes.append("the baseline shares no channel with this run; ignored")
    fused = np.zeros(m)
    flag_self = np.zeros(m, bool)
    if len(det_cols) == 0:
        out.notes.append("every channel is constant, empty or all-zero: nothing varies, so "
                         "there is nothing to detect within the run")
    else:
        Md = means[fitrows][:, det_cols].astype(np.float64)
        c0, s0 = attr.reference(Md, np.ones(len(Md), bool), floors[det_cols], rels[det_cols])
        with np.errstate(invalid="ignore"):
            reach = np.nan_to_num(np.nanmax(np.abs((Md - c0) / s0), axis=0, initial=0.0))
        # representatives: symptom channels first, then the channel that moves most
        sym = attr.symptom_mask([P.names[i] for i in det_cols])[0]
        prio = np.log1p(np.minimum(reach, 1e6)) + 100.0 * sym
        kept, rep = prune(Md, [P.names[i] for i in det_cols], cfg["prune_threshold"], prio)
        mcols = det_cols[kept]
        wfull = sliding_windows(P.t, P.X[:, mcols], cfg["window_s"], cfg["stride_s"],
                                P.interval_s)
        F = feature_matrix(wfull)
        del wfull
        wide = np.array([s != "mean" for s in STATS] * len(mcols))
        ffl = feature_floors(floors[mcols], win.window_s)
        frel = np.repeat(rels[mcols], len(STATS))
        scaler = fit_scaler(F, ffl, fitrows, frel, wide)
        Z = scaler.transform(F)
        # Fit on the core of the run: the windows nearest the centre (by feature norm).  An
        # anomaly covering a good part of the run would otherwise be learnt as normal (a
        # principal component, a dense region for the forest).  The scaler is refitted on
        # the core too, so a long anomaly does not inflate the spreads it is measured in.
        core = fitrows
        for _ in range(2):
            norm = np.sqrt((Z.astype(np.float64) ** 2).sum(axis=1))
            core = fitrows & (norm <= np.quantile(norm[fitrows], cfg["core_quantile"]))
            if core.sum() < 10:
                core = fitrows
                break
            scaler = fit_scaler(F, ffl, core, frel, wide)
            Z = scaler.transform(F)
        del F
        normed, names = [], []
        for d in _detectors(cfg):
            try:
                d.fit(Z[core])
                s = np.asarray(d.score_samples(Z), dtype=np.float64)
                normed.append(normalize(s, s[core], float(getattr(d, "score_floor", 1e-6))))
                names.append(getattr(d, "name", type(d).__name__))
            except Exception as e:  # one broken detector must not cost the analysis
                out.notes.append(f"detector {getattr(d, 'name', d)!r} failed: "
                                 f"{type(e).__name__}: {e}")
        fused = fuse(normed) if normed else np.zeros(m)
        flag_self = hysteresis(fused, valid & ~supp, cfg["threshold"],
                               cfg["threshold"] * cfg["low_fraction"])
        out.analysis.update({"detectors": names, "channels_analysed": int(len(det_cols)),
                             "channels_modelled": int(len(mcols)), "pruned": len(rep)})
    bscore = np.zeros(m)
    flag_base = np.zeros(m, bool)
    if len(base_cols):
        Zb = np.abs((means[:, base_cols] - b_center) / b_scale)
        Zb = np.where(np.isfinite(Zb), Zb, 0.0)
        k = min(2, Zb.shape[1])
        bscore = np.partition(Zb, Zb.shape[1] - k, axis=1)[:, -k:].mean(axis=1)
        flag_base = valid & ~supp & (bscore >= cfg["baseline_threshold"])
    # Foreign load: bars from the run's own windows (first guess: the fit rows).
    fam = fl.family(means, P.names, fitrows, win.start, cfg["foreign_z"])
    flag_foreign = fam.flag & valid & ~supp
    flag = flag_self | flag_base | flag_foreign
    groups = group(flag, win.mid, win.stride_s, cfg["gap_s"], cfg["min_windows"])
    # Reference for attribution: valid windows away (one window length) from any flag.
    w = max(1, int(round(win.window_s / win.stride_s)))
    near = np.convolve(flag.astype(int), np.ones(2 * w + 1, int), mode="same") > 0
    normal = valid & ~near & ~supp
    if normal.sum() < 5:
        normal = valid & ~flag
    center, scale = attr.reference(means, normal, floors, rels)
    fam = fl.family(means, P.names, normal, win.start, cfg["foreign_z"])
    if len(fam.names):
        out.analysis["foreign"] = {n: {"normal": round(float(c), 4), "bar": round(float(b), 4)}
                                   for n, c, b in zip(fam.names, fam.center, fam.bar)}
    spans = [span(a, b, win.mid, win.stride_s) for a, b in groups]
    smask = attr.symptom_mask(P.names)
    anomalies: list[dict] = []
    observations: list[dict] = []
    weak = 0
    host = meta.get("host") or (meta.get("run") or {}).get("host")
    for (a, b), (s0, s1) in zip(groups, spans):
        rows = np.arange(a, b + 1)
        rows = rows[flag[rows]]
        with np.errstate(all="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                observed = np.nanmean(means[rows].astype(np.float64), axis=0)
        c_ref, s_ref = center.copy(), scale.copy()
        from_baseline = bool(flag_base[rows].sum() > flag_self[rows].sum())
        if from_baseline:
            c_ref[base_cols], s_ref[base_cols] = b_center, b_scale
        dev = attr.deviations(observed, c_ref, s_ref)
        dev[per_core] = 0.0   # per-core channels speak through their aggregates only
        if from_baseline:  # only what the baseline covers is evidence against it
            mask = np.zeros(len(dev), bool)
            mask[base_cols] = True
            dev = np.where(mask, dev, 0.0)
        fsup = fam.support(rows)
        if np.max(np.abs(dev)) < cfg["min_deviation"] and not fsup:
            weak += 1
            continue
        hits = attr.symptom_hits(dev, observed, c_ref, smask, cfg["min_deviation"])
        symp = [int(i) for i in np.nonzero(hits)[0][np.argsort(-np.abs(dev[hits]))]]
        impact = attr.iteration_impact(events, s0, s1, spans)
        bar = max(cfg["min_slowdown_pct"], 3.0 * impact.get("noise_pct", 0.0)) if impact else 0
        slowed = bool(impact and impact["iteration_time_pct"] >= bar
                      and impact.get("typical_step_pct", bar) >= bar)
        sub, sub_scores = attr.choose_subsystem(dev, P.names, hits)
        fsub = fl.subsystem(fsup)
        if fsub and not (sub in ("network", "gpu") and symp):
            sub = fsub      # the neighbour is the cause; what it did to the run follows
        ev = attr.evidence(dev, observed, c_ref, P.names, P.units, prefer=sub, hits=hits)
        if fsup:
            ev = _foreign_evidence(fsup, dev, P.names, P.units) + [
                e for e in ev if e["channel"] not in {f["channel"] for f in fsup}]
        families = [f for f, on in (("symptoms", bool(symp)), ("foreign", bool(fsup)),
                                    ("impact", slowed), ("baseline", from_baseline)) if on]
        why = None
        if cfg["require_symptom"] and not families:
            why = ("activity changed, but nothing outside the run's own behaviour explains it: "
                   "no pressure, stall, loss or throttling signal moved, no process outside the "
                   "run took CPU, memory or I/O, and the iterations did not slow down")
        elif not from_baseline and _edge(s0, s1, starts, ends, cfg) and not (
                slowed and _steady_before(events, s0, cfg)):
            why = ("contiguous with the start-up or teardown of the run/step (imports, data "
                   "loading, rendezvous, exit): not a steady-state anomaly")
        if why:
            observations.append({"start": s0, "end": s1, "subsystem": sub,
                                 "score": round(float(np.max(fused[rows])), 2),
                                 "evidence": ev[:5], "why_not_anomaly": why})
            continue
        score = float(np.max(bscore[rows] if from_baseline else fused[rows]))
        if fsup and not flag_self[rows].any():
            score = max(score, float(max(f["excess"] for f in fsup)) * cfg["threshold"])
        an = {"id": "", "start": s0, "end": s1, "node": host, "step_id": None,
              "subsystem": sub, "score": round(score, 2), "evidence": ev, "hints": [],
              "families": families,
              "subsystem_scores": {k: round(v, 3) for k, v in sorted(
                  sub_scores.items(), key=lambda kv: -kv[1])},
              "windows": int(len(rows))}
        if from_baseline:
            an["baseline"] = True
        if symp:
            an["symptoms"] = [P.names[i] for i in symp[:6]]
        if impact:
            an["impact"] = impact
        if fsup:
            an["foreign"] = _foreign_section(fsup, events, s0, s1, meta)
        an["step_id"] = _step_of(meta, events, s0)
        chans = {P.names[i]: {"baseline": attr._num(c_ref[i]), "observed": attr._num(observed[i]),
                              "deviation": round(float(dev[i]), 2), "unit": P.units[i]}
                 for i in range(len(P.names))}
        an["hints"] = hints_for(an, {"channels": chans, "meta": meta, "impact": impact,
                                     "facts": meta.get("facts") or {},
                                     "foreign": an.get("foreign")})
        anomalies.append(an)
    for inv in attr.invariant_findings(P.t, P.X, P.names, P.units, P.interval_s):
        obs_v = center.astype(np.float64).copy()
        c_ref = center.copy()
        for j, (base, val) in inv["channels"].items():
            c_ref[j], obs_v[j] = base, val
        sc = scale.copy()
        dev = np.zeros(len(P.names))
        for j, (base, val) in inv["channels"].items():
            dev[j] = (val - base) / max(float(floors[j]), 1e-9)
        ev = attr.evidence(dev, obs_v, c_ref, P.names, P.units, min_dev=0.0,
                           top=len(inv["channels"]))
        an = {"id": "", "start": inv["start"], "end": inv["end"], "node": host,
              "step_id": _step_of(meta, events, inv["start"]), "subsystem": "gpu",
              "score": round(float(inv["score"]), 2), "evidence": ev, "hints": [],
              "invariant": inv["why"]}
        chans = {P.names[j]: {"baseline": attr._num(c_ref[j]), "observed": attr._num(obs_v[j]),
                              "deviation": round(float(dev[j]), 2), "unit": P.units[j]}
                 for j in inv["channels"]}
        an["hints"] = hints_for(an, {"channels": chans, "meta": meta, "impact": None,
                                     "facts": meta.get("facts") or {}})
        anomalies.append(an)
    if weak:
        out.notes.append(f"{weak} candidate window group(s) dismissed: no channel moved by "
                         f"{cfg['min_deviation']:g} robust spreads (or its practical floor)")
    anomalies.sort(key=lambda x: x["start"])
    if len(anomalies) > cfg["max_anomalies"]:
        out.notes.append(f"{len(anomalies)} anomalies; kept the {cfg['max_anomalies']} "
                         "strongest")
        anomalies = sorted(anomalies, key=lambda x: -x["score"])[:cfg["max_anomalies"]]
        anomalies.sort(key=lambda x: x["start"])
    for i, an in enumerate(anomalies, 1):
        an["id"] = f"A{i}"
    out.anomalies = anomalies
    out.observations = observations
    out.analysis["flagged_windows"] = int(flag.sum())
    return out


def _foreign_evidence(fsup: list[dict], dev: np.ndarray, names: list[str], units: list[str]
                      ) -> list[dict]:
    idx = {n: i for i, n in enumerate(names)}
    out = []
    for f in fsup:
        i = idx[f["channel"]]
        out.append({"channel": f["channel"], "deviation": round(float(
            dev[i] if abs(dev[i]) > 0 else 4.0 * f["excess"]), 2),
            "baseline": attr._num(f["baseline"]), "observed": attr._num(f["observed"]),
            "unit": units[i], "family": "foreign", "bar": attr._num(f["bar"])})
    return out


def _foreign_section(fsup: list[dict], events: list[dict], s0: float, s1: float,
                     meta: dict) -> dict:
    """What the node did outside the run, and which other registered runs shared the node
    then (named by run/job id only: a user never sees another user's command line)."""
    others: dict[str, dict] = {}
    for e in events:
        if e.get("event") not in ("neighbour_start", "neighbour_end") or "t" not in e:
            continue
        key = str(e.get("run_id"))
        o = others.setdefault(key, {"run_id": key, "job_id": e.get("job_id"),
                                    "start": None, "end": None})
        o["start" if e["event"] == "neighbour_start" else "end"] = float(e["t"])
    overlap = [o for o in others.values()
               if (o["start"] is None or o["start"] <= s1) and (o["end"] is None or o["end"] >= s0)]
    return {"support": fsup, "other_runs": overlap,
            "source": "another registered run" if overlap else "processes in no registered run"}


def _step_of(meta: dict, events: list[dict], t0: float) -> str | None:
    steps = [s for s in (meta.get("steps") or []) if isinstance(s, dict)]
    for s in steps:
        a, b = s.get("start"), s.get("end")
        if isinstance(a, (int, float)) and a <= t0 and (b is None or t0 <= b):
            return str(s.get("step_id"))
    cur = None
    for e in sorted(events, key=lambda e: e.get("t", 0)):
        if e.get("t", 0) > t0:
            break
        if e.get("event") == "step_start":
            cur = str(e.get("step_id"))
        elif e.get("event") == "step_end" and str(e.get("step_id")) == cur:
            cur = None
    return cur or ((meta.get("run") or {}).get("step_id"))


_SEV = {"critical": 0, "warning": 1, "info": 2}


def hints_for(anomaly: dict, context: dict) -> list[dict]:
    """Ask every ``reveal_hints`` implementation; drop fallbacks when a specific rule fired."""
    try:
        from ..hooks.manager import call_safely

        res = call_safely("reveal_hints", anomaly=anomaly, context=context)
    except Exception as e:
        log.warning("hint plugins unavailable: %s", e)
        res = []
    hints, seen = [], set()
    for lst in res:
        for h in lst or []:
            if not isinstance(h, dict) or not {"title", "action", "severity"} <= set(h):
                continue
            if h["severity"] not in _SEV or h["title"] in seen:
                continue
            seen.add(h["title"])
            hints.append(h)
    specific = [h for h in hints if not h.get("fallback")]
    hints = specific or hints
    # the rule about the anomaly's own subsystem first, then by severity
    sub = anomaly.get("subsystem")
    hints.sort(key=lambda h: (h.get("subsystem", sub) != sub, _SEV[h["severity"]]))
    return hints


def load_baseline(baseline: Any) -> dict | None:
    if baseline is None or isinstance(baseline, dict):
        return baseline
    from .baseline import load

    return load(str(baseline))


def analyze(run_dir: str, config: dict | None = None, baseline: Any = None) -> dict:
    """Analyse a run directory and return a ``reveal.report/1`` dict (not written to disk)."""
    from ..telemetry import store

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
    notes += det.notes
    det.analysis["seconds"] = round(time.perf_counter() - t0, 3)
    if bl is not None:
        det.analysis.setdefault("baseline", {})["file"] = bl.get("_path")
    reason = partial_reason(notes)
    rep = {"schema": SCHEMA, "status": "partial" if reason else "ok", "status_reason": reason,
           "run": run_section(meta, det.t_first, det.t_last),
           "telemetry": telemetry_section(meta, samples, len(metas), nbytes, None),
           "anomalies": det.anomalies, "observations": det.observations, "notes": notes,
           "analysis": det.analysis}
    rep["summary"] = summary(rep)
    return rep
