"""perf_event counters through ``perf_event_open(2)`` (ctypes; no ``perf`` binary needed).

Two probes, so that ``reveal probes`` shows plainly what this machine can count:

- ``perf`` — hardware counters (cycles, instructions, cache references/misses, branches/misses,
  and on Intel the L3-miss stall cycles).  Many VMs (this CI VM included) answer ENOENT or
  EOPNOTSUPP for every hardware event: the probe is then unavailable and says so.
- ``perf_sw`` — kernel software events (task-clock, context switches, CPU migrations, page
  faults, major faults), which work everywhere perf_event exists: the fallback.

Scope: system-wide (one fd per event per CPU, summed) when the agent may do that — root, or
``kernel.perf_event_paranoid`` ≤ 0.  Otherwise the host probes are unavailable with that reason,
and :func:`perf_run_probes` returns per-process probes (``pids`` given: counters attached to each
run PID with ``inherit`` so threads/children started afterwards are counted; user space only
when paranoid ≥ 2).  Channels are cumulative counters: ``cpu.perf.<event>`` host-wide,
``cpu.run.perf.<event>`` per run.  Values are scaled by time_enabled/time_running when the PMU
multiplexes.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from typing import Sequence

from ..types import ChannelMeta
from .probe import NAN, Probe

# perf_event_attr.type
TYPE_HARDWARE, TYPE_SOFTWARE, TYPE_RAW = 0, 1, 4
# read_format: value, time_enabled, time_running
_READ_FORMAT = 1 | 2
_FORMAT_GROUP = 8
_FLAG_DISABLED, _FLAG_INHERIT = 1 << 0, 1 << 1
_FLAG_EXCLUDE_KERNEL, _FLAG_EXCLUDE_HV = 1 << 5, 1 << 6
_PERF_FLAG_FD_CLOEXEC = 1 << 3
_IOC_ENABLE = 0x2400
_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7; older kernels accept it as long as the tail is zero
_SYSCALL = {"x86_64": 298, "amd64": 298, "aarch64": 241, "arm64": 241, "ppc64le": 319,
            "riscv64": 241}

#: (channel suffix, type, config, unit, description)
HARDWARE_EVENTS = [
    ("cycles", TYPE_HARDWARE, 0, "cycles", "CPU cycles (PERF_COUNT_HW_CPU_CYCLES)"),
    ("instructions", TYPE_HARDWARE, 1, "instructions", "retired instructions"),
    ("cache_references", TYPE_HARDWARE, 2, "references", "last-level cache references"),
    ("cache_misses", TYPE_HARDWARE, 3, "misses", "last-level cache misses"),
    ("branches", TYPE_HARDWARE, 4, "branches", "retired branch instructions"),
    ("branch_misses", TYPE_HARDWARE, 5, "misses", "mispredicted branches"),
]
# Intel Skylake+ CYCLE_ACTIVITY.STALLS_L3_MISS (event 0xA3, umask 0x06, cmask 6); optional.
STALLS_L3_MISS = ("stalls_l3_miss", TYPE_RAW, 0x06A3 | (6 << 24), "cycles",
                  "cycles stalled while an L3 miss is outstanding (Intel)")
SOFTWARE_EVENTS = [
    ("task_clock", TYPE_SOFTWARE, 1, "ns", "CPU time spent on tasks (PERF_COUNT_SW_TASK_CLOCK)"),
    ("context_switches", TYPE_SOFTWARE, 3, "switches", "context switches"),
    ("cpu_migrations", TYPE_SOFTWARE, 4, "migrations", "task migrations between CPUs"),
    ("page_faults", TYPE_SOFTWARE, 2, "faults", "page faults"),
    ("major_faults", TYPE_SOFTWARE, 6, "faults", "major page faults (needed I/O)"),
]

_libc = None


def _perf_event_open(type_: int, config: int, pid: int, cpu: int, flags: int,
                     group_fd: int = -1, read_format: int = _READ_FORMAT) -> int:
    """Open one counting event; returns the fd or raises OSError with the kernel's errno."""
    global _libc
    nr = _SYSCALL.get(platform.machine().lower())
    if nr is None:
        raise OSError(errno.ENOSYS, f"perf_event_open: unknown syscall number on "
                                    f"{platform.machine()}")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    buf = bytearray(_ATTR_SIZE)
    struct.pack_into("<IIQQQQQ", buf, 0, type_, _ATTR_SIZE, config, 0, 0, read_format,
                     flags)
    attr = ctypes.create_string_buffer(bytes(buf), _ATTR_SIZE)
    fd = _libc.syscall(ctypes.c_long(nr), attr, ctypes.c_int(pid), ctypes.c_int(cpu),
                       ctypes.c_int(group_fd), ctypes.c_ulong(_PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return fd


def paranoid_level(path: str = "/proc/sys/kernel/perf_event_paranoid") -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def system_wide_allowed(paranoid: int | None = None) -> tuple[bool, str]:
    """Whether this process may count events on every CPU, and why not."""
    if not os.path.exists("/proc/sys/kernel/perf_event_paranoid"):
        return False, "perf_event not supported by this kernel (no perf_event_paranoid)"
    if os.geteuid() == 0:
        return True, ""
    p = paranoid_level() if paranoid is None else paranoid
    if p is not None and p <= 0:
        return True, ""
    return False, (f"system-wide perf counters need root or kernel.perf_event_paranoid <= 0 "
                   f"(it is {p}); counting per run process instead")


def _online_cpus() -> list[int]:
    try:
        with open("/sys/devices/system/cpu/online") as f:
            return _parse_cpulist(f.read())
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))


def _parse_cpulist(s: str) -> list[int]:
    out: list[int] = []
    for part in s.strip().split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def _errname(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))


class PerfProbe(Probe):
    """Counts a list of perf events, system-wide (``pids=None``) or for given PIDs.

    ``open()`` tries each event on every CPU (or PID); an event that fails anywhere is dropped
    and the failure recorded in ``skipped`` ({event: errno name}).
    """

    name = "perf"
    events: list[tuple] = HARDWARE_EVENTS
    what = "hardware counters"
    #: read all events of a CPU with one syscall (safe for software events; hardware groups
    #: larger than the PMU never get scheduled, so hardware events stay one fd each)
    group = False
    #: Read once a second.  A system-wide read of a counter active on another CPU is a
    #: cross-CPU call per CPU (an IPI; a VM exit under a hypervisor): ~130 µs of the agent's
    #: 10 Hz tick here for 5 software events on 2 CPUs.  The counters are cumulative, so the
    #: 3-s windows still see every event, at 1-s resolution.  (Per-run probes, used only when
    #: system-wide counting is refused, are read with their run on every tick.)
    interval_s = 1.0

    def __init__(self, pids: Sequence[int] | None = None, prefix: str | None = None,
                 cpus: Sequence[int] | None = None):
        super().__init__()
        self.pids = list(pids) if pids else None
        self.prefix = prefix or ("cpu.run.perf." if self.pids else "cpu.perf.")
        self._cpus = list(cpus) if cpus is not None else None
        self._fds: list[list[int]] = []   # per channel: fds to sum
        self._leaders: list[int] = []     # grouped mode: one group leader per CPU
        self._all_fds: list[int] = []
        self.skipped: dict[str, str] = {}

    def _event_list(self) -> list[tuple]:
        return list(self.events)

    def open(self) -> None:
        try:
            self._open()
        except Exception as e:  # never raise out of open()
            self._close_fds()
            self._unavailable(f"perf_event_open failed: {e}")

    def _open(self) -> None:
        if self.pids is None:
            ok, why = system_wide_allowed()
            if not ok:
                self._unavailable(why)
                return
            targets = [(-1, c) for c in (self._cpus if self._cpus is not None
                                         else _online_cpus())]
            flags = _FLAG_DISABLED
        else:
            targets = [(p, -1) for p in self.pids]
            flags = _FLAG_DISABLED | _FLAG_INHERIT
            p = paranoid_level()
            if os.geteuid() != 0 and (p is None or p >= 2):
                flags |= _FLAG_EXCLUDE_KERNEL | _FLAG_EXCLUDE_HV
        if self.group and self.pids is None and self._open_grouped(targets, flags):
            return
        channels: list[ChannelMeta] = []
        for ev in self._event_list():
            suffix, type_, config, unit, desc = ev
            fds: list[int] = []
            try:
                for pid, cpu in targets:
                    try:
                        fds.append(_perf_event_open(type_, config, pid, cpu, flags))
                    except OSError as e:
                        if e.errno == errno.ESRCH and self.pids:  # that PID is gone; go on
                            continue
                        raise
            except OSError as e:
                for fd in fds:
                    os.close(fd)
                self.skipped[suffix] = _errname(e)
                continue
            if not fds:
                self.skipped[suffix] = "ESRCH"
                continue
            for fd in fds:
                _ioctl_enable(fd)
            self._fds.append(fds)
            channels.append(ChannelMeta(self.prefix + suffix, unit, "counter", self.name, desc))
        if not channels:
            self._unavailable(self._reason_none())
            return
        self._ready(channels)

    def _open_grouped(self, targets: list[tuple[int, int]], flags: int) -> bool:
        """One group per CPU, read with a single ``read`` (PERF_FORMAT_GROUP): 5x fewer
        syscalls (and cross-CPU calls) than one fd per event.  False: fall back to one fd each."""
        evs = self._event_list()
        leaders: list[int] = []
        opened: list[int] = []
        fmt = _READ_FORMAT | _FORMAT_GROUP
        try:
            for pid, cpu in targets:
                lead = -1
                for i, (_, type_, config, _, _) in enumerate(evs):
                    fd = _perf_event_open(type_, config, pid, cpu,
                                          flags if i == 0 else flags & ~_FLAG_DISABLED,
                                          group_fd=lead, read_format=fmt)
                    opened.append(fd)
                    if i == 0:
                        lead = fd
                leaders.append(lead)
        except OSError:
            for fd in opened:
                os.close(fd)
            return False
        for fd in leaders:
            _ioctl_enable(fd)
        self._leaders, self._all_fds = leaders, opened
        self._nev = len(evs)
        self._ready([ChannelMeta(self.prefix + s, u, "counter", self.name, d)
                     for s, _, _, u, d in evs])
        return True

    def _sample_grouped(self) -> list[float]:
        n = self._nev
        tot = [0.0] * n
        fmt = f"<{3 + n}Q"
        size = 8 * (3 + n)
        for fd in self._leaders:
            try:
                vals = struct.unpack(fmt, os.read(fd, size))
            except (OSError, struct.error):
                return [NAN] * n
            enabled, running = vals[1], vals[2]
            scale = enabled / running if running and running < enabled else 1.0
            for i in range(n):
                tot[i] += vals[3 + i] * scale
        return tot

    def _reason_none(self) -> str:
        codes = sorted(set(self.skipped.values()))
        if set(codes) <= {"ENOENT", "EOPNOTSUPP", "ENODEV"}:
            return (f"{self.what} not supported on this CPU/VM (perf_event_open: "
                    f"{'/'.join(codes)} for {', '.join(self.skipped)})")
        if "EACCES" in codes or "EPERM" in codes:
            return (f"{self.what}: permission denied (perf_event_open: {'/'.join(codes)}); "
                    f"needs root or a lower kernel.perf_event_paranoid")
        return f"{self.what}: perf_event_open failed ({', '.join(f'{k}: {v}' for k, v in self.skipped.items())})"

    def sample(self) -> list[float]:
        if self._leaders:
            return self._sample_grouped()
        out = []
        for fds in self._fds:
            total = 0.0
            for fd in fds:
                try:
                    value, enabled, running = struct.unpack("<QQQ", os.read(fd, 24))
                except (OSError, struct.error):
                    total = NAN
                    break
                if running and running < enabled:  # multiplexed: scale up
                    value = value * enabled / running
                total += value
            out.append(total)
        return out

    def _close_fds(self) -> None:
        for fds in self._fds:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fds = []
        for fd in self._all_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._all_fds, self._leaders = [], []

    def close(self) -> None:
        self._close_fds()


def _ioctl_enable(fd: int) -> None:
    import fcntl
    fcntl.ioctl(fd, _IOC_ENABLE, 0)


def _is_intel() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return "GenuineIntel" in line
    except OSError:
        pass
    return False


class PerfHardwareProbe(PerfProbe):
    """Hardware counters; the derived metrics (IPC, miss ratios, L3 stall ratio) come from these."""

    name = "perf"
    what = "hardware counters"

    def _event_list(self) -> list[tuple]:
        evs = list(HARDWARE_EVENTS)
        if _is_intel():
            evs.append(STALLS_L3_MISS)
        return evs

    def _open(self) -> None:
        super()._open()
        # The L3-stall raw event exists only on some Intel PMUs: its absence is not a failure.
        if self.available and STALLS_L3_MISS[0] in self.skipped:
            self.skipped.pop(STALLS_L3_MISS[0])


class PerfSoftwareProbe(PerfProbe):
    """Kernel software events: work wherever perf_event exists (the fallback for VMs)."""

    name = "perf_sw"
    events = SOFTWARE_EVENTS
    group = True
    what = "software events"


def perf_host_probes(cpus: Sequence[int] | None = None) -> list[Probe]:
    """The host-level perf probes (system-wide counting, on the node's CPU set when given)."""
    return [PerfHardwareProbe(cpus=cpus), PerfSoftwareProbe(cpus=cpus)]


def perf_run_probes(pids: Sequence[int] | None) -> list[Probe]:
    """Per-run perf probes, only when system-wide counting is not allowed (otherwise the host
    probes already count everything and per-process fds would double the cost)."""
    if not pids or system_wide_allowed()[0]:
        return []
    return [PerfHardwareProbe(pids=pids), PerfSoftwareProbe(pids=pids)]
