"""Analysis of a long run in bounded memory, from its feature store (:mod:`.featstore`).

Used by :func:`.pipeline.analyze` when a run is longer than ``stream_after_s`` (or with
``full``: ``reveal analyze --full``).  The stages are those of :mod:`.stages`, on the stored
window statistics instead of a sample matrix:

1. bring the feature store up to date (the raw tail; with ``full`` every segment again);
2. pass 1 over the feature files: window times and validity, per-channel sums (channel
   filtering), the few columns every window needs (foreign load, GPU invariants) and a
   systematic sample of at most ``fit_windows`` windows (every k-th);
3. reference levels, pruning, the robust scaler, the core and the detectors are fitted on
   that sample, exactly as :func:`.stages.model_stage` fits on all windows;
4. pass 2: every window is scored chunk by chunk (fused score, baseline score);
5. events, evidence families, attribution and hints as in :func:`.pipeline.detect`; an
   event's window means are read back from the files that hold them.

Memory: the sample (``fit_windows`` x channels x 5), one feature file (<= one hour) and a few
numbers per window (~60 B x 600 000 windows for a week).  A run shorter than ``fit_windows``
windows is fitted on all its windows, so the only differences from the in-memory path are
the run-wide window grid, per-segment derived metrics and float32 rounding of the stored
statistics.
"""
from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import attribution as attr
from . import foreign as fl
from . import gpu, stages
from .boundaries import boundaries, suppressed
from .detectors import fuse
from .events import group, hysteresis, span
from .featstore import FeatureFileError, FeatureStore, segment_seq, read
from .featurize import Chunk, full_columns, informative_from, prepared_names
from .features import channel_floors, feature_floors, feature_matrix, fit_scaler, rel_floors
from .detection import Detection, set_anomalies
from .prepare import PER_CORE
from .prune import prune
from .windows import STATS, Windows

log = logging.getLogger(__name__)

#: Columns every window keeps in memory (foreign-load family and its corrections).
_FOREIGN_COLS = tuple(fl.MINIMUM) + ("storage.all.write_bytes", "storage.run.write_bytes",
                                     "memory.MemAvailable") + tuple(
    f"cpu.all.{k}" for k in fl._BUSY + ("idle", "iowait", "steal"))   # fl.node_cores

#: GPU channels the GPU invariants and the GPU peer comparison read (kept for every window).
_GPU_INVARIANT = gpu.GATHER


@dataclass
class _Names:
    """What the stages read of a prepared run besides its matrix."""

    names: list[str]
    units: list[str]
    t: np.ndarray
    X: object
    interval_s: float


class _Cols:
    """``X[rows, j]`` over a few gathered columns (GPU invariants on window means)."""

    def __init__(self, cols: dict[int, np.ndarray], n: int):
        self.cols, self.n = cols, n

    def __getitem__(self, key):
        rows, j = key
        return self.cols[j][rows]


class _LazyMeans:
    """``means[rows]`` for the judge: reads the window means of an event from its files."""

    def __init__(self, files: list[tuple[int, int, str]], offsets: np.ndarray,
                 tail: Chunk | None, c: int):
        self.files, self.offsets, self.tail, self.c = files, offsets, tail, c
        self._cache: tuple[int, np.ndarray] | None = None
        self.shape = (int(offsets[-1]), c)

    def _file(self, i: int) -> np.ndarray:
        if self._cache is not None and self._cache[0] == i:
            return self._cache[1]
        if i == len(self.files):
            m = self.tail.stats["mean"]
        else:
            m = read(self.files[i][2], ("mean",)).stats["mean"]
        self._cache = (i, m)
        return m

    def __getitem__(self, rows):
        rows = np.asarray(rows)
        out = np.empty((len(rows), self.c), np.float32)
        fi = np.searchsorted(self.offsets, rows, side="right") - 1
        for i in np.unique(fi):
            sel = fi == i
            out[sel] = self._file(int(i))[rows[sel] - self.offsets[i]]
        return out


def analyze_long(run_dir: str, meta: dict, metas: Sequence, cfg: dict, baseline: dict | None,
                 events: list[dict], full: bool, notes: list[str]):
    """The streaming analysis; returns ``(Detection, segments, bytes, samples)``."""
    out = Detection()
    iv = meta.get("interval_s")
    iv = float(iv) if isinstance(iv, (int, float)) and iv > 0 else None
    names, units = prepared_names(metas)
    try:
        return _analyze_store(run_dir, meta, metas, cfg, baseline, events, full, notes, out,
                              iv, names, units)
    except FeatureFileError as e:   # a damaged feature file: the segments are the truth
        if full:
            raise
        notes.append(f"{e}; features recomputed from the segments")
        return analyze_long(run_dir, meta, metas, cfg, baseline, events, True, notes)


def _analyze_store(run_dir, meta, metas, cfg, baseline, events, full, notes, out, iv, names,
                   units):
    fs = _store(run_dir, names, cfg, full, notes)
    try:
        tail, nseg, nbytes = fs.update(run_dir, metas, iv, cfg["window_s"], cfg["stride_s"],
                                       final=True, warnings=notes)
        paths = _segments(run_dir)
        seqs = [segment_seq(p) for p in paths]
        files = fs.cover(seqs)
        nbytes = sum(_size(p) for p in paths)     # what the run stores, read now or not
        return _analyze(files, tail, names, units, meta, events, cfg, baseline, out, iv,
                        full, notes) + (nseg, nbytes)
    finally:
        fs.cleanup()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _segments(run_dir: str) -> list[str]:
    from ..store import store
    return store.segment_paths(run_dir)


def _store(run_dir: str, names: list[str], cfg: dict, full: bool, notes: list[str]
           ) -> FeatureStore:
    """The run's feature store when its features fit this analysis (same windows, same
    channels) and we may write there; a private temporary one otherwise."""
    try:
        # --full rewrites every file: no fsync (a file lost to a crash is recomputed anyway)
        fs = FeatureStore.for_run(run_dir, create=True, sync=not full)
    except OSError as e:
        notes.append(f"features computed in a temporary directory ({e})")
        return FeatureStore.temporary()
    files = fs.files()
    if full:
        try:
            fs.clear()
        except OSError as e:
            notes.append(f"features computed in a temporary directory ({e})")
            return FeatureStore.temporary()
        return fs
    if files:
        from .featstore import read_info, read_names
        try:
            st = read_info(files[0][2])["state"]
            same = (abs(st["window_s"] - cfg["window_s"]) < 1e-9 and abs(
                st["stride_s"] - cfg["stride_s"]) < 1e-9 and read_names(files[0][2]) == names)
        except Exception as e:
            notes.append(f"{files[0][2]}: unreadable feature file ({type(e).__name__}); "
                         "features recomputed from the segments")
            same = False
        if not same:
            return FeatureStore.temporary()
    return fs


def _analyze(files, tail, names, units, meta, events, cfg, baseline, out, iv, full, notes):
    c = len(names)
    fcols = full_columns(names)
    pos_full = -np.ones(c, np.intp)
    pos_full[fcols] = np.arange(len(fcols))
    idx = {n: i for i, n in enumerate(names)}
    keepcols = sorted({idx[n] for n in _FOREIGN_COLS if n in idx} |
                      {i for i, n in enumerate(names) if _GPU_INVARIANT.match(n)})
    # -- pass 1: sizes, times, sums, gathered columns, the fit sample ---------------------
    import pyarrow.parquet as pq
    sizes = [pq.ParquetFile(p).metadata.num_rows for _, _, p in files]
    sizes.append(len(tail) if tail is not None else 0)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    m = int(offsets[-1])
    out.analysis = {"window_s": cfg["window_s"], "stride_s": cfg["stride_s"],
                    "threshold": cfg["threshold"], "channels_in": len(meta.get("channels", [])),
                    "streamed": True, "full": bool(full), "feature_files": len(files)}
    step = max(1, int(np.ceil(m / cfg["fit_windows"])))
    start = np.empty(m)
    valid = np.zeros(m, bool)
    gathered = np.empty((m, len(keepcols)), np.float32)
    acc = np.zeros((4, c))
    acc[3] = 0
    samples, t_min, t_max, gaps, resets, dropped = 0, np.inf, -np.inf, [], 0, 0
    sample_rows = np.arange(0, m, step)
    S = {s: np.empty((len(sample_rows), c if s == "mean" else len(fcols)), np.float32)
         for s in STATS}
    k = 0
    for i, ch in enumerate(_iter(files, tail)):
        a, b = offsets[i], offsets[i + 1]
        start[a:b], valid[a:b] = ch.start, ch.valid
        gathered[a:b] = ch.stats["mean"][:, keepcols]
        acc[:3] += ch.colstats[:3]
        np.maximum(acc[3], ch.colstats[3], out=acc[3])
        samples += ch.samples
        t_min, t_max = min(t_min, ch.t_min), max(t_max, ch.t_max)
        gaps += ch.gaps
        resets += ch.resets
        dropped += ch.dropped_t
        rows = sample_rows[(sample_rows >= a) & (sample_rows < b)] - a
        for s in STATS:
            S[s][k:k + len(rows)] = ch.stats[s][rows]
        k += len(rows)
    _input_notes(notes, gaps, resets, dropped)
    out.samples = samples
    if samples:
        out.t_first, out.t_last = float(t_min), float(t_max)
    if samples < 2:
        notes.append(f"only {samples} sample(s): nothing to analyse")
        return out, samples
    ws = cfg["window_s"]
    out.analysis["windows"] = m
    out.analysis["fit_windows"] = len(sample_rows)
    if m < 2 * cfg["min_windows"] + 2:
        notes.append(f"run too short for {ws:g} s windows every {cfg['stride_s']:g} s "
                     f"({t_max - t_min:.1f} s of samples): nothing to analyse")
        return out, samples
    keep, reasons = informative_from(acc)
    out.analysis["channels_dropped"] = {r: int(v.sum()) for r, v in reasons.items()}
    per_core = np.array([bool(PER_CORE.match(n)) for n in names], bool)
    keep &= ~per_core
    end = start + ws
    starts, ends = boundaries(meta, events, float(t_min), float(t_max))
    supp = suppressed(start, end, starts, ends, cfg["warmup_s"], cfg["cooldown_s"])
    fitrows = valid & ~supp
    if fitrows.sum() < 10:
        fitrows = valid.copy()
    if fitrows.sum() < 4:
        notes.append("too few complete windows (gaps or missing samples): nothing to analyse")
        return out, samples
    floors, rels = channel_floors(names, units), rel_floors(units)
    fit_s = fitrows[sample_rows]
    if fit_s.sum() < 4:
        fit_s = valid[sample_rows]
    # -- fit on the sample (stages.model_stage's steps) -----------------------------------
    det_cols = np.nonzero(keep)[0]
    model = _fit(S, fit_s, det_cols, pos_full, names, floors, rels, ws, cfg, notes, out)
    # -- pass 2: score every window --------------------------------------------------------
    fused = np.zeros(m)
    from .stages import BaselineStage
    B = BaselineStage(score=np.zeros(m), flag=np.zeros(m, bool))
    if baseline is not None:
        from .baseline import columns
        B.cols, B.center, B.scale = columns(names, baseline)
        out.analysis["baseline"] = {"runs": len(baseline.get("runs", [])),
                                    "channels": int(len(B.cols))}
        if len(B.cols) == 0:
            notes.append("the baseline shares no channel with this run; ignored")
    if model is not None or len(B.cols):
        for i, ch in enumerate(_iter(files, tail)):
            a, b = offsets[i], offsets[i + 1]
            if model is not None:
                fused[a:b] = model.score(ch)
            if len(B.cols):
                Zb = np.abs((ch.stats["mean"][:, B.cols] - B.center) / B.scale)
                Zb = np.where(np.isfinite(Zb), Zb, 0.0)
                kk = min(2, Zb.shape[1])
                B.score[a:b] = np.partition(Zb, Zb.shape[1] - kk, axis=1)[:, -kk:].mean(axis=1)
    flaggable = valid & ~supp
    if len(B.cols):
        B.flag = flaggable & (B.score >= cfg["baseline_threshold"])
    flag_m = hysteresis(fused, flaggable, cfg["threshold"],
                        cfg["threshold"] * cfg["low_fraction"]) if model is not None \
        else np.zeros(m, bool)
    M = stages.ModelStage(fused, flag_m)
    # -- events (stages.event_stage, the reference from the sample) -----------------------
    gnames = [names[j] for j in keepcols]
    win = Windows(start, end, np.zeros(m, int), valid, {}, ws, cfg["stride_s"])
    fam = fl.family(gathered, gnames, fitrows, start, cfg["foreign_z"])
    flag = M.flag | B.flag | (fam.flag & flaggable)
    groups = group(flag, win.mid, win.stride_s, cfg["gap_s"], cfg["min_windows"])
    w = max(1, int(round(ws / cfg["stride_s"])))
    near = np.convolve(flag.astype(int), np.ones(2 * w + 1, int), mode="same") > 0
    normal = valid & ~near & ~supp
    if normal.sum() < 5:
        normal = valid & ~flag
    center, scale = attr.reference(S["mean"], normal[sample_rows], floors, rels)
    fam = fl.family(gathered, gnames, normal, start, cfg["foreign_z"])
    fam.cols = np.array([idx[n] for n in fam.names], np.intp)
    if len(fam.names):
        out.analysis["foreign"] = {n: {"normal": round(float(c_), 4), "bar": round(float(b_), 4)}
                                   for n, c_, b_ in zip(fam.names, fam.center, fam.bar)}
    out.analysis["flagged_windows"] = int(flag.sum())
    spans = [span(a, b, win.mid, win.stride_s) for a, b in groups]
    E = stages.EventStage(flag, groups, spans, center, scale, fam, attr.symptom_mask(names))
    W = stages.WindowStage(win, _LazyMeans(files, offsets, tail, c), valid, supp, fitrows,
                           starts, ends, floors, rels, keep, per_core)
    P = _Names(names, units, win.mid, _Cols({j: gathered[:, q] for q, j in enumerate(keepcols)},
                                            m), cfg["stride_s"])
    _judge_all(out, P, W, M, B, E, cfg, meta, events)
    return out, samples


def _iter(files, tail):
    for _, _, p in files:
        yield read(p)
    if tail is not None:
        yield tail


def _input_notes(notes, gaps, resets, dropped):
    if gaps:
        big = max(gaps, key=lambda g: g[1] - g[0])
        notes.append(f"{len(gaps)} gap(s) in the samples (largest {big[1] - big[0]:.1f} s at "
                     f"t={big[0]:.1f}): lost segment, agent pause or clock jump; rates across a "
                     "gap are left out")
    if resets:
        notes.append(f"{resets} counter channel(s) went backwards (reset or wrap); those "
                     "samples are left out")
    if dropped:
        notes.append(f"{dropped} sample(s) with a missing, repeated or backward timestamp "
                     "left out")


class _Model:
    """The fitted detectors and how to score a chunk of windows with them."""

    def __init__(self, mcols, mpos):
        self.mcols, self.mpos = mcols, mpos    # modelled channels, their full-stat columns
        self.scaler, self.dets, self.norms = None, [], []

    def features(self, stats: dict[str, np.ndarray], rows=None) -> np.ndarray:
        st = {s: (v if rows is None else v[rows]) for s, v in stats.items()}
        n = len(st["mean"])
        win = Windows(np.zeros(n), np.zeros(n), np.zeros(n, int), np.ones(n, bool),
                      {s: st[s][:, self.mpos] if s != "mean" else st[s][:, self.mcols]
                       for s in STATS}, 0, 0)
        return feature_matrix(win)

    def score(self, ch: Chunk) -> np.ndarray:
        if len(ch) == 0:
            return np.zeros(0)
        Z = self.scaler.transform(self.features(ch.stats))
        # detectors.normalize, with the centre and spread of the fit sample's core scores
        normed = [(d.score_samples(Z) - med) / sc for d, (med, sc) in zip(self.dets,
                                                                            self.norms)]
        return fuse([np.asarray(x, np.float64) for x in normed])


def _fit(S, fit_s, det_cols, pos_full, names, floors, rels, ws, cfg, notes, out):
    if len(det_cols) == 0:
        notes.append("every channel is constant, empty or all-zero: nothing varies, so "
                     "there is nothing to detect within the run")
        return None
    Md = S["mean"][fit_s][:, det_cols].astype(np.float64)
    c0, s0 = attr.reference(Md, np.ones(len(Md), bool), floors[det_cols], rels[det_cols])
    with np.errstate(invalid="ignore"):
        reach = np.nan_to_num(np.nanmax(np.abs((Md - c0) / s0), axis=0, initial=0.0))
    sym = attr.symptom_mask([names[i] for i in det_cols])[0]
    prio = np.log1p(np.minimum(reach, 1e6)) + 100.0 * sym
    kept, rep = prune(Md, [names[i] for i in det_cols], cfg["prune_threshold"], prio)
    del Md
    mcols = det_cols[kept]
    model = _Model(mcols, pos_full[mcols])
    F = model.features(S, np.nonzero(fit_s)[0])
    wide = np.array([s != "mean" for s in STATS] * len(mcols))
    ffl = feature_floors(floors[mcols], ws)
    frel = np.repeat(rels[mcols], len(STATS))
    allrows = np.ones(len(F), bool)
    scaler = fit_scaler(F, ffl, allrows, frel, wide)
    Z = scaler.transform(F)
    core = allrows
    for _ in range(2):
        norm = np.sqrt((Z.astype(np.float64) ** 2).sum(axis=1))
        core = norm <= np.quantile(norm, cfg["core_quantile"])
        if core.sum() < 10:
            core = allrows
            break
        scaler = fit_scaler(F, ffl, core, frel, wide)
        Z = scaler.transform(F)
    del F
    dets, norms, dnames = [], [], []
    for d in stages._detectors(cfg):
        try:
            d.fit(Z[core])
            s = np.asarray(d.score_samples(Z[core]), dtype=np.float64)
            fs = s[np.isfinite(s)]
            med = float(np.median(fs)) if len(fs) else 0.0
            mad = 1.4826 * float(np.median(np.abs(fs - med))) if len(fs) else 0.0
            dets.append(d)
            norms.append((med, max(mad, float(getattr(d, "score_floor", 1e-6)))))
            dnames.append(getattr(d, "name", type(d).__name__))
        except Exception as e:
            notes.append(f"detector {getattr(d, 'name', d)!r} failed: {type(e).__name__}: {e}")
    if not dets:
        notes.append(stages.NO_DETECTOR)
    model.scaler, model.dets, model.norms = scaler, dets, norms
    out.analysis.update({"detectors": dnames, "channels_analysed": int(len(det_cols)),
                         "channels_modelled": int(len(mcols)), "pruned": len(rep)})
    return model if dets else None


def _judge_all(out, P, W, M, B, E, cfg, meta, events):
    anomalies: list[dict] = []
    weak = 0
    for j in stages.judge_all(P, W, M, B, E, cfg, meta, events):
        if j.kind == "anomaly":
            anomalies.append(j.item)
        elif j.kind == "observation":
            out.observations.append(j.item)
        else:
            weak += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        anomalies = gpu.findings(P, W, E, cfg, meta, events, anomalies, out)
    set_anomalies(out, anomalies, weak, cfg)
