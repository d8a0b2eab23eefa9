"""Group flagged windows into anomaly events (gap merging, minimum duration)."""
from __future__ import annotations

import numpy as np


def group(flagged: np.ndarray, mid: np.ndarray, stride_s: float, gap_s: float = 3.0,
          min_windows: int = 3) -> list[tuple[int, int]]:
    """Runs of flagged windows as (first, last) window indices, inclusive.

    Flagged windows whose centres are at most ``gap_s`` apart (beyond the stride) belong to the
    same event; events with fewer than ``min_windows`` flagged windows are dropped (one odd
    window is noise, not a finding).
    """
    idx = np.nonzero(flagged)[0]
    if len(idx) == 0:
        return []
    out: list[tuple[int, int]] = []
    start = prev = int(idx[0])
    count = 1
    for i in idx[1:]:
        i = int(i)
        if mid[i] - mid[prev] <= stride_s + gap_s + 1e-9:
            prev = i
            count += 1
            continue
        if count >= min_windows:
            out.append((start, prev))
        start = prev = i
        count = 1
    if count >= min_windows:
        out.append((start, prev))
    return out


def span(first: int, last: int, mid: np.ndarray, stride_s: float) -> tuple[float, float]:
    """Event time span: from the first flagged window's centre to the last one's, +- half a
    stride (a window flags once about half of it overlaps the anomaly, so its centre is the
    best onset estimate)."""
    return float(mid[first] - stride_s / 2), float(mid[last] + stride_s / 2)


def hysteresis(score: np.ndarray, ok: np.ndarray, high: float, low: float) -> np.ndarray:
    """Windows flagged with two thresholds: a run of consecutive windows scoring >= ``low``
    is flagged when at least one of them scores >= ``high`` (the usual double threshold: the
    onset and the tail of an anomaly score lower than its core)."""
    out = np.zeros(len(score), bool)
    for i, j in true_runs(ok & (score >= low)):
        if (score[i:j] >= high).any():
            out[i:j] = True
    return out


def true_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the runs of consecutive True entries of ``mask``."""
    out = []
    i, n = 0, len(mask)
    while i < n:
        if not mask[i]:
            i += 1
            continue
        j = i
        while j < n and mask[j]:
            j += 1
        out.append((i, j))
        i = j
    return out
