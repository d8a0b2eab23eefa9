"""Window statistics -> a robust-scaled feature matrix, with practical-significance floors.

Robust scaling alone turns a channel that is almost constant in a healthy run (a disk that
writes 4 KiB now and then, zero major faults) into a hair trigger.  Every channel therefore
gets a *floor*: the smallest change a person would call a change in that unit (2 percentage
points, 5 % of a core, 1 MiB/s, 64 MiB of memory ...).  Deviations are measured in units of
``max(robust spread, floor)``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .windows import STATS, Windows

#: Clip scaled features so one extreme channel cannot swamp the detectors.
CLIP = 50.0

_MiB = 1024.0 * 1024.0


#: A qdisc's queue is no memory level (64 MiB) and its counters no packet rate (200/s): on a
#: healthy interface they are 0, and what a shaper does is a queue of a few segments and tens
#: of packets a second held back.  A quarter of each symptom's practical minimum
#: (``attribution.SYMPTOMS``: 16 KiB, 10 packets, 10/s), so that minimum is 4 spreads.
_QDISC_FLOORS = {"qdisc_backlog": 4096.0, "qdisc_qlen": 2.5, "qdisc_drops": 2.5,
                 "qdisc_overlimits": 2.5, "qdisc_requeues": 2.5}


def unit_floor(name: str, unit: str) -> float:
    """Smallest meaningful change for a channel, in its prepared unit (rates are per second)."""
    u = (unit or "").strip().lower().replace("µ", "u")
    leaf = name.rsplit(".", 1)[-1].lower()
    if leaf in _QDISC_FLOORS:
        return _QDISC_FLOORS[leaf]
    if u in ("%", "percent", "pct") or leaf.endswith("pct"):
        return 2.0
    if "octets" in leaf and u.endswith("/s"):      # /proc/net/netstat IpExt: bytes
        return _MiB
    table = {
        "ticks/s": 5.0, "jiffies/s": 5.0,          # 5 % of one core (USER_HZ=100)
        "us/s": 20_000.0, "ms/s": 20.0, "ns/s": 5e7, "s/s": 0.05,   # 2-5 % of the time/a core
        "b/s": _MiB, "bytes/s": _MiB, "byte/s": _MiB, "kb/s": 1024.0, "kib/s": 1024.0,
        "sectors/s": 2048.0, "sector/s": 2048.0,
        "kb": 64 * 1024.0, "kib": 64 * 1024.0, "b": 64 * _MiB, "bytes": 64 * _MiB,
        "mb": 64.0, "mib": 64.0, "pages": 16384.0, "pages/s": 256.0,
        "c": 3.0, "degc": 3.0, "°c": 3.0, "celsius": 3.0,
        "w": 10.0, "j/s": 10.0, "mw": 10_000.0, "mhz": 50.0, "hz": 50e6,
        "gen": 0.5, "lanes": 1.0, "flag": 0.5, "state": 0.5, "gb/s": 1.0,
        "tasks": 1.0, "processes": 1.0, "requests": 1.0, "cores": 0.1,
        "cycles/s": 1e8, "instructions/s": 1e8, "references/s": 1e6, "misses/s": 1e5,
        "branches/s": 1e7, "packets/s": 200.0, "pkts/s": 200.0,
        "errors/s": 0.2, "events/s": 0.2, "kills/s": 0.2, "replays/s": 0.2,
    }
    if u in table:
        f = table[u]
        if u == "tasks" and "load" in leaf:
            return 0.5
        if u == "tasks" and "threads" in leaf:
            return 8.0
        return f
    if "fault" in leaf:
        return 20.0 if ("major" in leaf or "majfault" in leaf) else 500.0
    if re.search(r"(err|drop|retrans|timeout|xid|ecc|oom|fail|lost|abort|overflow)", leaf):
        return 1.0
    if "load" in leaf:
        return 0.5
    if u.endswith("/s"):
        return 20.0
    return 1.0


def channel_floors(names: list[str], units: list[str]) -> np.ndarray:
    return np.array([unit_floor(n, u) for n, u in zip(names, units)], dtype=np.float64)


#: Memory levels (kB, bytes, pages) are large numbers whose healthy run-to-run noise is far
#: below 2 % of the level: a 4 GiB hog on a 24 GiB node is 17 % of MemAvailable.
_LEVEL_UNITS = ("kb", "kib", "b", "bytes", "pages", "mb", "mib")


def rel_floors(units: list[str]) -> np.ndarray:
    return np.array([0.005 if (u or "").lower() in _LEVEL_UNITS else 0.02 for u in units])


def nanmedian_cols(A: np.ndarray) -> np.ndarray:
    """Column medians ignoring NaN; fast path for the (usual) columns without NaN."""
    fin = np.isfinite(A)
    full = fin.all(axis=0)
    out = np.full(A.shape[1], np.nan)
    if len(A) == 0:
        return out
    if full.any():
        out[full] = np.median(A[:, full], axis=0)
    for j in np.nonzero(~full)[0]:
        col = A[fin[:, j], j]
        if len(col):
            out[j] = np.median(col)
    return out


def robust_center_scale(A: np.ndarray, floor: np.ndarray, rel: float | np.ndarray = 0.02
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Median and max(1.4826*MAD, floor, rel*|median|) per column, NaN-aware (``rel`` per
    column from :func:`rel_floors`, or one number)."""
    med = nanmedian_cols(A)
    with np.errstate(invalid="ignore"):
        mad = 1.4826 * nanmedian_cols(np.abs(A - med))
    med = np.where(np.isfinite(med), med, 0.0)
    mad = np.where(np.isfinite(mad), mad, 0.0)
    scale = np.maximum(np.maximum(mad, floor), rel * np.abs(med))
    return med, np.maximum(scale, 1e-12)


@dataclass
class Scaler:
    """Per-feature robust centre and scale (learned from a run's own windows or a baseline)."""

    center: np.ndarray
    scale: np.ndarray

    def transform(self, F: np.ndarray) -> np.ndarray:
        Z = (F - self.center) / self.scale
        Z = np.where(np.isfinite(Z), Z, 0.0)
        return np.clip(Z, -CLIP, CLIP).astype(np.float32)

    def to_dict(self) -> dict:
        return {"center": self.center.tolist(), "scale": self.scale.tolist()}


def feature_matrix(win: Windows, cols: np.ndarray | None = None,
                   stats: tuple[str, ...] = STATS) -> np.ndarray:
    """(m, len(cols)*len(stats)) raw feature matrix, channel-major (c0.mean, c0.std, ...)."""
    first = win.stats[stats[0]]
    cols = np.arange(first.shape[1]) if cols is None else cols
    parts = [win.stats[s][:, cols].astype(np.float64) for s in stats]
    return np.stack(parts, axis=2).reshape(len(win), -1)


def feature_floors(ch_floor: np.ndarray, window_s: float, stats: tuple[str, ...] = STATS
                   ) -> np.ndarray:
    mult = {"mean": 1.0, "min": 1.0, "max": 1.0, "std": 0.5, "slope": 1.0 / max(window_s, 1.0)}
    return np.stack([ch_floor * mult[s] for s in stats], axis=1).reshape(-1)


def fit_scaler(F: np.ndarray, floors: np.ndarray, fit_rows: np.ndarray | None = None,
               rel: float | np.ndarray = 0.02, wide: np.ndarray | None = None) -> Scaler:
    """Robust scaler.  Features marked ``wide`` (the within-window std/min/max/slope of
    counter rates sampled at 10 Hz: one I/O in a 0.1-s sample is a rate spike of 10/s) are
    also scaled by their 10-90 % inter-quantile range, so sparse spikes that happen in many
    windows of a healthy run do not look like anomalies."""
    A = F if fit_rows is None else F[fit_rows]
    c, s = robust_center_scale(A, floors, rel)
    if wide is not None and wide.any() and len(A) >= 10:
        W = A[:, wide]
        with np.errstate(invalid="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                q10, q90 = np.nanpercentile(W, [10, 90], axis=0)
        spread = np.nan_to_num((q90 - q10) / 2.563)
        s = s.copy()
        s[wide] = np.maximum(s[wide], spread)
    return Scaler(c, s)
