"""Readable views of a run's telemetry for the reports: CPU busy %, memory used, GPU
utilization, disk and network throughput, stall shares, and any evidence channel as a rate.

Used by the text report (utilization bars) and the HTML report (timelines).  Everything here is
derived from the run directory alone; nothing depends on the analysis.  The channel names are
the probes' (``cpu.all.user`` ticks, ``cpu.psi.some_total`` µs, ``memory.MemAvailable`` kB,
``storage.sda.read_sectors``, ``network.eth0.rx_bytes``, ``gpu.0.util_sm`` ...); a channel that
is missing simply yields no view.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..types import ChannelMeta, Frame
from .fmt import display_scale

CPU_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
IDLE_STATES = ("idle", "iowait")
USER_HZ = 100.0
SECTOR = 512.0
GPU_RE = re.compile(r"^gpu\.(\d+)\.(.+)$")
# GPU field names, first match wins (the NVML probe's names, then common alternatives).
GPU_UTIL = ("util_sm", "util_gpu", "utilization", "util")
GPU_MEM_USED = ("mem_used", "memory_used", "fb_used")
GPU_MEM_TOTAL = ("mem_total", "memory_total", "fb_total")
GPU_POWER = ("power", "power_w", "power_usage")
GPU_TEMP = ("temp", "temperature", "temp_c")
NET_SKIP = ("lo",)


@dataclass
class Series:
    """One line to show: ``y`` against unix time ``t`` (same length), with a label and unit."""

    key: str
    label: str
    unit: str
    subsystem: str
    t: np.ndarray
    y: np.ndarray
    sources: tuple[str, ...] = ()

    def stats(self) -> tuple[float, float, float]:
        """(mean, p95, max) over the finite samples; NaNs when there are none."""
        y = self.y[np.isfinite(self.y)]
        if not len(y):
            return (float("nan"),) * 3
        return float(y.mean()), float(np.percentile(y, 95)), float(y.max())


def rate(t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per-second rate of a cumulative counter (first sample and counter resets -> NaN)."""
    out = np.full(len(v), np.nan)
    if len(v) < 2:
        return out
    dt = np.diff(t)
    dv = np.diff(v)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = dv / dt
    r[(dt <= 0) | (dv < 0)] = np.nan
    out[1:] = r
    return out


def _col(frame: Frame, names: dict[str, int], name: str) -> np.ndarray | None:
    j = names.get(name)
    return None if j is None else frame.values[:, j]


def _first(frame: Frame, names: dict[str, int], prefix: str, fields: Iterable[str]):
    for f in fields:
        c = _col(frame, names, prefix + f)
        if c is not None:
            return c, f
    return None, None


def cpu_busy(frame: Frame, who: str = "all") -> np.ndarray | None:
    """Share of CPU time not idle (0-100 %) from ``cpu.<who>.*`` tick counters."""
    names = {n: i for i, n in enumerate(frame.names)}
    cols = {s: _col(frame, names, f"cpu.{who}.{s}") for s in CPU_STATES}
    if cols["idle"] is None or cols["user"] is None:
        return None
    total = sum(np.diff(c) for c in cols.values() if c is not None)
    idle = sum(np.diff(cols[s]) for s in IDLE_STATES if cols[s] is not None)
    out = np.full(len(frame.t), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        busy = 100.0 * (total - idle) / total
    busy[~(total > 0)] = np.nan
    out[1:] = np.clip(busy, 0, 100)
    return out


def n_cores(frame: Frame) -> int:
    return len({n.split(".")[1] for n in frame.names
                if n.startswith("cpu.core") and n.count(".") == 2})


def gpu_indices(names: Iterable[str]) -> list[int]:
    return sorted({int(m.group(1)) for m in map(GPU_RE.match, names) if m})


def _kb_to_gib(x: np.ndarray, unit: str) -> np.ndarray:
    u = unit.lower()
    scale = {"kb": 1024.0, "kib": 1024.0, "b": 1.0, "bytes": 1.0, "mb": 1024.0 ** 2,
             "mib": 1024.0 ** 2}.get(u, 1024.0)
    return x * scale / 1024.0 ** 3


def _to_gib(x: np.ndarray, unit: str) -> np.ndarray:
    u = unit.lower()
    scale = {"b": 1.0, "bytes": 1.0, "kb": 1024.0, "kib": 1024.0, "mb": 1024.0 ** 2,
             "mib": 1024.0 ** 2, "gb": 1024.0 ** 3, "gib": 1024.0 ** 3}.get(u, 1.0)
    return x * scale / 1024.0 ** 3


def whole_disks(names: Iterable[str]) -> list[str]:
    """Block devices with a ``read_sectors`` channel, partitions left out (they would count the
    same bytes twice: ``sda1`` is inside ``sda``, ``nvme0n1p1`` inside ``nvme0n1``)."""
    devs = sorted({n.split(".")[1] for n in names
                   if n.startswith("storage.") and n.endswith(".read_sectors")})
    return [d for d in devs if not any(o != d and d.startswith(o) for o in devs)]


def interfaces(names: Iterable[str]) -> list[str]:
    devs = sorted({n.split(".")[1] for n in names
                   if n.startswith("network.") and n.endswith(".rx_bytes")})
    return [d for d in devs if d not in NET_SKIP]


def wanted_channels(names: list[str]) -> list[str]:
    """The channels :func:`key_series` and :func:`utilization` read (load only these)."""
    want = [n for n in names if n.startswith("cpu.all.") or n.startswith("cpu.psi.")
            or n.startswith("memory.psi.") or n.startswith("storage.psi.")
            or n in ("memory.MemTotal", "memory.MemAvailable", "cpu.procs_running",
                     "memory.vm.pgmajfault", "memory.vm.pswpin", "memory.vm.pswpout",
                     "network.tcp.RetransSegs", "storage.procs_blocked")]
    disks = set(whole_disks(names))
    ifs = set(interfaces(names))
    for n in names:
        parts = n.split(".")
        if len(parts) == 3 and parts[0] == "storage" and parts[1] in disks and parts[2] in (
                "read_sectors", "write_sectors", "io_ms"):
            want.append(n)
        elif len(parts) == 3 and parts[0] == "network" and parts[1] in ifs and parts[2] in (
                "rx_bytes", "tx_bytes"):
            want.append(n)
        elif n.startswith("gpu."):
            want.append(n)
        elif n.startswith("cpu.core") and n.endswith((".idle", ".user")):
            want.append(n)  # only to count cores
    return sorted(set(want))


def key_series(frame: Frame) -> list[Series]:
    """The few lines per subsystem that tell a person how the machine was doing, in the order
    cpu, memory, storage, network, gpu."""
    t = frame.t
    names = {n: i for i, n in enumerate(frame.names)}
    units = {c.name: c.unit for c in frame.channels}
    out: list[Series] = []

    def add(key, label, unit, sub, y, sources=()):
        if y is not None and np.isfinite(y).any():
            out.append(Series(key, label, unit, sub, t, y, tuple(sources)))

    add("cpu.busy", "CPU busy (all cores)", "%", "cpu", cpu_busy(frame),
        [n for n in names if n.startswith("cpu.all.")])
    psi = _col(frame, names, "cpu.psi.some_total")
    add("cpu.psi", "CPU pressure: time some task waited for a CPU", "%", "cpu",
        None if psi is None else rate(t, psi) / 1e4, ["cpu.psi.some_total"])
    add("cpu.runq", "runnable tasks", "tasks", "cpu", _col(frame, names, "cpu.procs_running"),
        ["cpu.procs_running"])

    tot, avail = _col(frame, names, "memory.MemTotal"), _col(frame, names, "memory.MemAvailable")
    if tot is not None and avail is not None:
        add("memory.used", "memory in use (total − available)", "GiB", "memory",
            _kb_to_gib(tot - avail, units.get("memory.MemTotal", "kB")),
            ["memory.MemAvailable", "memory.MemTotal"])
    for kind in ("some", "full"):
        c = _col(frame, names, f"memory.psi.{kind}_total")
        if c is not None:
            add(f"memory.psi.{kind}", f"memory pressure ({kind}): time stalled on memory", "%",
                "memory", rate(t, c) / 1e4, [f"memory.psi.{kind}_total"])
            break
    maj = _col(frame, names, "memory.vm.pgmajfault")
    add("memory.majfault", "major page faults", "/s", "memory",
        None if maj is None else rate(t, maj), ["memory.vm.pgmajfault"])

    disks = whole_disks(names)
    if disks:
        rd = sum(rate(t, frame.values[:, names[f"storage.{d}.read_sectors"]]) for d in disks)
        wr = sum(rate(t, frame.values[:, names[f"storage.{d}.write_sectors"]]) for d in disks
                 if f"storage.{d}.write_sectors" in names)
        add("storage.read", "disk read (" + ", ".join(disks) + ")", "MB/s", "storage",
            rd * SECTOR / 1e6, [f"storage.{d}.read_sectors" for d in disks])
        if not isinstance(wr, int):
            add("storage.write", "disk write (" + ", ".join(disks) + ")", "MB/s", "storage",
                wr * SECTOR / 1e6, [f"storage.{d}.write_sectors" for d in disks])
    io = _col(frame, names, "storage.psi.some_total")
    add("storage.psi", "I/O pressure: time some task waited for I/O", "%", "storage",
        None if io is None else rate(t, io) / 1e4, ["storage.psi.some_total"])

    ifs = interfaces(names)
    if ifs:
        for d, label in (("rx", "received"), ("tx", "sent")):
            cols = [f"network.{i}.{d}_bytes" for i in ifs if f"network.{i}.{d}_bytes" in names]
            if cols:
                y = sum(rate(t, frame.values[:, names[c]]) for c in cols)
                add(f"network.{d}", f"network {label} ({', '.join(ifs)})", "MB/s", "network",
                    y / 1e6, cols)
    rs = _col(frame, names, "network.tcp.RetransSegs")
    add("network.retrans", "TCP retransmitted segments", "/s", "network",
        None if rs is None else rate(t, rs), ["network.tcp.RetransSegs"])

    for g in gpu_indices(names):
        p = f"gpu.{g}."
        for key, label, unit, fields in (("util", f"GPU{g} utilization (SM busy)", "%", GPU_UTIL),
                                         ("mem", f"GPU{g} memory used", "GiB", GPU_MEM_USED),
                                         ("power", f"GPU{g} power", "W", GPU_POWER),
                                         ("temp", f"GPU{g} temperature", "°C", GPU_TEMP),
                                         ("clock", f"GPU{g} SM clock (throttling shows here)",
                                          "MHz", ("clock_sm",))):
            y, f = _first(frame, names, p, fields)
            if y is not None and key == "mem":
                y = _to_gib(y, units.get(p + f, "B"))
            add(f"gpu.{g}.{key}", label, unit, "gpu", y, [p + f] if f else [])
    return out


def channel_series(frame: Frame, name: str) -> Series | None:
    """One raw channel as shown to a person: counters as per-second rates."""
    try:
        j = frame.names.index(name)
    except ValueError:
        return None
    c: ChannelMeta = frame.channels[j]
    y = frame.values[:, j]
    unit = c.unit
    if c.kind == "counter":
        y = rate(frame.t, y)
    scale, unit = display_scale(name, {name: {"unit": c.unit, "kind": c.kind}})
    y = y * scale
    if not np.isfinite(y).any():
        return None
    return Series(name, name, unit, c.subsystem, frame.t, y)


def utilization(frame: Frame) -> dict:
    """Summary figures for the utilization bars: CPU busy %, memory, per-GPU figures.

    Returns ``{"cpu": {"mean", "p95", "cores", "runq"} | None, "memory": {"used_mean",
    "used_max", "total"} | None, "gpus": [{"index", "util_mean", "util_p95", "mem_used",
    "mem_total", "power", "temp"}]}`` (GiB, W, °C; missing figures are None).
    """
    names = {n: i for i, n in enumerate(frame.names)}
    units = {c.name: c.unit for c in frame.channels}
    out: dict = {"cpu": None, "memory": None, "gpus": []}
    if len(frame.t) == 0:
        return out

    def fin(x):
        return float(x) if x is not None and np.isfinite(x) else None

    busy = cpu_busy(frame)
    if busy is not None and np.isfinite(busy).any():
        b = busy[np.isfinite(busy)]
        rq = _col(frame, names, "cpu.procs_running")
        out["cpu"] = {"mean": float(b.mean()), "p95": float(np.percentile(b, 95)),
                      "cores": n_cores(frame) or None,
                      "runq": fin(np.nanmean(rq)) if rq is not None and np.isfinite(rq).any()
                      else None}
    tot, avail = _col(frame, names, "memory.MemTotal"), _col(frame, names, "memory.MemAvailable")
    if tot is not None and avail is not None and np.isfinite(tot - avail).any():
        u = units.get("memory.MemTotal", "kB")
        used = _kb_to_gib(tot - avail, u)
        out["memory"] = {"used_mean": float(np.nanmean(used)), "used_max": float(np.nanmax(used)),
                         "total": float(np.nanmax(_kb_to_gib(tot, u)))}
    for g in gpu_indices(names):
        p = f"gpu.{g}."
        d: dict = {"index": g, "util_mean": None, "util_p95": None, "mem_used": None,
                   "mem_total": None, "power": None, "temp": None}
        u, _ = _first(frame, names, p, GPU_UTIL)
        if u is not None and np.isfinite(u).any():
            f = u[np.isfinite(u)]
            d["util_mean"], d["util_p95"] = float(f.mean()), float(np.percentile(f, 95))
        mu, fu = _first(frame, names, p, GPU_MEM_USED)
        if mu is not None and np.isfinite(mu).any():
            d["mem_used"] = float(np.nanmax(_to_gib(mu, units.get(p + fu, "B"))))
        mt, ft = _first(frame, names, p, GPU_MEM_TOTAL)
        if mt is not None and np.isfinite(mt).any():
            d["mem_total"] = float(np.nanmax(_to_gib(mt, units.get(p + ft, "B"))))
        for key, fields in (("power", GPU_POWER), ("temp", GPU_TEMP)):
            c, _ = _first(frame, names, p, fields)
            if c is not None and np.isfinite(c).any():
                d[key] = float(np.nanmean(c))
        out["gpus"].append(d)
    return out


def iteration_times(events: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(t, dt) of the training iteration markers (``iteration`` events), all ranks, by time."""
    pts = [(float(e["t"]), float(e["dt"])) for e in events
           if e.get("event") == "iteration" and isinstance(e.get("dt"), (int, float))]
    if not pts:
        return np.zeros(0), np.zeros(0)
    a = np.array(sorted(pts))
    return a[:, 0], a[:, 1]


def iteration_impact(events: list[dict], start: float, end: float) -> dict | None:
    """Median iteration time inside [start, end] against outside it, from iteration markers.

    Returns ``{"metric": "iteration_time", "unit": "s", "baseline", "observed", "ratio",
    "iterations"}`` or None when there are too few markers on either side.
    """
    t, dt = iteration_times(events)
    if len(t) < 4:
        return None
    inside = (t >= start) & (t <= end)
    if inside.sum() < 2 or (~inside).sum() < 2:
        return None
    base, obs = float(np.median(dt[~inside])), float(np.median(dt[inside]))
    if base <= 0:
        return None
    return {"metric": "iteration_time", "unit": "s", "baseline": base, "observed": obs,
            "ratio": obs / base, "iterations": int(inside.sum())}
