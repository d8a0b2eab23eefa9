"""Sliding windows over prepared series: per-window mean, std, min, max and slope per channel.

Windows are ``window_s`` long and start every ``stride_s`` (paper: 3 s / 1 s).  The series is
cut once into stride-long blocks whose sums are combined into windows, so the cost is one pass
over the samples whatever the window length, and channels are processed in chunks to bound the
memory of temporaries (1 h x 700 channels at 10 Hz stays well under 1 GB).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STATS = ("mean", "std", "min", "max", "slope")


@dataclass
class Windows:
    """Per-window statistics: ``stats[k]`` is (m, c) for k in :data:`STATS`."""

    start: np.ndarray       # (m,) window start, unix seconds
    end: np.ndarray         # (m,)
    count: np.ndarray       # (m,) samples in the window
    valid: np.ndarray       # (m,) bool: enough samples to trust the statistics
    stats: dict[str, np.ndarray]
    window_s: float
    stride_s: float

    @property
    def mid(self) -> np.ndarray:
        return 0.5 * (self.start + self.end)

    def __len__(self) -> int:
        return len(self.start)


def _blocks(t: np.ndarray, t0: float, stride_s: float) -> tuple[np.ndarray, np.ndarray, int]:
    b = np.floor((t - t0) / stride_s).astype(np.int64)
    nb = int(b[-1]) + 1 if len(b) else 0
    # First sample index of every block (blocks without samples repeat the next start).
    starts = np.searchsorted(b, np.arange(nb + 1))
    return b, starts, nb


def sliding_windows(t: np.ndarray, X: np.ndarray, window_s: float = 3.0, stride_s: float = 1.0,
                    interval_s: float | None = None, t0: float | None = None,
                    chunk: int = 96, min_fill: float = 0.5,
                    stats: tuple[str, ...] = STATS) -> Windows:
    """Cut (t, X) into windows.  ``t0`` aligns the grid (default: first sample).
    ``stats=("mean",)`` computes only the means (a quarter of the cost).

    A window is valid when it holds at least ``min_fill`` of the samples its length implies
    (windows over a gap or at a truncated end are kept but marked invalid).
    """
    n, c = X.shape
    stride_s = float(stride_s)
    w = max(1, int(round(window_s / stride_s)))
    window_s = w * stride_s
    empty = Windows(np.zeros(0), np.zeros(0), np.zeros(0, int), np.zeros(0, bool),
                    {k: np.zeros((0, c), np.float32) for k in stats}, window_s, stride_s)
    if n == 0:
        return empty
    t0 = float(t[0]) if t0 is None else float(t0)
    sel = t >= t0
    t, X = t[sel], X[sel]
    if len(t) == 0:
        return empty
    _, starts, nb = _blocks(t, t0, stride_s)
    m = nb - w + 1
    if m <= 0:
        return empty
    lo = starts[:-1]
    hi = starts[1:]
    nonempty = hi > lo
    cnt_blk = (hi - lo).astype(np.int64)
    cs = np.concatenate([[0], np.cumsum(cnt_blk)])
    count = cs[w:] - cs[:-w]
    ws = t0 + np.arange(m) * stride_s
    we = ws + window_s
    if interval_s is None:
        interval_s = float(np.median(np.diff(t))) if len(t) > 1 else stride_s
    expected = max(1.0, window_s / max(interval_s, 1e-9))
    valid = count >= min_fill * expected
    out = {k: np.full((m, c), np.nan, np.float32) for k in stats}
    full = set(stats) != {"mean"}
    tt = (t - t0).astype(np.float64)
    # reduceat needs valid indices: only reduce non-empty blocks, scatter back.
    ne_idx = np.nonzero(nonempty)[0]
    red_at = lo[ne_idx]
    def blocksum(arr: np.ndarray) -> np.ndarray:
        s = np.zeros((nb,) + arr.shape[1:])
        if len(red_at):
            s[ne_idx] = np.add.reduceat(arr, red_at, axis=0)
        return s

    def roll(arr: np.ndarray) -> np.ndarray:
        cs_ = np.cumsum(arr, axis=0)
        r = cs_[w - 1:].copy()
        r[1:] -= cs_[:-w]
        return r

    # time sums of every block, shared by all NaN-free channels
    n_all = roll(blocksum(np.ones(len(tt)))[:, None])
    t_all = roll(blocksum(tt)[:, None])
    t2_all = roll(blocksum(tt * tt)[:, None])
    for a in range(0, c, chunk):
        b = min(c, a + chunk)
        Y = X[:, a:b].astype(np.float64)
        fin = np.isfinite(Y)
        clean = bool(fin.all())
        if not clean:
            Y0 = np.where(fin, Y, 0.0)
        else:
            Y0 = Y
        S = roll(blocksum(Y0))
        if clean:
            N = n_all
        else:
            N = roll(blocksum(fin.astype(np.float64)))
        if not full:
            with np.errstate(invalid="ignore", divide="ignore"):
                out["mean"][:, a:b] = S / np.where(N > 0, N, np.nan)
            continue
        Q = roll(blocksum(Y0 * Y0))
        TX = roll(blocksum(Y0 * tt[:, None]))
        if clean:
            T1, T2 = t_all, t2_all
            lo_v, hi_v = Y, Y
        else:
            tcol = np.where(fin, tt[:, None], 0.0)
            T1 = roll(blocksum(tcol))
            T2 = roll(blocksum(tcol * tcol))
            del tcol
            lo_v, hi_v = np.where(fin, Y, np.inf), np.where(fin, Y, -np.inf)
        k = b - a
        mn_b = np.full((nb, k), np.inf)
        mx_b = np.full((nb, k), -np.inf)
        if len(red_at):
            mn_b[ne_idx] = np.minimum.reduceat(lo_v, red_at, axis=0)
            mx_b[ne_idx] = np.maximum.reduceat(hi_v, red_at, axis=0)
        del Y, fin, Y0, lo_v, hi_v
        mn = mn_b[0:m].copy()
        mx = mx_b[0:m].copy()
        for o in range(1, w):
            np.minimum(mn, mn_b[o:o + m], out=mn)
            np.maximum(mx, mx_b[o:o + m], out=mx)
        with np.errstate(invalid="ignore", divide="ignore"):
            Nn = np.where(N > 0, N, np.nan)
            mean = S / Nn
            var = np.maximum(Q / Nn - mean * mean, 0.0)
            tbar = T1 / Nn
            stt = T2 - Nn * tbar * tbar
            slope = np.where(stt > 1e-12, (TX - Nn * tbar * mean) / stt, 0.0)
        out["mean"][:, a:b] = mean
        out["std"][:, a:b] = np.sqrt(var)
        out["min"][:, a:b] = np.where(np.isfinite(mn), mn, np.nan)
        out["max"][:, a:b] = np.where(np.isfinite(mx), mx, np.nan)
        out["slope"][:, a:b] = np.where(N > 1, slope, np.nan)
    return Windows(ws, we, count, valid, out, window_s, stride_s)


def windows_pieces(t: np.ndarray, X: np.ndarray, window_s: float = 3.0, stride_s: float = 1.0,
                   interval_s: float | None = None, max_gap_s: float = 60.0,
                   stats: tuple[str, ...] = STATS) -> Windows:
    """Like :func:`sliding_windows`, but a gap longer than ``max_gap_s`` (a clock jump, an
    agent that stopped for a while) splits the series into pieces windowed separately, so an
    hour-long (or year-long) jump costs nothing."""
    if len(t) < 2:
        return sliding_windows(t, X, window_s, stride_s, interval_s, stats=stats)
    cut = np.nonzero(np.diff(t) > max(max_gap_s, 4 * window_s))[0] + 1
    if len(cut) == 0:
        return sliding_windows(t, X, window_s, stride_s, interval_s, stats=stats)
    parts = [sliding_windows(t[a:b], X[a:b], window_s, stride_s, interval_s, stats=stats)
             for a, b in zip(np.concatenate([[0], cut]), np.concatenate([cut, [len(t)]]))]
    parts = [p for p in parts if len(p)] or parts[:1]
    return Windows(np.concatenate([p.start for p in parts]),
                   np.concatenate([p.end for p in parts]),
                   np.concatenate([p.count for p in parts]),
                   np.concatenate([p.valid for p in parts]),
                   {k: np.concatenate([p.stats[k] for p in parts]) for k in stats},
                   parts[0].window_s, parts[0].stride_s)
