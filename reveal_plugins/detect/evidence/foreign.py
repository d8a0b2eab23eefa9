"""Foreign load: what the node does that the run does not.

The question Reveal asks is "is the *machine* misbehaving under this job?".  The most direct
evidence is the difference between the node's totals (procfs) and the run's own accounting
(its cgroup or process tree, ``*.run.*``): a process outside the run that takes a core, eats
memory, fills the page cache or hits the disk shows up there, and the run's own behaviour (a
phase change, an eval loop, the kernel migrating a thread between cores) does not, because it
moves the node's totals and the run's accounting alike.

Two parts:

- :func:`derive` (called with the other derived metrics, so batch and live mode both get them):
  sample-level channels ``cpu.foreign.{cores,user_cores,system_cores}``, ``memory.foreign.used``
  (bytes), ``memory.foreign.cache_growth`` (page-cache growth the run's own reads and writes
  cannot explain, bytes/s), ``storage.foreign.{read,write}_bytes`` (bytes/s), plus the node
  totals they need, ``storage.all.{read,write}_bytes``.
- :func:`family` (window level): each foreign channel's *bar* comes from the run's own normal
  windows -- its median plus ``z`` robust spreads -- and is never below a practical minimum
  (:data:`MINIMUM`: a quarter of a core, 128 MiB, 4 MiB/s; what a person would call "another
  process used something", not a value fitted to any benchmark).  A window whose foreign load
  is above the bar is evidence of its own (the "foreign load" family).  The bar also has an
  *absolute* part (:data:`ABSOLUTE`): a neighbour that ran from the job's first second for
  most of the run *is* the run's median, so the relative bar alone would call it normal;
  foreign load at or above an absolute level for :data:`SUSTAIN_WINDOWS` windows in a row is
  evidence whatever the run's median.

Writes reach the disk up to ~30 s after a process dirties the page cache (writeback), and the
node's disk counters see them then; so the run's writes are a debt the node's writes pay off
within :data:`WRITEBACK_S` seconds (:func:`_unmatched_writes`), and only the node's writes no
debt covers are foreign.  Memory counts as
foreign only when the node's available memory fell too (the run's RSS double-counts pages its
forked workers share; their exit would otherwise look like foreign memory appearing).
"""
from __future__ import annotations

import os
import re
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..batch.events import true_runs

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MiB = 1024.0 * 1024.0

#: Practical minimum of each foreign channel's bar (its unit: cores, bytes, bytes/s).
MINIMUM = {
    "cpu.foreign.cores": 0.25,
    "memory.foreign.used": 128 * _MiB,
    "memory.foreign.cache_growth": 16 * _MiB,
    "storage.foreign.read_bytes": 4 * _MiB,
    "storage.foreign.write_bytes": 4 * _MiB,
    "storage.foreign.dirtied_bytes": 16 * _MiB,
}
#: Absolute levels: sustained foreign load at or above these is a finding whatever the run's
#: own median (cores; bytes/s).  Calibrated on clean recordings of this VM (docs/detection.md:
#: foreign CPU outside other people's work stayed below 0.2 core; 0.5 core is half the core a
#: single-threaded job needs).  CPU scales with the node: per-CPU kernel work and monitoring
#: grow with the cores, so on large nodes the level is ``ABSOLUTE_CORE_SHARE`` of them.  No
#: absolute level for memory (MemTotal - MemAvailable holds the kernel's and the system
#: daemons' memory, which differs per node), page-cache growth (a job's own mmap reads fill
#: the cache without passing its read counters) or disk writes (writeback of pages dirtied
#: before the job or by it is charged to no process: the relative bar judges those).
ABSOLUTE = {
    "cpu.foreign.cores": 0.5,
    "storage.foreign.read_bytes": 16 * _MiB,
}
ABSOLUTE_CORE_SHARE = 0.02
#: Windows in a row (3-s windows every 1 s: ~10 s of load) at an absolute level before it
#: counts: short-lived system work (a login, a cron job, a package update's burst) is not a
#: neighbour that matters to the job.
SUSTAIN_WINDOWS = 8
#: In a run's start-up grace, foreign load counts only when held at this multiple of its
#: absolute level (a whole core here): work outside the job that belongs to its start
#: (the node agent starting, the tail of an install) is one process at a time and light,
#: while a neighbour that was on the node first is at full load from the first second.
GRACE_FACTOR = 2.0
#: Seconds between a process dirtying pages and the kernel writing them (dirty_expire 30 s,
#: the flusher wakes every 5 s, plus a 3-s window).
WRITEBACK_S = 40.0
#: The filesystem's journal and metadata written with a run's data (ext4/xfs: a few %).
WRITEBACK_OVERHEAD = 1.2

BUSY = ("user", "nice", "system", "irq", "softirq")


def _whole_disks(names: list[str], field: str) -> list[str]:
    """``storage.<dev>.<field>`` of whole disks: a partition (``sda1``, ``nvme0n1p2``) is left
    out when its disk is there, or its bytes would count twice."""
    devs = [n.split(".")[1] for n in names
            if n.startswith("storage.") and n.count(".") == 2 and n.endswith("." + field)]
    devs = [d for d in devs if d not in ("run", "foreign", "all", "psi", "node")]
    out = []
    for d in devs:
        parent = any(o != d and d.startswith(o) and d[len(o):].lstrip("p").isdigit()
                     for o in devs)
        if not parent:
            out.append(f"storage.{d}.{field}")
    return out


def _ffill_rate(col: np.ndarray, t: np.ndarray | None) -> np.ndarray:
    """Per-second change of a gauge sampled with NaN between reads (slow probes)."""
    out = np.full(len(col), np.nan)
    ok = np.nonzero(np.isfinite(col))[0]
    if len(ok) < 2:
        return out
    v = col[ok].astype(np.float64)
    tt = t[ok] if t is not None else ok.astype(np.float64)
    dt = np.diff(tt)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(dt > 0, np.diff(v) / dt, np.nan)
    # the rate holds from one read to the next
    for a, b, x in zip(ok[:-1], ok[1:], r):
        out[a + 1:b + 1] = x
    return out


def _over_intervals(x: np.ndarray, rate: np.ndarray, atol: float = 0.0) -> np.ndarray:
    """``x`` (a 10 Hz rate) averaged over each stretch of rows where ``rate`` (a slow probe's
    rate, one value from one read to the next) holds.  A node total read once a second less
    the run's own 10 Hz counters, row by row and clipped at zero, leaves a residue where a
    burst of the run's own ends inside a second (its writes at 300 MB/s for 0.4 s against the
    second's 120 MB/s mean): both sides must cover the same time.  Rows whose rates differ
    by less than 0.1 % or ``atol`` (the rounding of the values the rate came from) are one
    stretch: merging two seconds with the same rate changes nothing that matters."""
    r = np.asarray(rate, dtype=np.float64)
    same = np.zeros(len(r), dtype=bool)
    with np.errstate(invalid="ignore"):
        same[1:] = (np.abs(r[1:] - r[:-1]) <= 1e-3 * np.abs(r[1:]) + atol) | (
            np.isnan(r[1:]) & np.isnan(r[:-1]))
    seg = np.cumsum(~same) - 1
    if len(seg) == 0:
        return np.asarray(x, dtype=np.float64)
    xs = np.nan_to_num(np.asarray(x, dtype=np.float64))
    return (np.bincount(seg, weights=xs) / np.bincount(seg))[seg]


def derive(X: np.ndarray, names: list[str], t: np.ndarray | None = None
           ) -> tuple[list[np.ndarray], list[str], list[str]]:
    """Foreign-load channels where the node totals and the run's accounting both exist.

    ``X`` holds rates per second for counters (ticks/s, sectors/s, s/s, bytes/s) and gauges
    as read (kB for meminfo, bytes for the run's memory)."""
    idx = {n: i for i, n in enumerate(names)}
    cols: list[np.ndarray] = []
    out_n: list[str] = []
    out_u: list[str] = []

    def col(n: str) -> np.ndarray:
        return X[:, idx[n]].astype(np.float64)

    def add(n: str, c: np.ndarray, u: str) -> None:
        if n not in idx:
            cols.append(c.astype(np.float32))
            out_n.append(n)
            out_u.append(u)

    # node disk totals (also useful on their own: the node's I/O in one channel)
    sectors = {}
    for f, leaf in (("read_sectors", "read_bytes"), ("write_sectors", "write_bytes")):
        disks = _whole_disks(names, f)
        if disks:
            sectors[leaf] = np.nansum([col(d) for d in disks], axis=0) * 512.0
            add(f"storage.all.{leaf}", sectors[leaf], "bytes/s")
    if "cpu.run.usage" not in idx:
        return cols, out_n, out_u
    node_scoped = "storage.node.write_bytes" in idx
    busy = [f"cpu.all.{k}" for k in BUSY if f"cpu.all.{k}" in idx]
    if len(busy) >= 3:
        node = np.sum([col(b) for b in busy], axis=0) / _CLK_TCK
        add("cpu.foreign.cores", node - col("cpu.run.usage"), "cores")
        if "cpu.run.user" in idx and "cpu.all.user" in idx:
            u = (col("cpu.all.user") + (col("cpu.all.nice") if "cpu.all.nice" in idx else 0))
            add("cpu.foreign.user_cores", u / _CLK_TCK - col("cpu.run.user"), "cores")
        if "cpu.run.system" in idx and "cpu.all.system" in idx:
            s = col("cpu.all.system") + sum(col(f"cpu.all.{k}") for k in ("irq", "softirq")
                                            if f"cpu.all.{k}" in idx)
            add("cpu.foreign.system_cores", s / _CLK_TCK - col("cpu.run.system"), "cores")
    # the run's own memory without its page cache (which the node's MemAvailable counts as
    # available too): anonymous memory, else resident memory, else the cgroup's charge
    run_mem = next((n for n in ("memory.run.anon", "memory.run.rss", "memory.run.usage")
                    if n in idx), None)
    if node_scoped:
        # one node of a shared kernel: its own processes' I/O and memory, not the machine's
        # (probes/nodeprocs.py); the page cache is the machine's, so no cache growth
        for leaf in ("read_bytes", "write_bytes"):
            if f"storage.run.{leaf}" in idx:
                add(f"storage.foreign.{leaf}", col(f"storage.node.{leaf}")
                    - col(f"storage.run.{leaf}"), "bytes/s")
        if "memory.run.rss" in idx and "memory.node.rss" in idx:
            add("memory.foreign.used", _hold(col("memory.node.rss"))
                - _hold(col("memory.run.rss")), "bytes")
        return cols, out_n, out_u
    if run_mem and "memory.MemTotal" in idx and "memory.MemAvailable" in idx:
        used = (col("memory.MemTotal") - col("memory.MemAvailable")) * 1024.0
        # meminfo is read once a second (NaN between reads): hold the last reading
        used = _hold(used)
        add("memory.foreign.used", used - _hold(col(run_mem)), "bytes")
    # the page cache's growth (bytes/s), once: foreign cache growth and dirtied pages use it
    growth = (_ffill_rate(X[:, idx["memory.Cached"]], t) * 1024.0
              if "memory.Cached" in idx else None)
    if growth is not None and ("storage.run.rchar" in idx or "storage.run.read_bytes" in idx):
        own = np.zeros(len(X))
        for n in ("storage.run.rchar", "storage.run.wchar", "storage.run.read_bytes"):
            if n in idx:
                own = own + np.nan_to_num(col(n))
        # the rounding of the page-cache size (kB, float32 rows) spread over one row
        cached = X[:, idx["memory.Cached"]]
        top = np.nanmax(np.abs(cached)) if np.isfinite(cached).any() else 0.0
        dt = float(np.median(np.diff(t))) if t is not None and len(t) > 1 else 1.0
        growth_atol = 4.0 * float(np.spacing(np.float32(top))) * 1024.0 / max(dt, 1e-3)
        add("memory.foreign.cache_growth",
            np.maximum(growth - _over_intervals(own, growth, growth_atol), 0.0), "bytes/s")
    if "memory.vm.nr_dirtied" in idx and "storage.run.rchar" in idx \
            and "storage.run.write_bytes" in idx:
        # File pages dirtied on the node that neither the run's own writes nor the page
        # cache's growth account for: data rewritten in place, or written and deleted before
        # it reached the disk (a create/write/unlink storm), by someone else.  Only with
        # process-tree accounting: /proc/PID/io counts write_bytes when a page is dirtied,
        # as nr_dirtied does; a cgroup's io.stat counts at writeback instead.
        dirtied = col("memory.vm.nr_dirtied") * PAGE_BYTES
        kept = np.maximum(np.nan_to_num(growth), 0.0) if growth is not None else 0.0
        written = _over_intervals(col("storage.run.write_bytes"), dirtied)
        add("storage.foreign.dirtied_bytes", np.maximum(dirtied - written - kept, 0.0),
            "bytes/s")
    for leaf in ("read_bytes", "write_bytes"):
        if leaf in sectors and f"storage.run.{leaf}" in idx:
            add(f"storage.foreign.{leaf}", sectors[leaf] - col(f"storage.run.{leaf}"),
                "bytes/s")
    return cols, out_n, out_u


def _hold(c: np.ndarray) -> np.ndarray:
    """Forward-fill NaN (a slow probe's value holds until its next read)."""
    ok = np.isfinite(c)
    if ok.all() or not ok.any():
        return c
    idx = np.where(ok, np.arange(len(c)), 0)
    np.maximum.accumulate(idx, out=idx)
    out = c[idx]
    out[:np.argmax(ok)] = np.nan
    return out


@dataclass
class Foreign:
    """Window-level foreign-load evidence of one run."""

    names: list[str] = field(default_factory=list)   # foreign channels present
    cols: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))
    value: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))   # (m, k) adjusted
    center: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bar: np.ndarray = field(default_factory=lambda: np.zeros(0))
    level: np.ndarray = field(default_factory=lambda: np.zeros(0))   # absolute (inf: none)
    sustain: int = SUSTAIN_WINDOWS
    user: np.ndarray | None = None   # (m,) foreign user-mode cores, where known

    @property
    def relative(self) -> np.ndarray:
        """(m, k): how far above the run's normal level each window's foreign load is, in
        bars."""
        if not len(self.names):
            return np.zeros((len(self.value), 0))
        with np.errstate(invalid="ignore"):
            e = (self.value - self.center) / self.bar
        return np.nan_to_num(e, nan=0.0)

    @property
    def above_level(self) -> np.ndarray:
        """(m, k): windows at or above the absolute level, in runs of ``sustain`` or more."""
        if not len(self.names):
            return np.zeros((len(self.value), 0), bool)
        with np.errstate(invalid="ignore"):
            on = np.nan_to_num(self.value, nan=0.0) >= self.level
        return np.stack([_runs_of(on[:, j], self.sustain) for j in range(on.shape[1])], axis=1)

    @property
    def absolute(self) -> np.ndarray:
        """(m, k): the load in absolute levels where it is sustained there, else 0."""
        if not len(self.names):
            return np.zeros((len(self.value), 0))
        with np.errstate(invalid="ignore", divide="ignore"):
            a = np.nan_to_num(self.value / self.level, nan=0.0, posinf=0.0)
        return np.where(self.above_level, a, 0.0)

    def held(self, factor: float = 1.0) -> np.ndarray:
        """(m,): windows where some channel is sustained at ``factor`` times its absolute
        level (``sustain`` windows in a row or more)."""
        if not len(self.names):
            return np.zeros(len(self.value), bool)
        with np.errstate(invalid="ignore"):
            on = np.nan_to_num(self.value, nan=0.0) >= factor * self.level
        return np.stack([_runs_of(on[:, j], self.sustain) for j in range(on.shape[1])],
                        axis=1).any(axis=1)

    @property
    def excess(self) -> np.ndarray:
        """(m, k): the larger of the relative and the sustained absolute excess (>= 1: above
        the bar)."""
        return np.maximum(self.relative, self.absolute)

    @property
    def flag(self) -> np.ndarray:
        return (self.excess >= 1.0).any(axis=1) if len(self.names) else \
            np.zeros(len(self.value), bool)

    def share(self, rows: np.ndarray) -> dict[str, float]:
        """Per channel: the fraction of ``rows`` (an event's windows) above its bar; under
        :data:`SPECIFIC`, where any memory or storage channel is; under :data:`ACTIVE`,
        where any :data:`ACTIVITY` channel is; under :data:`CPU_USER`, where the foreign CPU
        is above its bar and at least half of it in user mode."""
        if not len(self.names) or not len(rows):
            return {}
        above = self.excess[rows] >= 1.0
        out = {n: float(v) for n, v in zip(self.names, above.mean(axis=0))}

        def any_of(cols: list[int]) -> float:
            return float(above[:, cols].any(axis=1).mean()) if cols else 0.0

        out[SPECIFIC] = any_of([j for j, n in enumerate(self.names) if SUBSYSTEM[n] != "cpu"])
        out[ACTIVE] = any_of([j for j, n in enumerate(self.names) if n in ACTIVITY])
        if "cpu.foreign.cores" in self.names:
            j = self.names.index("cpu.foreign.cores")
            on = above[:, j]
            if self.user is not None:
                with np.errstate(invalid="ignore"):
                    on = on & ~(self.user[rows] < 0.5 * self.value[rows, j])
            out[CPU_USER] = float(on.mean())
        return out

    def support(self, rows: np.ndarray) -> list[dict]:
        """Foreign channels above their bar over ``rows`` (an event's windows), strongest
        first: ``{"channel", "observed", "baseline", "bar", "excess"}`` in the channel's unit."""
        if not len(self.names) or not len(rows):
            return []
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            obs = np.nanmean(self.value[rows], axis=0)
        # the absolute level speaks where the load was sustained there for most of the span
        held = self.above_level[rows].mean(axis=0) >= 0.5
        out = []
        for j, n in enumerate(self.names):
            rel = (obs[j] - self.center[j]) / self.bar[j]
            ab = obs[j] / self.level[j] if held[j] and np.isfinite(self.level[j]) else 0.0
            ex = max(rel, ab) if np.isfinite(rel) else ab
            if np.isfinite(ex) and ex >= 1.0:
                d = {"channel": n, "observed": float(obs[j]),
                     "baseline": float(self.center[j]), "bar": float(self.bar[j]),
                     "excess": round(float(ex), 2)}
                if np.isfinite(self.level[j]):
                    d["level"] = float(self.level[j])
                if ab >= 1.0:
                    d["sustained"] = True  # held at the level clean runs stay below
                if ab > rel:
                    d["absolute"] = True   # ... and that, not the run's median, decided
                out.append(d)
        out.sort(key=lambda d: -d["excess"])
        return out


def _runs_of(on: np.ndarray, k: int) -> np.ndarray:
    """``on`` where it holds for at least ``k`` consecutive entries."""
    out = np.zeros(len(on), bool)
    for i, j in true_runs(on):
        if j - i >= k:
            out[i:j] = True
    return out


def node_cores(means: np.ndarray, names: list[str]) -> float | None:
    """CPUs of the node: all its jiffies per second / USER_HZ (median over windows)."""
    cols = [names.index(f"cpu.all.{k}") for k in BUSY + ("idle", "iowait", "steal")
            if f"cpu.all.{k}" in names]
    if len(cols) < 3:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        c = float(np.nanmedian(np.nansum(means[:, cols].astype(np.float64), axis=1)))
    return c / _CLK_TCK if np.isfinite(c) and c > 0 else None


def levels(present: list[str], cores: float | None) -> np.ndarray:
    """Absolute level of each foreign channel (inf where it has none)."""
    out = np.array([ABSOLUTE.get(n, np.inf) for n in present], np.float64)
    if cores and "cpu.foreign.cores" in present:
        j = present.index("cpu.foreign.cores")
        out[j] = max(out[j], ABSOLUTE_CORE_SHARE * round(cores))
    return out


def family(means: np.ndarray, names: list[str], ref: np.ndarray, start: np.ndarray,
           z: float = 4.0, sustain: int = SUSTAIN_WINDOWS) -> Foreign:
    """Foreign-load bars from the ``ref`` (normal) windows and every window's adjusted value.

    ``means``: (m, c) window means of the prepared channels; ``start``: window start times;
    ``sustain``: windows in a row at an absolute level before it counts."""
    idx = {n: i for i, n in enumerate(names)}
    present = [n for n in MINIMUM if n in idx]
    if not present or ref.sum() < 3:
        return Foreign(value=np.zeros((len(means), 0)))
    V = np.stack([means[:, idx[n]].astype(np.float64) for n in present], axis=1)
    for j, n in enumerate(present):
        if n == "storage.foreign.write_bytes" and "storage.run.write_bytes" in idx \
                and "storage.all.write_bytes" in idx and "storage.node.write_bytes" not in idx:
            V[:, j] = _unmatched_writes(means[:, idx["storage.all.write_bytes"]],
                                        means[:, idx["storage.run.write_bytes"]], start)
        if n == "memory.foreign.used" and "memory.MemAvailable" in idx:
            # foreign memory only where the node's available memory fell by as much
            avail = means[:, idx["memory.MemAvailable"]].astype(np.float64) * 1024.0
            drop = np.nanmedian(avail[ref]) - avail
            V[:, j] = np.minimum(V[:, j], np.nanmedian(V[ref, j]) + np.maximum(drop, 0.0))
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        center = np.nanmedian(V[ref], axis=0)
        mad = np.nanmedian(np.abs(V[ref] - center), axis=0) * 1.4826
    center = np.nan_to_num(center)
    mins = np.array([MINIMUM[n] for n in present])
    bar = np.maximum(z * np.nan_to_num(mad), mins)
    user = (means[:, idx["cpu.foreign.user_cores"]].astype(np.float64)
            if "cpu.foreign.user_cores" in idx else None)
    return Foreign(present, np.array([idx[n] for n in present], np.intp), V, center, bar,
                   levels(present, node_cores(means, names)), sustain, user)


def _unmatched_writes(node: np.ndarray, run: np.ndarray, start: np.ndarray,
                      horizon: float = WRITEBACK_S, overhead: float = WRITEBACK_OVERHEAD
                      ) -> np.ndarray:
    """The node's disk writes (bytes/s per window) that the run's own recent writes do not
    account for.

    A process's ``write_bytes`` is counted when it dirties pages; the disk sees them when the
    kernel writes them back, up to ``horizon`` seconds later, at its own pace (a 500 MB
    checkpoint dirtied in a second may reach the disk 30 s later at 200 MB/s, or while an
    fsync waits).  So the run's writes are a debt the node's writes pay off, oldest first,
    within ``horizon``; only what no debt covers is foreign.  ``overhead`` allows for the
    journal and metadata the filesystem writes with the data.  Windows are taken as equal
    steps (their means are rates over equal strides)."""
    n = np.nan_to_num(node.astype(np.float64))
    r = np.maximum(np.nan_to_num(run.astype(np.float64)), 0.0) * overhead
    out = np.empty(len(n))
    debt: deque[list[float]] = deque()      # [window start, bytes not yet seen on the disk]
    for i in range(len(n)):
        if r[i] > 0:
            debt.append([float(start[i]), float(r[i])])
        while debt and debt[0][0] < start[i] - horizon:
            debt.popleft()                 # never written (deleted, overwritten) or too old
        want = n[i]
        while want > 0 and debt:
            take = min(want, debt[0][1])
            want -= take
            debt[0][1] -= take
            if debt[0][1] <= 0:
                debt.popleft()
        out[i] = want
    return out


#: How a foreign channel speaks for a subsystem.
SUBSYSTEM = {"cpu.foreign.cores": "cpu", "memory.foreign.used": "memory",
             "memory.foreign.cache_growth": "memory", "storage.foreign.read_bytes": "storage",
             "storage.foreign.write_bytes": "storage", "storage.foreign.dirtied_bytes": "storage"}
#: Foreign channels only the neighbour's own work *now* moves: no CPU hog fills the page
#: cache for long or dirties file pages, and no earlier writer's writeback shows there.  Disk
#: bytes are not among them (the writeback of an install, a CPU hog's binary read cold), nor
#: memory held (any process holds some; a CPU hog with a large array holds much).
ACTIVITY = ("memory.foreign.cache_growth", "storage.foreign.dirtied_bytes")


#: Symptoms of a busy device, not of anyone waiting for it: the queue time a neighbour's own
#: writes (or the writeback of an earlier install) build up says what its foreign bytes
#: already say; whether a task stalled is what I/O pressure, blocked tasks and iowait say.
_DEVICE_BUSY = re.compile(r"^storage\.[^.]+\.(weighted_io_ms|read_ms|write_ms|flush_ms|"
                          r"in_flight)$")


#: Keys of :meth:`Foreign.share`: any memory or storage channel above its bar; any
#: :data:`ACTIVITY` channel; the foreign CPU above its bar and mostly in user mode.
SPECIFIC = "memory+storage"
ACTIVE = "activity"
CPU_USER = "cpu.user"


def subsystem(support: list[dict], share: dict[str, float],
              symptoms: Sequence[str] = ()) -> str | None:
    """The subsystem a foreign-load finding belongs to (None without support).

    By the share of the span each family carries (``share``: :meth:`Foreign.share`), not by
    a fixed precedence.  CPU is the carrier of almost every neighbour (a process that fills
    memory or writes a disk also burns CPU), so memory or storage names the finding when,
    together, they stood out for at least half as long as the foreign CPU did in user mode:
    a neighbour's kernel time is spent on its file, memory or network work (reading a file
    from the page cache, a create/unlink storm), and speaks for that work, not for the CPU.

    Which memory and storage channels may speak: all of a family's when its own symptoms
    moved (``symptoms``: the symptom channels that fired; a busy device alone is not a
    stall) or the CPU's did not; otherwise only :data:`ACTIVITY` channels.  A CPU hog that
    read its binary from a cold cache, ran while the page cache of an earlier install was
    written back, or holds a large array is a CPU neighbour: disk bytes and memory held do
    not outweigh its CPU pressure, while filling the page cache or dirtying file pages is
    what only a memory or file neighbour does.  Between memory and storage, the larger
    excess of their speaking channels wins.  The one rule of the job-end analysis and the
    live analyzer.  (The peer comparison keeps its own, ``peers.nodes._persistent_foreign``:
    its symptoms are the node against its peers, and nodes that share a disk share its stall
    symptoms, so the storage family could never speak there by this rule.)"""
    from .attribution import subsystem_of

    if not support:
        return None

    def strongest(sup: list[dict]) -> str:
        weight: dict[str, float] = {}
        for s in sup:
            k = SUBSYSTEM[s["channel"]]
            weight[k] = max(weight.get(k, 0.0), float(s["excess"]))
        return max(weight, key=weight.get)

    if all(SUBSYSTEM[s["channel"]] != "cpu" for s in support):
        return strongest(support)
    symptoms = {subsystem_of(n) for n in symptoms if not _DEVICE_BUSY.match(n)}
    full = {SUBSYSTEM[s["channel"]] for s in support if SUBSYSTEM[s["channel"]] != "cpu"
            and (SUBSYSTEM[s["channel"]] in symptoms or "cpu" not in symptoms)}
    speak = [s for s in support if SUBSYSTEM[s["channel"]] != "cpu"
             and (SUBSYSTEM[s["channel"]] in full or s["channel"] in ACTIVITY)]
    if not speak:
        return "cpu"
    cpu = share.get(CPU_USER, share.get("cpu.foreign.cores", 0.0))
    if share.get(SPECIFIC if full else ACTIVE, 0.0) >= 0.5 * cpu:
        return strongest(speak)
    return "cpu"
