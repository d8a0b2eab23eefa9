"""Analysis of a long run in bounded memory, from its feature store (:mod:`~reveal_plugins.detect.longrun.featstore`).

Used by :func:`~reveal_plugins.detect.pipeline.analyze` when a run is longer than ``stream_after_s`` (or with
``full``: ``reveal analyze --full``).  The stages are those of :mod:`~reveal_plugins.detect.batch.stages`, on the stored
window statistics instead of a sample matrix:

1. bring the feature store up to date (the raw tail; with ``full`` every segment again);
2. pass 1 over the feature files: window times and validity, per-channel sums (channel
   filtering), the few columns every window needs (foreign load, GPU invariants) and a
   systematic sample of at most ``fit_windows`` windows (every k-th);
3. the model (:mod:`~reveal_plugins.detect.batch.model`: channel choice, pruning, robust scaler, the core and the
   detectors) is fitted on that sample, exactly as :func:`~reveal_plugins.detect.batch.stages.model_stage` fits on all
   windows;
4. pass 2: every window is scored chunk by chunk (fused score, baseline score);
5. :func:`~reveal_plugins.detect.batch.stages.event_stage` and :func:`~reveal_plugins.detect.batch.stages.conclude`, the batch path's own stages, on
   the gathered columns and the sample; an event's window means are read back from the
   files that hold them.

Memory: the sample (``fit_windows`` x channels x 5), one feature file (<= one hour) and a few
numbers per window (~60 B x 600 000 windows for a week).  A run shorter than ``fit_windows``
windows is fitted on all its windows, so the only differences from the in-memory path are
the run-wide window grid, per-segment derived metrics and float32 rounding of the stored
statistics.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..evidence import foreign as fl
from ..evidence import gpu
from ..batch import model
from ..batch import stages
from .featstore import FeatureFileError, FeatureStore, segment_seq, read
from .featurize import Chunk, full_columns, informative_from, prepared_names
from ..batch.features import feature_matrix
from ..batch.detection import Detection
from ..batch.windows import STATS, Windows
from ..config import DetectConfig

log = logging.getLogger(__name__)

#: Columns every window keeps in memory (foreign-load family and its corrections).
_FOREIGN_COLS = tuple(fl.MINIMUM) + ("storage.all.write_bytes", "storage.run.write_bytes",
                                     "memory.MemAvailable", "cpu.foreign.user_cores") + tuple(
    f"cpu.all.{k}" for k in fl.BUSY + ("idle", "iowait", "steal"))   # fl.node_cores

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


def analyze_long(run_dir: str, meta: dict, metas: Sequence, cfg: DetectConfig,
                 baseline: dict | None, events: list[dict], full: bool, notes: list[str]):
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
        tail, nseg, nbytes = fs.update(run_dir, metas, iv, cfg.window_s, cfg.stride_s,
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
    from ...store import store
    return store.segment_paths(run_dir)


def _store(run_dir: str, names: list[str], cfg: DetectConfig, full: bool, notes: list[str]
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
            same = (abs(st["window_s"] - cfg.window_s) < 1e-9 and abs(
                st["stride_s"] - cfg.stride_s) < 1e-9 and read_names(files[0][2]) == names)
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
    out.analysis = {"window_s": cfg.window_s, "stride_s": cfg.stride_s,
                    "threshold": cfg.threshold, "channels_in": len(meta.get("channels", [])),
                    "streamed": True, "full": bool(full), "feature_files": len(files)}
    step = max(1, int(np.ceil(m / cfg.fit_windows)))
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
    ws = cfg.window_s
    out.analysis["windows"] = m
    out.analysis["fit_windows"] = len(sample_rows)
    if stages.too_short(m, float(t_min), float(t_max), cfg, notes):
        return out, samples
    keep, reasons = informative_from(acc)
    out.analysis["channels_dropped"] = {r: int(v.sum()) for r, v in reasons.items()}
    win = Windows(start, start + ws, np.zeros(m, int), valid, {}, ws, cfg.stride_s)
    W = stages.windows_judged(win, _LazyMeans(files, offsets, tail, c), names, units, keep,
                              meta, events, float(t_min), float(t_max), cfg, notes)
    if W is None:
        return out, samples
    fit_s = W.fitrows[sample_rows]
    if fit_s.sum() < 4:
        fit_s = valid[sample_rows]
    floors, rels = W.floors, W.rels
    # -- fit on the sample: the same model as stages.model_stage ----------------------------
    det_cols = np.nonzero(W.modelled)[0]
    fitted = None
    if len(det_cols) == 0:
        notes.append(model.NOTHING_VARIES)
    else:
        Md = S["mean"][fit_s][:, det_cols].astype(np.float64)
        mcols, pruned = model.choose_modelled(Md, det_cols, names, floors, rels, cfg)
        del Md
        mpos = pos_full[mcols]
        fitted = model.fit_model(_features(S, mcols, mpos, np.nonzero(fit_s)[0]), mcols,
                                 floors, rels, ws, cfg, notes)
        out.analysis.update({"detectors": fitted.names if fitted is not None else [],
                             "channels_analysed": int(len(det_cols)),
                             "channels_modelled": int(len(mcols)), "pruned": pruned})
    # -- pass 2: score every window, chunk by chunk ------------------------------------------
    fused = np.zeros(m)
    B = stages.baseline_columns(names, m, baseline, notes, out.analysis)
    if fitted is not None or len(B.cols):
        for i, ch in enumerate(_iter(files, tail)):
            a, b = offsets[i], offsets[i + 1]
            if fitted is not None and len(ch):
                fused[a:b] = fitted.score(_features(ch.stats, mcols, mpos))
            if len(B.cols):
                B.score[a:b] = stages.baseline_score(ch.stats["mean"], B)
    if len(B.cols):
        B.flag = stages.baseline_flag(B, W.flaggable, cfg)
    M = stages.ModelStage(fused, stages.flag_model(fused, W.flaggable, cfg)
                          if fitted is not None else np.zeros(m, bool))
    # -- events and judgement: the batch stages, on the gathered columns and the sample ------
    gnames = [names[j] for j in keepcols]
    P = _Names(names, units, win.mid, _Cols({j: gathered[:, q] for q, j in enumerate(keepcols)},
                                            m), cfg.stride_s)
    E = stages.event_stage(P, W, M, B, cfg, out.analysis, gathered=(gathered, gnames),
                           sample=(S["mean"], sample_rows))
    stages.conclude(P, W, M, B, E, cfg, meta, events, out)
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


def _features(stats: dict[str, np.ndarray], mcols: np.ndarray, mpos: np.ndarray,
              rows=None) -> np.ndarray:
    """The feature rows of stored window statistics: the modelled channels' means (``mcols``)
    and their full statistics (``mpos``, columns of the full-stat arrays)."""
    st = {s: (v if rows is None else v[rows]) for s, v in stats.items()}
    n = len(st["mean"])
    win = Windows(np.zeros(n), np.zeros(n), np.zeros(n, int), np.ones(n, bool),
                  {s: st[s][:, mpos] if s != "mean" else st[s][:, mcols] for s in STATS}, 0, 0)
    return feature_matrix(win)
