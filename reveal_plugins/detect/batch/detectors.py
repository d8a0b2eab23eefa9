"""Unsupervised window detectors (estimator-like: ``fit(X)`` then ``score_samples(X)``).

``X`` is windows x features, robust-scaled (0 = typical, 1 = one robust spread or one
practical floor).  Higher scores mean more anomalous.  Each detector also says, through
``score_floor``, how small a spread of its own scores is still meaningful; fusion uses it so that
a run where nothing happens does not get its noise stretched into alarms.

The built-ins are complementary: a per-feature extreme-value view (robust z), a linear
correlation-structure view (PCA reconstruction + Hotelling), and a partition view
(IsolationForest).  They are contributed through the ``reveal_detectors`` hook like any
third-party detector.
"""
from __future__ import annotations

import numpy as np


class RobustZDetector:
    """Mean of the ``k`` largest |z| of a window: a few channels far from their usual level."""

    name = "robust_z"
    score_floor = 1.0

    def __init__(self, k: int = 3):
        self.k = k

    def fit(self, X: np.ndarray) -> "RobustZDetector":
        return self

    def score_samples(self, X: np.ndarray) -> np.ndarray:
        if X.shape[1] == 0:
            return np.zeros(len(X))
        A = np.abs(X)
        k = min(self.k, A.shape[1])
        top = np.partition(A, A.shape[1] - k, axis=1)[:, -k:]
        return top.mean(axis=1).astype(np.float64)


class PCADetector:
    """Distance from the principal subspace of typical windows (SPE) plus Hotelling's T².

    Fitted on the windows closest to the centre (``trim`` quantile of their norm) so that an
    anomaly lasting a large part of the run does not become a principal component itself.
    """

    name = "pca"
    score_floor = 1.0

    def __init__(self, variance: float = 0.9, max_components: int = 20, trim: float = 0.8):
        self.variance = variance
        self.max_components = max_components
        self.trim = trim

    def fit(self, X: np.ndarray) -> "PCADetector":
        X = np.asarray(X, dtype=np.float64)
        n, d = X.shape
        self.mu_ = np.zeros(d)
        self.comp_ = np.zeros((0, d))
        self.var_ = np.ones(0)
        self.res_var_ = 1.0
        if n < 4 or d == 0:
            return self
        norms = np.linalg.norm(X, axis=1)
        keep = norms <= np.quantile(norms, self.trim)
        A = X[keep] if keep.sum() >= 4 else X
        self.mu_ = A.mean(axis=0)
        A = A - self.mu_
        # eigen-decomposition of the covariance: d x d, cheaper than an SVD of n x d
        ev, vec = np.linalg.eigh(A.T @ A / max(len(A) - 1, 1))
        order = np.argsort(ev)[::-1]
        ev, vt = np.maximum(ev[order], 0.0), vec[:, order].T
        tot = ev.sum()
        if tot <= 0:
            return self
        k = int(np.searchsorted(np.cumsum(ev) / tot, self.variance) + 1)
        k = max(1, min(k, self.max_components, len(ev) - 1 if len(ev) > 1 else 1))
        self.comp_ = vt[:k]
        self.var_ = np.maximum(ev[:k], 1e-6)
        res = A - (A @ self.comp_.T) @ self.comp_
        self.res_var_ = max(float((res * res).sum(axis=1).mean()), 1.0)
        return self

    def score_samples(self, X: np.ndarray) -> np.ndarray:
        A = np.asarray(X, dtype=np.float64) - self.mu_
        if self.comp_.shape[0] == 0:
            return np.sqrt((A * A).sum(axis=1))
        P = A @ self.comp_.T
        res = A - P @ self.comp_
        spe = (res * res).sum(axis=1) / self.res_var_
        t2 = ((P * P) / np.maximum(self.var_, 1.0)).sum(axis=1)
        return np.sqrt(spe + t2)


class IsolationForestDetector:
    """Isolation forest (Liu, Ting & Zhou 2008; scikit-learn's implementation): windows that
    few random axis-parallel splits isolate.  Imported lazily: scikit-learn's ensemble module
    takes ~1 s to import, paid only when analysis runs."""

    name = "iforest"
    score_floor = 0.02

    def __init__(self, n_estimators: int = 100, max_samples: int = 256, random_state: int = 0,
                 group: int = 1):
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.random_state = random_state
        self.group = group

    def _view(self, X: np.ndarray) -> np.ndarray:
        """With ``group=k`` (k statistics per channel, channel-major), split on each channel's
        largest |z| instead of on single statistics: random splits then land on the few
        channels that moved instead of being spread over hundreds of quiet features."""
        X = np.asarray(X, dtype=np.float64)
        k = self.group
        if k > 1 and X.shape[1] % k == 0 and X.shape[1] > 0:
            return np.abs(X.reshape(len(X), -1, k)).max(axis=2)
        return X

    def fit(self, X: np.ndarray) -> "IsolationForestDetector":
        from sklearn.ensemble import IsolationForest
        X = self._view(X)
        self.model_ = None
        if len(X) < 8 or X.shape[1] == 0:
            return self
        self.model_ = IsolationForest(n_estimators=self.n_estimators,
                                      max_samples=min(self.max_samples, len(X)),
                                      random_state=self.random_state).fit(X)
        return self

    def score_samples(self, X: np.ndarray) -> np.ndarray:
        X = self._view(X)
        if getattr(self, "model_", None) is None:
            return np.zeros(len(X))
        # scikit-learn returns the opposite of the paper's anomaly score s(x) in (0, 1]
        return -self.model_.score_samples(X)


def builtin_detectors(config: dict | None = None) -> list:
    cfg = (config or {}).get("detectors", {}) if isinstance(config, dict) else {}
    from .windows import STATS

    dets = [RobustZDetector(**cfg.get("robust_z", {})), PCADetector(**cfg.get("pca", {})),
            IsolationForestDetector(**{"group": len(STATS), **cfg.get("iforest", {})})]
    return dets


def norm_params(fit_scores: np.ndarray, floor: float) -> tuple[float, float] | None:
    """Median and robust spread (MAD x 1.4826, at least ``floor``) of a detector's scores on
    the windows it was fitted on; None when none is finite."""
    fs = fit_scores[np.isfinite(fit_scores)]
    if len(fs) == 0:
        return None
    med = float(np.median(fs))
    mad = 1.4826 * float(np.median(np.abs(fs - med)))
    return med, max(mad, floor)


def normalize(scores: np.ndarray, fit_scores: np.ndarray, floor: float) -> np.ndarray:
    """Scores in robust-sigma units of the detector's own score distribution (floored)."""
    p = norm_params(fit_scores, floor)
    if p is None:
        return np.zeros_like(scores)
    return (scores - p[0]) / p[1]


def fuse(normalized: list[np.ndarray]) -> np.ndarray:
    """Median of the detectors' normalized scores: a window needs most detectors to agree."""
    if not normalized:
        return np.zeros(0)
    return np.median(np.vstack(normalized), axis=0)
