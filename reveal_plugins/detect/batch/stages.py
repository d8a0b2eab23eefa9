"""The stages of the batch analysis, each a small unit with a typed result.

    prepared run ─▶ window_stage ─▶ model_stage ─┐
                          │      baseline_stage ─┼─▶ event_stage ─▶ judge (per event)
                          └────── foreign load ──┘                  evidence families,
                                                                     attribution, hints

:func:`reveal_plugins.detect.pipeline.detect` strings them together; every stage reads the
validated settings as they are (the typed :class:`~reveal_plugins.detect.config.DetectConfig`) and appends what a
reader of the report should know to ``notes``.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..evidence import attribution as attr
from ..evidence import foreign as fl
from .detection import Detection, set_anomalies
from .boundaries import at_edge, boundaries, steady_before, step_of, suppressed
from . import model
from .events import group, hysteresis, span
from .features import channel_floors, feature_matrix, rel_floors
from ..evidence.gpu import as_observation, findings as gpu_findings, \
    invariant_findings as gpu_invariants
from ..evidence.hinting import hints_for
from .prepare import PER_CORE, Prepared, informative
from .report import host_of
from .windows import windows_pieces as sliding_windows
from ..config import DetectConfig

log = logging.getLogger(__name__)


@dataclass
class WindowStage:
    """Window means of every channel and which windows may be flagged or fitted on."""

    win: object                  # windows.Windows (means only)
    means: np.ndarray            # (m, c)
    valid: np.ndarray            # complete windows
    supp: np.ndarray             # start-up / teardown grace
    fitrows: np.ndarray          # what the detectors may learn from
    starts: list[float]
    ends: list[float]
    floors: np.ndarray
    rels: np.ndarray
    modelled: np.ndarray         # channels worth modelling (per-core ones never)
    per_core: np.ndarray

    @property
    def flaggable(self) -> np.ndarray:
        return self.valid & ~self.supp


def window_stage(P: Prepared, cfg: DetectConfig, meta: dict, events: list[dict],
                 notes: list[str], analysis: dict) -> WindowStage | None:
    """3-s windows every 1 s; None (with a note) when the run is too short or too gappy."""
    keep, reasons = informative(P.X)
    analysis["channels_dropped"] = {k: int(v.sum()) for k, v in reasons.items()}
    win = sliding_windows(P.t, P.X, cfg.window_s, cfg.stride_s, P.interval_s,
                          stats=("mean",))
    analysis["windows"] = len(win)
    if too_short(len(win), float(P.t[0]), float(P.t[-1]), cfg, notes):
        return None
    return windows_judged(win, win.stats["mean"], P.names, P.units, keep, meta, events,
                          float(P.t[0]), float(P.t[-1]), cfg, notes)


def too_short(m: int, t0: float, t1: float, cfg: DetectConfig, notes: list[str]) -> bool:
    if m >= 2 * cfg.min_windows + 2:
        return False
    notes.append(f"run too short for {cfg.window_s:g} s windows every {cfg.stride_s:g} s "
                 f"({t1 - t0:.1f} s of samples): nothing to analyse")
    return True


def windows_judged(win, means, names: list[str], units: list[str], informative_: np.ndarray,
                   meta: dict, events: list[dict], t0: float, t1: float, cfg: DetectConfig,
                   notes: list[str]) -> WindowStage | None:
    """Which windows are start-up or teardown grace, which the detectors learn from, which
    channels are modelled (per-core ones never: they speak through their ``cpu.cores.*``
    aggregates); None (with a note) when too few windows are complete."""
    per_core = np.array([bool(PER_CORE.match(n)) for n in names], bool)
    starts, ends = boundaries(meta, events, t0, t1)
    supp = suppressed(win.start, win.end, starts, ends, cfg.warmup_s, cfg.cooldown_s)
    valid = win.valid.copy()
    fitrows = valid & ~supp
    if fitrows.sum() < 10:
        fitrows = valid.copy()
    if fitrows.sum() < 4:
        notes.append("too few complete windows (gaps or missing samples): nothing to analyse")
        return None
    return WindowStage(win, means, valid, supp, fitrows, starts, ends,
                       channel_floors(names, units), rel_floors(units),
                       informative_ & ~per_core, per_core)


@dataclass
class ModelStage:
    """The fused score of the unsupervised detectors and the windows it flags."""

    fused: np.ndarray
    flag: np.ndarray


def flag_model(fused: np.ndarray, flaggable: np.ndarray, cfg: DetectConfig) -> np.ndarray:
    """Windows the fused score flags: above ``threshold``, held down to ``low_fraction`` of it."""
    return hysteresis(fused, flaggable, cfg.threshold, cfg.threshold * cfg.low_fraction)


def model_stage(P: Prepared, W: WindowStage, cfg: DetectConfig, notes: list[str], analysis: dict
                ) -> ModelStage:
    """Features of the modelled channels (pruned, robust-scaled) -> detectors -> fused score
    (:mod:`~reveal_plugins.detect.batch.model`, shared with the long-run path)."""
    m = len(W.means)
    det_cols = np.nonzero(W.modelled)[0]
    if len(det_cols) == 0:
        notes.append(model.NOTHING_VARIES)
        return ModelStage(np.zeros(m), np.zeros(m, bool))
    Md = W.means[W.fitrows][:, det_cols].astype(np.float64)
    mcols, pruned = model.choose_modelled(Md, det_cols, P.names, W.floors, W.rels, cfg)
    del Md
    wfull = sliding_windows(P.t, P.X[:, mcols], cfg.window_s, cfg.stride_s, P.interval_s)
    F = feature_matrix(wfull)
    del wfull
    fitted = model.fit_model(F[W.fitrows], mcols, W.floors, W.rels, W.win.window_s, cfg, notes)
    fused = fitted.score(F) if fitted is not None else np.zeros(m)
    analysis.update({"detectors": fitted.names if fitted is not None else [],
                     "channels_analysed": int(len(det_cols)),
                     "channels_modelled": int(len(mcols)), "pruned": pruned})
    return ModelStage(fused, flag_model(fused, W.flaggable, cfg))


@dataclass
class BaselineStage:
    """Every window scored against a cross-run baseline (the baseline evidence family)."""

    cols: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))
    center: np.ndarray = field(default_factory=lambda: np.zeros(0))
    scale: np.ndarray = field(default_factory=lambda: np.zeros(0))
    score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    flag: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))


def baseline_stage(P: Prepared, W: WindowStage, baseline: dict | None, cfg: DetectConfig,
                   notes: list[str], analysis: dict) -> BaselineStage:
    B = baseline_columns(P.names, len(W.means), baseline, notes, analysis)
    if len(B.cols):
        B.score = baseline_score(W.means, B)
        B.flag = baseline_flag(B, W.flaggable, cfg)
    return B


def baseline_columns(names: list[str], m: int, baseline: dict | None, notes: list[str],
                     analysis: dict) -> BaselineStage:
    """The channels a cross-run baseline covers and their levels; scores still zero."""
    B = BaselineStage(score=np.zeros(m), flag=np.zeros(m, bool))
    if baseline is None:
        return B
    from .baseline import columns

    B.cols, B.center, B.scale = columns(names, baseline)
    analysis["baseline"] = {"runs": len(baseline.get("runs", [])), "channels": int(len(B.cols))}
    if len(B.cols) == 0:
        notes.append("the baseline shares no channel with this run; ignored")
    return B


def baseline_score(means: np.ndarray, B: BaselineStage) -> np.ndarray:
    """Each window's distance from the baseline: the mean of its two largest |z|."""
    Zb = np.abs((means[:, B.cols] - B.center) / B.scale)
    Zb = np.where(np.isfinite(Zb), Zb, 0.0)
    k = min(2, Zb.shape[1])
    return np.partition(Zb, Zb.shape[1] - k, axis=1)[:, -k:].mean(axis=1)


def baseline_flag(B: BaselineStage, flaggable: np.ndarray, cfg: DetectConfig) -> np.ndarray:
    return flaggable & (B.score >= cfg.baseline_threshold)


@dataclass
class EventStage:
    """Flagged windows grouped into events, and the run's normal reference for them."""

    flag: np.ndarray
    groups: list[tuple[int, int]]
    spans: list[tuple[float, float]]
    center: np.ndarray
    scale: np.ndarray
    foreign: fl.Foreign
    symptoms: tuple                 # attribution.symptom_mask of the channels, once per run


def event_stage(P: Prepared, W: WindowStage, M: ModelStage, B: BaselineStage, cfg: DetectConfig,
                analysis: dict, gathered: tuple[np.ndarray, list[str]] | None = None,
                sample: tuple[np.ndarray, np.ndarray] | None = None) -> EventStage:
    """Union of the detectors', the baseline's and the foreign-load flags -> events; the
    reference (level, spread, foreign bars) from the valid windows away from any flag.

    The long-run path keeps only a few columns of every window and a sample of all of them:
    ``gathered`` (window means, their names) is what the foreign-load family reads, and
    ``sample`` (window means, their rows) what the reference level and spread come from."""
    win = W.win
    fmeans, fnames = gathered if gathered is not None else (W.means, P.names)
    fam = fl.family(fmeans, fnames, W.fitrows, win.start, cfg.foreign_z)
    # Foreign load held well above its absolute level is flagged in the start-up grace too:
    # the job's own start-up runs inside the job, so such load there is a neighbour that was
    # on the node first, and its windows inside the grace are most of what shows it.
    flag = M.flag | B.flag | (fam.flag & W.flaggable) | (fam.held(fl.GRACE_FACTOR) & W.valid)
    groups = group(flag, win.mid, win.stride_s, cfg.gap_s, cfg.min_windows)
    w = max(1, int(round(win.window_s / win.stride_s)))
    near = np.convolve(flag.astype(int), np.ones(2 * w + 1, int), mode="same") > 0
    normal = W.valid & ~near & ~W.supp
    if normal.sum() < 5:
        normal = W.valid & ~flag
    smeans, srows = sample if sample is not None else (W.means, slice(None))
    center, scale = attr.reference(smeans, normal[srows], W.floors, W.rels)
    fam = fl.family(fmeans, fnames, normal, win.start, cfg.foreign_z)
    if gathered is not None:     # the family's columns, as columns of the whole run
        idx = {n: i for i, n in enumerate(P.names)}
        fam.cols = np.array([idx[n] for n in fam.names], np.intp)
    if len(fam.names):
        analysis["foreign"] = {n: {"normal": round(float(c), 4), "bar": round(float(b), 4)}
                               for n, c, b in zip(fam.names, fam.center, fam.bar)}
    analysis["flagged_windows"] = int(flag.sum())
    spans = [span(a, b, win.mid, win.stride_s) for a, b in groups]
    return EventStage(flag, groups, spans, center, scale, fam, attr.symptom_mask(P.names))


#: How an observation of the run's own I/O begins (:func:`attribution.own_io`).
OWN_IO = "the run's own I/O explains it"


@dataclass
class Judgement:
    """One event judged: an anomaly, an observation (activity without evidence), or weak."""

    kind: str                    # "anomaly" | "observation" | "weak"
    item: dict | None = None


def parts(E: EventStage, a: int, b: int, w: int) -> list[tuple[int, int]]:
    """Event ``(a, b)`` cut where its evidence changes: where a foreign channel rises above
    its bar (for ``w`` windows in a row, after ``w`` windows without it).  Start-up activity
    that runs straight into a neighbour arriving later is two things: the start-up part may be
    dismissed, the neighbour's part is judged by when *its* evidence began.  Every part keeps
    at least ``w`` flagged windows (trimmed to its first and last flagged one)."""
    ex = E.foreign.excess
    if not ex.shape[1] or b - a + 1 < 2 * w:
        return [(a, b)]
    on = ex[a:b + 1] >= 1.0
    cuts = [0]
    for k in range(w, len(on) - w + 1):
        joins = on[k:k + w].all(axis=0) & ~on[k - w:k].any(axis=0)
        if joins.any() and k - cuts[-1] >= w:
            cuts.append(k)
    if len(cuts) == 1:
        return [(a, b)]
    out: list[tuple[int, int]] = []
    for lo, hi in zip(cuts, cuts[1:] + [len(on)]):
        f = a + lo + np.nonzero(E.flag[a + lo:a + hi])[0]
        if len(f) >= w:
            out.append((int(f[0]), int(f[-1])))
        elif out and len(f):     # too little of its own: joins the part before
            out[-1] = (out[-1][0], int(f[-1]))
    return out or [(a, b)]


def conclude(P: Prepared, W: WindowStage, M: ModelStage, B: BaselineStage, E: EventStage,
             cfg: DetectConfig, meta: dict, events: list[dict], out: Detection) -> None:
    """Every event judged; anomalies (with the GPU invariants and GPU peer findings) and
    observations into ``out``.  The last stage of both the batch and the long-run path."""
    anomalies: list[dict] = []
    weak = 0
    for j in judge_all(P, W, M, B, E, cfg, meta, events):
        if j.kind == "anomaly":
            anomalies.append(j.item)
        elif j.kind == "observation":
            out.observations.append(j.item)
        else:
            weak += 1
    judged = {id(a) for a in anomalies}
    with warnings.catch_warnings():    # GPU invariants and each GPU against its siblings
        warnings.simplefilter("ignore", RuntimeWarning)
        anomalies = gpu_findings(P, W, E, cfg, meta, events, anomalies, out)
    kept, briefs = [], []
    for a in anomalies:     # the GPU invariants' own findings (an XID, ECC) are never brief
        o = brief(a, cfg) if id(a) in judged else None
        if o:
            briefs.append((a, o))
        else:
            kept.append(a)
    joined, let_go = recurring(briefs, cfg)
    kept += joined
    out.observations += let_go
    own = sum(1 for o in out.observations if o.get("reason") == "own_io")
    if own:
        out.notes.append(f"{own} event(s) were the run's own I/O (its checkpoints or data "
                         "loading, no process outside the run took part): observations in "
                         "report.json, not anomalies")
    set_anomalies(out, kept, weak, cfg)


def recurring(briefs: list[tuple[dict, dict]], cfg: DetectConfig
              ) -> tuple[list[dict], list[dict]]:
    """Brief anomalies (each with its observation) -> ``(anomalies, observations)``: bursts of
    one subsystem that keep coming back are one anomaly.  A neighbour that takes a core for
    6 s of every 20 s holds the job back for a third of the time, though no burst lasts
    ``min_anomaly_s``.  A chain of bursts, each starting within ``3 x min_anomaly_s`` of the
    last one's end, is joined when it has ``recurring_min_bursts`` bursts that last
    ``min_anomaly_s`` together and fill ``recurring_min_duty`` of its span (a cron job's
    few seconds a minute stay brief).  The joined anomaly keeps the strongest burst's
    evidence and hints and says how often the bursts came (``recurring``)."""
    max_gap = 3.0 * cfg.min_anomaly_s
    chains: list[list[tuple[dict, dict]]] = []
    for a, o in sorted(briefs, key=lambda p: (p[0]["subsystem"], p[0]["start"])):
        if chains and chains[-1][0][0]["subsystem"] == a["subsystem"] \
                and a["start"] - max(b["end"] for b, _ in chains[-1]) <= max_gap:
            chains[-1].append((a, o))
        else:
            chains.append([(a, o)])
    # a burst's windows overhang it by a window less a stride (a 4-s burst spans 6 s)
    smear = max(0.0, cfg.window_s - cfg.stride_s)
    joined, let_go = [], []
    for ch in chains:
        bursts = [a for a, _ in ch]
        s0, s1 = bursts[0]["start"], max(a["end"] for a in bursts)
        lengths = [max(cfg.stride_s, a["end"] - a["start"] - smear) for a in bursts]
        lasted = sum(lengths)
        span = max(s1 - s0 - smear, lasted)
        if (len(bursts) < cfg.recurring_min_bursts or lasted < cfg.min_anomaly_s
                or lasted < cfg.recurring_min_duty * span):
            let_go += [o for _, o in ch]
            continue
        top = max(bursts, key=lambda a: a["score"])
        every = float(np.median(np.diff([a["start"] for a in bursts])))
        each = float(np.median(lengths))
        an = dict(top, start=s0, end=s1, windows=sum(int(a.get("windows", 0)) for a in bursts),
                  families=list(dict.fromkeys(f for a in bursts for f in a.get("families", ()))))
        an["recurring"] = {"bursts": len(bursts), "burst_s": round(each, 1),
                           "every_s": round(every, 1),
                           "duty_pct": round(100.0 * lasted / span)}
        an["title"] = (f"recurring: {len(bursts)} bursts of ~{each:.0f} s, one every "
                       f"~{every:.0f} s ({an['recurring']['duty_pct']} % of this span); "
                       "each alone too brief to report")
        joined.append(an)
    return joined, let_go


def judge_all(P: Prepared, W: WindowStage, M: ModelStage, B: BaselineStage, E: EventStage,
              cfg: DetectConfig, meta: dict, events: list[dict]) -> list[Judgement]:
    """Every event judged, split where its evidence changes (:func:`parts`); consecutive parts
    that are all anomalies are one anomaly again (judged as a whole), so a split only changes
    the outcome where a part is start-up, teardown or weak."""
    out: list[Judgement] = []
    for i, g in enumerate(E.groups):
        ps = parts(E, *g, cfg.min_windows)
        if len(ps) == 1:
            out.append(judge(i, P, W, M, B, E, cfg, meta, events))
            continue
        js = [judge(i, P, W, M, B, E, cfg, meta, events, part=p) for p in ps]
        k = 0
        while k < len(ps):
            m = k
            while js[k].kind == "anomaly" and m + 1 < len(ps) and js[m + 1].kind == "anomaly":
                m += 1
            if m > k:
                u = judge(i, P, W, M, B, E, cfg, meta, events, part=(ps[k][0], ps[m][1]))
                out += [u] if u.kind == "anomaly" else js[k:m + 1]
            else:
                out.append(js[k])
            k = m + 1
    return out


def brief(a: dict, cfg: DetectConfig) -> dict | None:
    """The observation an anomaly of the detectors becomes when its evidence lasted under
    ``min_anomaly_s`` and the iterations did not slow (else None): a few seconds of a login,
    a cron job, a package update's burst or one retransmit storm are real, but not what
    holds a training job back.  Judged on the whole anomaly (after its parts are joined
    again, and after the GPUs had their say on it), never on one part of it."""
    if a["end"] - a["start"] >= cfg.min_anomaly_s or "impact" in a.get("families", ()):
        return None
    return as_observation(a, f"brief: {a['end'] - a['start']:.0f} s of evidence, under "
                             f"min_anomaly_s ({cfg.min_anomaly_s:g} s), and the iterations "
                             "did not slow down", "brief")


def judge(i: int, P: Prepared, W: WindowStage, M: ModelStage, B: BaselineStage,
          E: EventStage, cfg: DetectConfig, meta: dict, events: list[dict],
          part: tuple[int, int] | None = None) -> Judgement:
    """Evidence families -> attribution -> hints for event ``i`` of ``E`` (or ``part``, a
    range of its windows)."""
    (a, b), (s0, s1) = E.groups[i], E.spans[i]
    if part is not None:
        (a, b), (s0, s1) = part, span(*part, W.win.mid, W.win.stride_s)
    rows = np.arange(a, b + 1)
    rows = rows[E.flag[rows]]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        observed = np.nanmean(W.means[rows].astype(np.float64), axis=0)
    c_ref, s_ref = E.center.copy(), E.scale.copy()
    from_baseline = bool(B.flag[rows].sum() > M.flag[rows].sum())
    if from_baseline:
        c_ref[B.cols], s_ref[B.cols] = B.center, B.scale
    dev = attr.deviations(observed, c_ref, s_ref)
    dev[W.per_core] = 0.0   # per-core channels speak through their aggregates only
    if from_baseline:  # only what the baseline covers is evidence against it
        mask = np.zeros(len(dev), bool)
        mask[B.cols] = True
        dev = np.where(mask, dev, 0.0)
    fsup = E.foreign.support(rows)
    for f in fsup:
        if _since_start(E, W, rows, f["channel"]):
            f["since_start"] = True
    if np.max(np.abs(dev)) < cfg.min_deviation and not fsup:
        return Judgement("weak")
    hits = attr.symptom_hits(dev, observed, c_ref, E.symptoms, cfg.min_deviation)
    symp = [int(j) for j in np.nonzero(hits)[0][np.argsort(-np.abs(dev[hits]))]]
    impact = attr.iteration_impact(events, s0, s1, E.spans)
    slowed = attr.slowed(impact, cfg.min_slowdown_pct)
    sub, sub_scores = attr.choose_subsystem(dev, P.names, hits)
    fsub = fl.subsystem(fsup, E.foreign.share(rows), [P.names[j] for j in symp])
    if fsub:
        sub = fsub      # the neighbour is the cause; what it did to the run (a slower
        #                 all-reduce, CPU pressure) follows from it
    ev = attr.evidence(dev, observed, c_ref, P.names, P.units, prefer=sub, hits=hits)
    if fsup:
        ev = foreign_evidence(fsup, dev, P.names, P.units) + [
            e for e in ev if e["channel"] not in {f["channel"] for f in fsup}]
    families = [f for f, on in (("symptoms", bool(symp)), ("foreign", bool(fsup)),
                                ("impact", slowed), ("baseline", from_baseline)) if on]
    why = reason = None     # reason: a short code for what explains an observation
    own = None if fsup or from_baseline else attr.own_io(dev, observed, c_ref, P.names, hits,
                                                          cfg.min_deviation)
    if cfg.require_symptom and not families:
        reason = "own_activity"
        why = ("activity changed, but nothing outside the run's own behaviour explains it: "
               "no pressure, stall, loss or throttling signal moved, no process outside the "
               "run took CPU, memory or I/O, and the iterations did not slow down")
    elif own:
        reason = "own_io"
        why = (f"{OWN_IO}: {own}, and nothing outside the run took part; what it held back "
               "is the job's own I/O phase (a checkpoint, data loading), not the machine"
               + (f"; its iterations took {impact['iteration_time_pct']:+.0f} % meanwhile"
                  if slowed else ""))
    elif not from_baseline and at_edge(_foreign_onset(E, W, rows, s0), s1, W.starts, W.ends,
                                       cfg) and not (slowed and steady_before(events, s0, cfg)) \
            and not any(f.get("sustained") for f in fsup):
        # (foreign load held at an absolute level is no start-up: the job's own start-up runs
        # in the job, and a neighbour that was there first is the finding)
        reason = "edge"
        why = ("contiguous with the start-up or teardown of the run/step (imports, data "
               "loading, rendezvous, exit): not a steady-state anomaly")
    if why:
        return Judgement("observation", {
            "start": s0, "end": s1, "subsystem": sub,
            "score": round(float(np.max(M.fused[rows])), 2), "evidence": ev[:5],
            "why_not_anomaly": why, "reason": reason})
    # The reported span: the windows where the evidence itself is out of bounds, not the
    # detectors' flags (a window that only overlaps the onset flags on its spread).
    # What bounds it: the foreign load when a neighbour is the finding, else the symptoms
    # that fired, else the strongest evidence (activity channels such as allocation counts
    # drift back slowly and would stretch the span).
    fcols = [E.foreign.names.index(f["channel"]) for f in fsup]
    bcols = [] if fcols else (symp[:3] or [P.names.index(e["channel"]) for e in ev[:3]])
    ta, tb = _evidence_bounds(W, E, a, b, bcols, fcols, c_ref, s_ref, dev,
                              cfg.min_deviation / 2)
    if (ta, tb) != (a, b):
        s0, s1 = span(ta, tb, W.win.mid, W.win.stride_s)
    score = float(np.max(B.score[rows] if from_baseline else M.fused[rows]))
    if fsup and not M.flag[rows].any():
        score = max(score, float(max(f["excess"] for f in fsup)) * cfg.threshold)
    an = {"id": "", "start": s0, "end": s1, "node": host_of(meta), "step_id": None,
          "subsystem": sub, "score": round(score, 2), "evidence": ev, "hints": [],
          "families": families,
          "subsystem_scores": {k: round(v, 3) for k, v in sorted(
              sub_scores.items(), key=lambda kv: -kv[1])},
          "windows": int(len(rows))}
    if from_baseline:
        an["baseline"] = True
    if symp:
        an["symptoms"] = [P.names[j] for j in symp[:6]]
    if impact:
        an["impact"] = impact
    if fsup:
        an["foreign"] = foreign_section(fsup, events, s0, s1)
    an["step_id"] = step_of(meta, events, s0)
    chans = {P.names[j]: {"baseline": attr.num(c_ref[j]), "observed": attr.num(observed[j]),
                          "deviation": round(float(dev[j]), 2), "unit": P.units[j]}
             for j in range(len(P.names))}
    an["hints"] = hints_for(an, {"channels": chans, "meta": meta, "impact": impact,
                                 "facts": meta.get("facts") or {},
                                 "foreign": an.get("foreign")})
    return Judgement("anomaly", an)


def _evidence_bounds(W: WindowStage, E: EventStage, a: int, b: int, cols: list[int],
                     fcols: list[int], c_ref: np.ndarray, s_ref: np.ndarray, dev: np.ndarray,
                     min_dev: float) -> tuple[int, int]:
    """First and last window of ``a..b`` where an evidence channel (``cols``) is at least
    ``min_dev`` spreads out in the direction it moved over the event, or a foreign channel
    (``fcols``) is above its bar; ``(a, b)`` when none is (the span only ever shrinks)."""
    rr = np.arange(a, b + 1)
    on = np.zeros(len(rr), bool)
    if cols:
        c = np.array(cols)
        with np.errstate(all="ignore"):
            z = (W.means[rr][:, c].astype(np.float64) - c_ref[c]) / s_ref[c] * np.sign(dev[c])
        on |= (np.nan_to_num(z) >= min_dev).any(axis=1)
    if fcols and E.foreign.excess.shape[1]:
        on |= (E.foreign.excess[rr][:, fcols] >= 1.0).any(axis=1)
    idx = np.nonzero(on & W.valid[rr])[0]
    if not len(idx):
        return a, b
    return a + int(idx[0]), a + int(idx[-1])


def _since_start(E: EventStage, W: WindowStage, rows: np.ndarray, channel: str) -> bool:
    """The foreign channel was above its bar in (nearly) every complete window from the start
    of the run up to ``rows``: a neighbour that was there before the job."""
    j = E.foreign.names.index(channel)
    before = np.nonzero(W.valid[:rows[0]])[0]
    return not len(before) or float((E.foreign.excess[before, j] >= 1.0).mean()) >= 0.8


def _foreign_onset(E: EventStage, W: WindowStage, rows: np.ndarray, s0: float) -> float:
    """When foreign load began within the event (its first window above a bar), else ``s0``:
    an event that merged the run's start-up with a neighbour arriving later is not start-up."""
    ex = E.foreign.excess
    if not ex.shape[1]:
        return s0
    hot = rows[(ex[rows] >= 1.0).any(axis=1)]
    return max(s0, float(W.win.mid[hot[0]])) if len(hot) else s0


def invariant_anomalies(P: Prepared, W: WindowStage, E: EventStage, meta: dict,
                        events: list[dict]) -> list[dict]:
    """Conditions wrong however long they last (GPU PCIe link below max, persistent
    throttling, XID/ECC): anomalies whatever the run's own normal looks like."""
    out = []
    for inv in gpu_invariants(P.t, P.X, P.names, P.units, P.interval_s):
        obs_v = E.center.astype(np.float64).copy()
        c_ref = E.center.copy()
        dev = np.zeros(len(P.names))
        for j, (base, val) in inv["channels"].items():
            c_ref[j], obs_v[j] = base, val
            dev[j] = (val - base) / max(float(W.floors[j]), 1e-9)
        ev = attr.evidence(dev, obs_v, c_ref, P.names, P.units, min_dev=0.0,
                           top=len(inv["channels"]))
        an = {"id": "", "start": inv["start"], "end": inv["end"], "node": host_of(meta),
              "step_id": step_of(meta, events, inv["start"]), "subsystem": "gpu",
              "score": round(float(inv["score"]), 2), "evidence": ev, "hints": [],
              "families": ["symptoms"], "invariant": inv["why"]}
        chans = {P.names[j]: {"baseline": attr.num(c_ref[j]), "observed": attr.num(obs_v[j]),
                              "deviation": round(float(dev[j]), 2), "unit": P.units[j]}
                 for j in inv["channels"]}
        an["hints"] = hints_for(an, {"channels": chans, "meta": meta, "impact": None,
                                     "facts": meta.get("facts") or {}})
        out.append(an)
    return out


def foreign_evidence(fsup: list[dict], dev: np.ndarray, names: list[str], units: list[str]
                     ) -> list[dict]:
    """Evidence entries of the foreign channels above their bar (first in the list)."""
    idx = {n: i for i, n in enumerate(names)}
    out = []
    for f in fsup:
        i = idx[f["channel"]]
        out.append({"channel": f["channel"], "deviation": round(float(
            dev[i] if abs(dev[i]) > 0 else 4.0 * f["excess"]), 2),
            "baseline": attr.num(f["baseline"]), "observed": attr.num(f["observed"]),
            "unit": units[i], "family": "foreign", "bar": attr.num(f["bar"])})
    return out


def foreign_section(fsup: list[dict], events: list[dict], s0: float, s1: float) -> dict:
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
    out = {"support": fsup, "other_runs": overlap,
           "source": "another registered run" if overlap else "processes in no registered run"}
    if any(f.get("since_start") for f in fsup):
        out["since_start"] = True   # present from the start of the run
    return out
