"""Turn a loaded run into analysable series: counters -> rates, derived metrics, channel filtering.

Called first by :func:`reveal_plugins.detect.analyze` (and, on a short horizon, by live mode).
Promises: a float32 matrix ``X`` (samples x channels) of per-second rates and gauges with NaN
for missing values, a name/unit/subsystem per column, and notes for everything surprising in the
input (gaps, clock jumps, counter resets, dropped channels) -- never an exception for bad data.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ...types import ChannelMeta
from ..evidence.foreign import derive as foreign_derive

#: Channels whose coefficient of variation is below this carry no information (paper: 0.01).
CV_MIN = 0.01


@dataclass
class Prepared:
    """Analysable series of one run (or one live horizon)."""

    t: np.ndarray                 # (n,) unix seconds, increasing
    X: np.ndarray                 # (n, c) float32, rates per second for counters, NaN = missing
    names: list[str]
    units: list[str]
    notes: list[str] = field(default_factory=list)
    dropped: dict[str, list[str]] = field(default_factory=dict)
    interval_s: float = 1.0
    gaps: list[tuple[float, float]] = field(default_factory=list)

    @property
    def subsystems(self) -> list[str]:
        return [n.split(".", 1)[0] for n in self.names]

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}


def _rate_unit(unit: str) -> str:
    return (unit + "/s") if unit else "/s"


def median_interval(t: np.ndarray) -> float:
    if len(t) < 2:
        return 1.0
    d = np.diff(t)
    d = d[d > 0]
    return float(np.median(d)) if len(d) else 1.0


def to_rates(t: np.ndarray, values: np.ndarray, metas: Sequence[ChannelMeta],
             interval_s: float | None = None) -> tuple[np.ndarray, list[str], list[str],
                                                       list[str], list[tuple[float, float]]]:
    """Counters -> per-second rates (first sample, resets and samples after a gap -> NaN).

    Returns ``(X float32, names, units, notes, gaps)``.  A gap is a time step longer than five
    sampling intervals (and at least 2 s): the agent paused, a segment was lost, or the wall
    clock jumped; a rate across it would be meaningless.
    """
    notes: list[str] = []
    n, c = values.shape
    X = np.empty((n, c), dtype=np.float32)
    names = [m.name for m in metas]
    units = [m.unit for m in metas]
    gaps: list[tuple[float, float]] = []
    if n == 0:
        return X, names, units, notes, gaps
    iv = interval_s or median_interval(t)
    dt = np.diff(t)
    gap_idx = np.nonzero(dt > max(5 * iv, 2.0))[0]
    for i in gap_idx[:5]:
        gaps.append((float(t[i]), float(t[i + 1])))
    if len(gap_idx):
        notes.append(f"{len(gap_idx)} gap(s) in the samples (largest {dt[gap_idx].max():.1f} s at "
                     f"t={t[gap_idx[np.argmax(dt[gap_idx])]]:.1f}): lost segment, agent pause or "
                     "clock jump; rates across a gap are left out")
    bad_dt = np.concatenate([[True], (dt <= 0) | (dt > max(5 * iv, 2.0))])
    safe_dt = np.where(dt > 0, dt, np.nan)
    counter = np.array([m.kind == "counter" for m in metas], bool)
    gauge_idx = np.nonzero(~counter)[0]
    X[:, gauge_idx] = values[:, gauge_idx]
    resets = 0
    cidx = np.nonzero(counter)[0]
    for a in range(0, len(cidx), 128):   # chunks bound the float64 temporaries
        cols = cidx[a:a + 128]
        d = np.empty((n, len(cols)))
        d[0] = np.nan
        np.subtract(values[1:, cols], values[:-1, cols], out=d[1:])
        d[1:] /= safe_dt[:, None]
        neg = d < 0
        if neg.any():
            resets += int(neg.any(axis=0).sum())
            d[neg] = np.nan
        d[bad_dt] = np.nan
        X[:, cols] = d
    for j in cidx:
        units[j] = _rate_unit(units[j])
    if resets:
        notes.append(f"{resets} counter channel(s) went backwards (reset or wrap); those samples "
                     "are left out")
    return X, names, units, notes, gaps


# -- derived metrics -------------------------------------------------------------------------

_CPU_TICKS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# compiled once: derive_channels runs on every 10-s segment in the agent's featurizer
_GPU_POWER = re.compile(r"^(gpu\.\d+)\.(power|power_w|power_usage)$")
_GPU_CLOCK = re.compile(r"^(gpu\.\d+)\.(clock_sm|sm_clock|clocks_sm)(_mhz)?$")
_NET_BYTES = re.compile(r"^(network\.[^.]+)\.(rx|tx)_bytes$")


def derive_channels(X: np.ndarray, names: list[str], units: list[str], t: np.ndarray | None = None
            ) -> tuple[list[np.ndarray], list[str], list[str]]:
    """Derived metrics where their inputs exist (paper's list plus the usual OS ratios, the
    per-core aggregates and the foreign load of :mod:`reveal_plugins.detect.evidence.foreign`)."""
    idx = {n: i for i, n in enumerate(names)}
    cols: list[np.ndarray] = []
    out_names: list[str] = []
    out_units: list[str] = []

    def add(name: str, col: np.ndarray, unit: str) -> None:
        if name in idx:
            return
        cols.append(np.asarray(col, dtype=np.float32))
        out_names.append(name)
        out_units.append(unit)

    def ratio(a: str, b: str, scale: float = 1.0) -> np.ndarray | None:
        if a in idx and b in idx:
            with np.errstate(divide="ignore", invalid="ignore"):
                den = X[:, idx[b]].astype(np.float64)
                r = scale * X[:, idx[a]] / np.where(den > 0, den, np.nan)
            return r
        return None

    # CPU busy / iowait / steal % from jiffy counters (all CPUs, and per core).
    prefixes = sorted({n.rsplit(".", 1)[0] for n in names
                       if n.startswith("cpu.") and n.rsplit(".", 1)[-1] == "idle"})
    for p in prefixes:
        parts = [f"{p}.{k}" for k in _CPU_TICKS if f"{p}.{k}" in idx]
        if f"{p}.idle" not in idx or len(parts) < 3:
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            tot = np.sum([X[:, idx[q]].astype(np.float64) for q in parts], axis=0)
            tot = np.where(tot > 0, tot, np.nan)
            idle = X[:, idx[f"{p}.idle"]] + (X[:, idx[f"{p}.iowait"]] if f"{p}.iowait" in idx
                                             else 0)
            add(f"{p}.busy_pct", 100.0 * (tot - idle) / tot, "%")
            if f"{p}.iowait" in idx:
                add(f"{p}.iowait_pct", 100.0 * X[:, idx[f"{p}.iowait"]] / tot, "%")
            if f"{p}.steal" in idx:
                add(f"{p}.steal_pct", 100.0 * X[:, idx[f"{p}.steal"]] / tot, "%")
    # Per-core series only as aggregates: the kernel moving a thread between cores swings
    # every per-core channel, and a max over 128 noisy cores would find a "symptom" 64x more
    # often than over 2 (the per-core columns are kept out of modelling and attribution).
    core = [c for c, n in zip(cols, out_names) if PER_CORE.match(n) and
            n.endswith(".busy_pct")]
    if len(core) >= 2:
        C = np.stack(core, axis=1).astype(np.float64)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # all-NaN rows stay NaN
            add("cpu.cores.busy_pct_max", np.nanmax(C, axis=1), "%")
            add("cpu.cores.busy_pct_spread", np.nanmax(C, axis=1) - np.nanmin(C, axis=1), "%")
    # Memory used %.
    for base in ("memory", "memory.run"):
        tot, av = f"{base}.MemTotal", f"{base}.MemAvailable"
        if tot in idx and av in idx:
            r = ratio(av, tot, 100.0)
            if r is not None:
                add(f"{base}.used_pct", 100.0 - r, "%")
    # perf counters: IPC, branch-miss %, cache-miss %, L3 stall ratio (per prefix).
    for n in names:
        if n.endswith(".instructions"):
            p = n[: -len(".instructions")]
            for new, a, b, s, u in (("ipc", "instructions", "cycles", 1.0, "instr/cycle"),
                                    ("branch_miss_pct", "branch_misses", "branches", 100.0, "%"),
                                    ("cache_miss_pct", "cache_misses", "cache_references", 100.0,
                                     "%"),
                                    ("l3_stall_ratio", "stalls_l3_miss", "cycles", 1.0, "ratio")):
                r = ratio(f"{p}.{a}", f"{p}.{b}", s)
                if r is not None:
                    add(f"{p}.{new}", r, u)
    # GPU power vs limit, clocks vs max.
    for n in names:
        m = _GPU_POWER.match(n)
        if m:
            for lim in ("power_limit", "power_limit_w", "enforced_power_limit"):
                r = ratio(n, f"{m.group(1)}.{lim}", 100.0)
                if r is not None:
                    add(f"{m.group(1)}.power_pct_of_limit", r, "%")
                    break
        m = _GPU_CLOCK.match(n)
        if m:
            for mx in ("clock_sm_max", "sm_clock_max", "max_clock_sm", "clocks_sm_max",
                       "clock_sm_max_mhz"):
                r = ratio(n, f"{m.group(1)}.{mx}", 100.0)
                if r is not None:
                    add(f"{m.group(1)}.sm_clock_pct_of_max", r, "%")
                    break
    # Network utilisation % where the link speed (Mb/s) is known.
    for n in names:
        m = _NET_BYTES.match(n)
        if m and f"{m.group(1)}.speed" in idx:
            sp = X[:, idx[f"{m.group(1)}.speed"]].astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore"):
                add(f"{m.group(1)}.{m.group(2)}_util_pct",
                    100.0 * X[:, idx[n]] * 8 / (np.where(sp > 0, sp, np.nan) * 1e6), "%")
    fc, fn, fu = foreign_derive(X, names, t)
    for c, n, u in zip(fc, fn, fu):
        add(n, c, u)
    return cols, out_names, out_units


#: Per-core channels (``cpu.core12.user``): modelled and attributed only through aggregates.
PER_CORE = re.compile(r"^cpu\.core\d+\.")


def add_derived(X: np.ndarray, names: list[str], units: list[str],
                t: np.ndarray | None = None) -> tuple[np.ndarray, list[str], list[str]]:
    cols, dn, du = derive_channels(X, names, units, t)
    if not cols:
        return X, names, units
    return (np.concatenate([X, np.stack(cols, axis=1).astype(np.float32)], axis=1),
            names + dn, units + du)


def informative(X: np.ndarray, cv_min: float = CV_MIN, chunk: int = 128
                ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Mask of channels worth modelling: not all-NaN, not always zero, CV >= ``cv_min``.

    Works on column chunks so the float64 temporaries stay small on long runs."""
    c = X.shape[1]
    any_finite = np.zeros(c, bool)
    nonzero = np.zeros(c, bool)
    cv = np.zeros(c)
    for a in range(0, c, chunk):
        b = min(c, a + chunk)
        Z = X[:, a:b].astype(np.float64)
        finite = np.isfinite(Z)
        any_finite[a:b] = finite.any(axis=0)
        Z[~finite] = 0.0
        cnt = np.maximum(finite.sum(axis=0), 1)
        mean = Z.sum(axis=0) / cnt
        Z -= mean
        Z[~finite] = 0.0
        std = np.sqrt((Z * Z).sum(axis=0) / cnt)
        Z += mean
        Z[~finite] = 0.0
        nonzero[a:b] = (np.abs(Z).max(axis=0) > 0) if len(Z) else False
        with np.errstate(divide="ignore", invalid="ignore"):
            cv[a:b] = np.where(np.abs(mean) > 0, std / np.abs(mean),
                               np.where(std > 0, np.inf, 0.0))
    reasons = {"all_nan": ~any_finite, "always_zero": any_finite & ~nonzero,
               "near_constant": any_finite & nonzero & (cv < cv_min)}
    keep = any_finite & nonzero & (cv >= cv_min)
    return keep, reasons


def prepare(t: np.ndarray, values: np.ndarray, metas: Sequence[ChannelMeta],
            interval_s: float | None = None, keep_channels: Sequence[str] | None = None,
            drop: bool = True) -> Prepared:
    """Rates, derived metrics and channel filtering for one run (raw samples in memory).

    ``keep_channels`` (from a baseline) pins the channel set instead of filtering by this run's
    own variability -- a channel stuck at a wrong constant is exactly what a baseline must see.
    """
    notes: list[str] = []
    t = np.asarray(t, dtype=np.float64)
    ok = np.isfinite(t)
    if not ok.all():
        notes.append(f"{int((~ok).sum())} sample(s) without a valid timestamp left out")
        t, values = t[ok], values[ok]
    if len(t) > 1:
        order = np.argsort(t, kind="stable")
        if (np.diff(order) != 1).any():
            t, values = t[order], values[order]
        dup = np.concatenate([[False], np.diff(t) <= 0])
        if dup.any():
            notes.append(f"{int(dup.sum())} sample(s) with a repeated timestamp left out "
                         "(clock stepped backwards or a segment was written twice)")
            t, values = t[~dup], values[~dup]
    iv = interval_s or median_interval(t)
    X, names, units, n2, gaps = to_rates(t, values, metas, iv)
    return finish(t, X, names, units, notes + n2, gaps, iv, keep_channels, drop)


def load_prepared(run_dir: str, metas: Sequence[ChannelMeta], interval_s: float | None = None,
                  keep_channels: Sequence[str] | None = None, drop: bool = False
                  ) -> tuple[Prepared, int, int, list[str]]:
    """Read a run's segments one at a time and turn them into rates as they come, so the raw
    float64 matrix of the whole run is never held in memory (1 h x 700 channels at 10 Hz:
    ~100 MB of float32 rates instead of ~700 MB peak through ``load_run``).

    Returns ``(prepared, segments read, bytes read, warnings)``; unreadable segments and
    leftover temporary files are skipped with a warning, as ``load_run`` does.
    """
    import os

    from ...store import store

    warnings: list[str] = []
    seg_dir = os.path.join(run_dir, store.SEGMENTS)
    if os.path.isdir(seg_dir):
        for n in sorted(os.listdir(seg_dir)):
            if n.endswith(".tmp"):
                warnings.append(f"{os.path.join(seg_dir, n)}: ignored unfinished segment "
                                "(the writer stopped before renaming it)")
    names = [m.name for m in metas]
    dnames = names
    # The last rows of the previous segment (raw): channels read less often than every tick
    # (1-Hz diskstats, meminfo, vmstat, snmp ...) hold NaN between reads and are interpolated
    # across the segment boundary from their reads on both sides (as store.load_run does);
    # without it their counters' rates would be NaN everywhere.
    slow = any(m.sample_every_s and m.sample_every_s > (interval_s or 0.1) * 1.5 for m in metas)
    carry_n = 0
    prev_t: np.ndarray | None = None
    prev_row: np.ndarray | None = None
    ts: list[np.ndarray] = []
    blocks: list[np.ndarray] = []
    notes: list[str] = []
    gaps: list[tuple[float, float]] = []
    nseg = nbytes = 0
    units = [m.unit for m in metas]
    iv = interval_s
    for path in store.segment_paths(run_dir):
        try:
            t, raw = store.read_segment(path, names)
        except Exception as e:  # corrupt or truncated file: keep going with the others
            warnings.append(f"{path}: skipped unreadable segment ({type(e).__name__}: {e})")
            continue
        nseg += 1
        nbytes += os.path.getsize(path)
        if len(t) == 0:
            continue
        ok = np.isfinite(t)
        if not ok.all():
            notes.append(f"{path}: {int((~ok).sum())} sample(s) without a valid timestamp "
                         "left out")
            t, raw = t[ok], raw[ok]
            if len(t) == 0:
                continue
        if iv is None and len(t) > 1:
            iv = median_interval(t)
        if prev_row is not None:
            tt = np.concatenate([prev_t, t])
            rr = np.vstack([prev_row, raw])
        else:
            tt, rr = t, raw
        if slow:
            filled = rr.copy()
            store.fill_slow_channels(tt, filled, list(metas), iv or 0.1, tail=False)
        else:
            filled = rr
        X, _, units, n2, g = to_rates(tt, filled, metas, iv or 1.0)
        notes += [x for x in n2 if "went backwards" in x]
        gaps += [x for x in g if prev_t is None or x[0] >= prev_t[-1]]
        if prev_row is not None:
            X = X[len(prev_row):]
        ts.append(t)
        blocks.append(X)
        # carry enough raw rows that every slow channel has a read before the boundary
        carry_n = max(1, int(np.ceil(2.5 * max((m.sample_every_s or 0) for m in metas)
                                     / (iv or 0.1)))) if slow else 1
        prev_t, prev_row = tt[-carry_n:].copy(), rr[-carry_n:].copy()
    if ts:
        t = np.concatenate(ts)
        # One allocation for rates + derived metrics (their inputs are known from the names).
        _, dn, du = derive_channels(np.zeros((1, len(names)), np.float32), names, units)
        X = np.empty((len(t), len(names) + len(dn)), np.float32)
        r = 0
        for blk in blocks:
            X[r:r + len(blk), :len(names)] = blk
            r += len(blk)
        del blocks, blk
        cols, dn, du = derive_channels(X[:, :len(names)], names, units, t)
        for j, col in enumerate(cols):
            X[:, len(names) + j] = col
        dnames, units = names + dn, units + du
    else:
        t, X = np.zeros(0), np.zeros((0, len(metas)), np.float32)
        dnames = names
    if gaps:
        notes.append(f"{len(gaps)} gap(s) in the samples (largest "
                     f"{max(b - a for a, b in gaps):.1f} s at t={max(gaps, key=lambda g: g[1] - g[0])[0]:.1f}):"
                     " lost segment, agent pause or clock jump; rates across a gap are left out")
    if len(t) > 1:
        back = np.diff(t) <= 0
        if back.any():
            order = np.argsort(t, kind="stable")
            t, X = t[order], X[order]
            dup = np.concatenate([[False], np.diff(t) <= 0])
            notes.append(f"the clock stepped backwards {int(back.sum())} time(s); samples "
                         f"re-ordered, {int(dup.sum())} repeated timestamp(s) left out")
            t, X = t[~dup], X[~dup]
    resets = [x for x in notes if "went backwards" in x]
    notes = [x for x in notes if "went backwards" not in x] + resets[:1]
    return (finish(t, X, dnames, units, notes, gaps[:5], iv or median_interval(t),
                   keep_channels, drop, derive=False), nseg, nbytes, warnings)


def finish(t: np.ndarray, X: np.ndarray, names: list[str], units: list[str], notes: list[str],
           gaps: list[tuple[float, float]], iv: float, keep_channels: Sequence[str] | None,
           drop: bool, derive: bool = True) -> Prepared:
    """Derived metrics and channel selection on per-second rates."""
    if derive:
        X, names, units = add_derived(X, names, units, t)
    dropped: dict[str, list[str]] = {}
    if keep_channels is not None:
        idx = {n: i for i, n in enumerate(names)}
        sel = [idx[n] for n in keep_channels if n in idx]
        missing = [n for n in keep_channels if n not in idx]
        if missing:
            notes.append(f"{len(missing)} baseline channel(s) absent from this run "
                         f"(e.g. {missing[0]})")
        X = X[:, sel]
        names = [names[i] for i in sel]
        units = [units[i] for i in sel]
    elif drop and len(t) > 1:
        keep, reasons = informative(X)
        for r, m in reasons.items():
            if m.any():
                dropped[r] = [names[i] for i in np.nonzero(m)[0]]
        sel = np.nonzero(keep)[0]
        X = X[:, sel]
        names = [names[i] for i in sel]
        units = [units[i] for i in sel]
    return Prepared(t, X, names, units, notes, dropped, iv, gaps)
