"""Incremental featurization: raw segments, in order, -> the statistics of every finished window.

Called after each segment is written (the agent's :class:`FeatureWriter`), by the job-end
analysis for the segments not featurized yet (the raw tail), and by ``reveal analyze --full``
for all of them.  The windows and statistics are those of the in-memory pipeline
(:mod:`~reveal_plugins.detect.batch.prepare` rates and derived metrics, :func:`~reveal_plugins.detect.batch.windows.sliding_windows` mean, std, min,
max, slope) on one run-wide grid: window ``i`` starts at ``t0 + i * stride``, ``t0`` the run's
first sample.  A window is emitted once a sample past its end has arrived, so each window is
computed exactly once, from the rows of the segments it covers plus a short raw carry.

Promise: the output depends only on the raw segments (the state is a bounded raw history), so
featurizing while the run goes on, resuming after a restart (:func:`resume`) and recomputing
everything at the end give the same numbers -- which is what makes job-end and ``--full``
analyses agree.
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ...types import ChannelMeta
from ..batch.prepare import PER_CORE, derive_channels, median_interval, to_rates
from ..batch.windows import STATS, sliding_windows

log = logging.getLogger(__name__)

#: A jump in the samples longer than this (and than 4 windows) restarts windowing after it,
#: so a clock jump of a year costs nothing.
MAX_GAP_S = 60.0
_RESETS = re.compile(r"^(\d+) counter channel")


@dataclass
class Chunk:
    """Statistics of consecutive windows (and of the prepared samples they were cut from)."""

    start: np.ndarray                    # (k,) window start, unix seconds
    count: np.ndarray                    # (k,) samples in the window
    valid: np.ndarray                    # (k,) enough samples to trust the statistics
    stats: dict[str, np.ndarray]         # "mean" -> (k, c), the others (k, len(full_cols))
    colstats: np.ndarray                 # (4, c) float64: finite count, sum, sum of squares,
    #                                      max |x| of the prepared samples of this chunk
    samples: int = 0
    t_min: float = math.inf
    t_max: float = -math.inf
    gaps: list[list[float]] = field(default_factory=list)
    resets: int = 0
    dropped_t: int = 0                   # samples without a valid or increasing timestamp

    def __len__(self) -> int:
        return len(self.start)


def empty_colstats(c: int) -> np.ndarray:
    return np.zeros((4, c))


def add_colstats(acc: np.ndarray, X: np.ndarray, chunk: int = 128) -> None:
    """Add the samples ``X`` (n, c) to running per-channel sums (float64, column chunks)."""
    for a in range(0, X.shape[1], chunk):
        Z = X[:, a:a + chunk].astype(np.float64)
        fin = np.isfinite(Z)
        Z[~fin] = 0.0
        acc[0, a:a + chunk] += fin.sum(axis=0)
        acc[1, a:a + chunk] += Z.sum(axis=0)
        acc[2, a:a + chunk] += (Z * Z).sum(axis=0)
        if len(Z):
            np.maximum(acc[3, a:a + chunk], np.abs(Z).max(axis=0), out=acc[3, a:a + chunk])


def informative_from(colstats: np.ndarray, cv_min: float = 0.01
                     ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """:func:`~reveal_plugins.detect.batch.prepare.informative` from running sums (one pass, no sample matrix)."""
    n, s, q, amax = colstats
    any_finite = n > 0
    nonzero = amax > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = s / np.maximum(n, 1)
        std = np.sqrt(np.maximum(q / np.maximum(n, 1) - mean * mean, 0.0))
        cv = np.where(np.abs(mean) > 0, std / np.abs(mean), np.where(std > 0, np.inf, 0.0))
    reasons = {"all_nan": ~any_finite, "always_zero": any_finite & ~nonzero,
               "near_constant": any_finite & nonzero & (cv < cv_min)}
    return any_finite & nonzero & (cv >= cv_min), reasons


def full_columns(names: Sequence[str]) -> np.ndarray:
    """Channels with all statistics; per-core ones have means only (they are modelled and
    attributed through the ``cpu.cores.*`` aggregates, see :mod:`~reveal_plugins.detect.batch.prepare`)."""
    return np.array([i for i, n in enumerate(names) if not PER_CORE.match(n)], np.intp)


def prepared_names(metas: Sequence[ChannelMeta]) -> tuple[list[str], list[str]]:
    """Names and units of the prepared channels (rates, then derived metrics)."""
    names = [m.name for m in metas]
    units = [m.unit + "/s" if m.kind == "counter" and m.unit else
             ("/s" if m.kind == "counter" else m.unit) for m in metas]
    _, dn, du = derive_channels(np.zeros((1, len(names)), np.float32), names, units)
    return names + dn, units + du


class Featurizer:
    """Streaming featurizer of one run: :meth:`feed` raw segments in order, :meth:`finish`."""

    def __init__(self, metas: Sequence[ChannelMeta], interval_s: float | None,
                 window_s: float = 3.0, stride_s: float = 1.0, t0: float | None = None,
                 next_w: int = 0):
        self.metas = list(metas)
        self.raw_names = [m.name for m in metas]
        self.names, self.units = prepared_names(metas)
        self.interval_s = interval_s
        self.stride_s = float(stride_s)
        self.w = max(1, int(round(window_s / self.stride_s)))
        self.window_s = self.w * self.stride_s
        self.t0 = t0
        self.next_w = next_w
        self.last_t = -math.inf
        self.slow = any(m.sample_every_s and m.sample_every_s > (interval_s or 0.1) * 1.5
                        for m in metas)
        every = max((m.sample_every_s or 0) for m in metas) if metas else 0
        self.carry_n = max(1, int(math.ceil(2.5 * every / (interval_s or 0.1)))) \
            if self.slow else 1
        c = len(self.names)
        self.full_cols = full_columns(self.names)
        self.pc_cols = np.setdiff1d(np.arange(c), self.full_cols)
        self._prev_t: np.ndarray | None = None      # raw carry (timestamps, raw rows)
        self._prev_raw: np.ndarray | None = None
        self._prev_X: np.ndarray | None = None      # its rates (context of derived metrics)
        self._bt = np.zeros(0)                      # prepared rows not fully windowed yet
        self._bX = np.zeros((0, c), np.float32)
        self._reset_acc()

    def _reset_acc(self) -> None:
        self._acc = empty_colstats(len(self.names))
        self._samples, self._tmin, self._tmax = 0, math.inf, -math.inf
        self._gaps: list[list[float]] = []
        self._resets = self._dropped = 0

    # -- input ---------------------------------------------------------------------------
    def feed(self, t: np.ndarray, raw: np.ndarray) -> Chunk:
        """One segment's raw rows (counters cumulative); returns the windows it finished."""
        t = np.asarray(t, np.float64)
        ok = np.isfinite(t)
        if len(t) > 1:
            ok &= np.concatenate([[True], np.diff(t) > 0])
        ok &= t > self.last_t
        self._dropped += int((~ok).sum())
        t, raw = t[ok], raw[ok]
        if len(t):
            self._prepare(t, raw)
        return self._emit(final=False)

    def finish(self) -> Chunk:
        """The remaining windows (the last ones may be partial, as in the in-memory path)."""
        return self._emit(final=True)

    def _prepare(self, t: np.ndarray, raw: np.ndarray) -> None:
        if self.t0 is None:
            self.t0 = float(t[0])
        if self.interval_s is None:
            self.interval_s = median_interval(t) if len(t) > 1 else None
        iv = self.interval_s or 1.0
        from ...store import store
        np_ = 0 if self._prev_t is None else len(self._prev_t)
        tt = t if not np_ else np.concatenate([self._prev_t, t])
        rr = raw if not np_ else np.vstack([self._prev_raw, raw])
        filled = rr
        if self.slow:
            filled = rr.copy()
            store.fill_slow_channels(tt, filled, self.metas, iv, tail=False)
        X, _, units, notes, gaps = to_rates(tt, filled, self.metas, iv)
        for n in notes:
            m = _RESETS.match(n)
            if m:
                self._resets += int(m.group(1))
        lo = self._prev_t[-1] if np_ else -math.inf
        self._gaps += [[a, b] for a, b in gaps if a >= lo]
        if np_:
            X[:np_] = self._prev_X      # the carry's rates as computed in its own segment
        cols, dn, _ = derive_channels(X, self.raw_names, units, tt)
        full = np.empty((len(tt), len(self.names)), np.float32)
        full[:, :len(self.raw_names)] = X
        for j, col in enumerate(cols):
            full[:, len(self.raw_names) + j] = col
        new = full[np_:]
        add_colstats(self._acc, new)
        self._samples += len(t)
        self._tmin, self._tmax = min(self._tmin, float(t[0])), max(self._tmax, float(t[-1]))
        self._prev_t, self._prev_raw = tt[-self.carry_n:].copy(), rr[-self.carry_n:].copy()
        self._prev_X = X[-self.carry_n:].copy()
        self._bt = np.concatenate([self._bt, t])
        self._bX = np.vstack([self._bX, new])
        self.last_t = float(t[-1])

    # -- output --------------------------------------------------------------------------
    def _emit(self, final: bool) -> Chunk:
        parts: list[tuple] = []
        while len(self._bt):
            ws0 = self.t0 + self.next_w * self.stride_s
            # skip the empty stretch before the first buffered sample (a gap, a clock jump)
            first_w = int(math.floor((self._bt[0] - self.t0) / self.stride_s)) - self.w + 1
            if first_w > self.next_w:
                self.next_w = first_w
                ws0 = self.t0 + self.next_w * self.stride_s
            jump = np.nonzero(np.diff(self._bt) > max(MAX_GAP_S, 4 * self.window_s))[0]
            end = int(jump[0]) + 1 if len(jump) else len(self._bt)
            piece_final = final or end < len(self._bt)
            bt, bX = self._bt[:end], self._bX[:end]
            last_blk = int(math.floor((bt[-1] - self.t0) / self.stride_s))
            upto = last_blk - self.w + (1 if piece_final else 0)   # last window index emitted
            k = upto - self.next_w + 1
            if k > 0:
                win = sliding_windows(bt, bX[:, self.full_cols], self.window_s,
                                      self.stride_s, self.interval_s, t0=ws0, stats=STATS)
                k = min(k, len(win))
                keep = win.count[:k] > 0
                st = {s: win.stats[s][:k][keep] for s in STATS}
                mean = np.empty((int(keep.sum()), bX.shape[1]), np.float32)
                mean[:, self.full_cols] = st["mean"]
                if len(self.pc_cols):
                    wm = sliding_windows(bt, bX[:, self.pc_cols], self.window_s, self.stride_s,
                                         self.interval_s, t0=ws0, stats=("mean",))
                    mean[:, self.pc_cols] = wm.stats["mean"][:k][keep]
                st["mean"] = mean
                parts.append((win.start[:k][keep], win.count[:k][keep], win.valid[:k][keep],
                              st))
                self.next_w += k
            if end < len(self._bt):          # windows before the jump are done
                self._bt, self._bX = self._bt[end:], self._bX[end:]
                continue
            keep_from = self.t0 + self.next_w * self.stride_s
            i = int(np.searchsorted(self._bt, keep_from - 1e-9))
            self._bt, self._bX = self._bt[i:], self._bX[i:]
            break
        c, cf = len(self.names), len(self.full_cols)
        if parts:
            ch = Chunk(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                       np.concatenate([p[2] for p in parts]),
                       {s: np.concatenate([p[3][s] for p in parts]) for s in STATS}, self._acc)
        else:
            ch = Chunk(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, bool),
                       {s: np.zeros((0, c if s == "mean" else cf), np.float32) for s in STATS},
                       self._acc)
        ch.samples, ch.t_min, ch.t_max = self._samples, self._tmin, self._tmax
        ch.gaps, ch.resets, ch.dropped_t = self._gaps, self._resets, self._dropped
        self._reset_acc()
        return ch

    def state(self) -> dict:
        """What a resumed featurizer needs besides the raw segments (stored with each file)."""
        return {"t0": self.t0, "next_w": self.next_w, "interval_s": self.interval_s,
                "window_s": self.window_s, "stride_s": self.stride_s, "last_t": self.last_t}


#: Raw segments re-read before the first unfeaturized one when featurization resumes: they
#: rebuild the carry (rates and slow-channel context) exactly.
WARMUP_SEGMENTS = 4


def resume(metas: Sequence[ChannelMeta], state: dict, warmup: list[tuple[np.ndarray, np.ndarray]]
           ) -> Featurizer:
    """A featurizer that continues where one with ``state`` stopped, rebuilt from the raw rows
    of the last few featurized segments (``warmup``, in order; their windows are not emitted
    again)."""
    f = Featurizer(metas, state.get("interval_s"), state["window_s"], state["stride_s"],
                   state.get("t0"), 0)
    for t, raw in warmup:
        f.feed(t, raw)
    f.next_w = int(state["next_w"])
    keep_from = f.t0 + f.next_w * f.stride_s if f.t0 is not None else -math.inf
    i = int(np.searchsorted(f._bt, keep_from - 1e-9))
    f._bt, f._bX = f._bt[i:], f._bX[i:]
    f.last_t = max(f.last_t, float(state.get("last_t", -math.inf)))
    f._reset_acc()
    return f
