"""Correlated-channel pruning: keep one representative per group of channels with |r| >= thr.

Used before the detectors only (attribution still looks at every channel).  Correlation is
measured between per-window means.  Greedy: the channel that moves most goes first (when a
priority is given), then the one correlated with the most others; derived metrics win ties.
"""
from __future__ import annotations

import numpy as np

#: Paper: Pearson |r| >= 0.5 removes ~40 % of channels.
THRESHOLD = 0.5


def correlation(M: np.ndarray) -> np.ndarray:
    """Pearson correlation between columns of M (NaN filled with the column median)."""
    A = M.astype(np.float64, copy=True)
    if A.shape[0] < 3:
        return np.eye(A.shape[1])
    fin = np.isfinite(A)
    if not fin.all():
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(A, axis=0)
        med = np.where(np.isfinite(med), med, 0.0)
        A = np.where(fin, A, med)
    A -= A.mean(axis=0)
    sd = np.sqrt((A * A).sum(axis=0))
    ok = sd > 0
    A[:, ok] /= sd[ok]
    A[:, ~ok] = 0.0
    R = A.T @ A
    np.fill_diagonal(R, 1.0)
    return R


def prune(M: np.ndarray, names: list[str], threshold: float = THRESHOLD,
          priority: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, str]]:
    """Return (kept column indices, {pruned channel: its representative}).

    ``priority`` (higher first) picks representatives; the pipeline passes how far each
    channel moves at most (robust units), so a group of channels that move together during an
    anomaly is represented by the one that moves most, not by a bystander that is mildly
    correlated with it.
    """
    c = M.shape[1]
    if c <= 1:
        return np.arange(c), {}
    R = np.abs(correlation(M))
    strong = R >= threshold
    # Only channels of the same subsystem represent each other: during an anomaly everything
    # moves together, and a memory gauge must not stand in for CPU pressure.
    subs = np.array([n.split(".", 1)[0] for n in names])
    strong &= subs[:, None] == subs[None, :]
    degree = strong.sum(axis=1)
    derived = np.array([n.endswith(("_pct", "ipc", "_ratio")) or ".psi." in n for n in names])
    if priority is None:
        order = np.lexsort((-derived.astype(int), -degree))
    else:
        order = np.lexsort((-derived.astype(int), -degree, -np.asarray(priority, float)))
    removed = np.zeros(c, bool)
    kept: list[int] = []
    rep: dict[str, str] = {}
    for i in order:
        if removed[i]:
            continue
        kept.append(int(i))
        grp = np.nonzero(strong[i] & ~removed)[0]
        for j in grp:
            if j != i:
                removed[j] = True
                rep[names[j]] = names[i]
        removed[i] = True
    return np.array(sorted(kept), dtype=np.intp), rep
