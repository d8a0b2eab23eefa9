"""What the processes of *this node* do, when the node is a CPU set of a larger machine.

Where several nodes share one kernel (containers or a test bed with a CPU set per node,
``REVEAL_CPUS``), the disk and memory counters of ``/proc`` are the machine's: a process that
writes 100 MB/s on one node shows the same on every node, and the node's foreign I/O or memory
(:mod:`reveal_plugins.detect.evidence.foreign`) says nothing about *which* node it ran on.  The
processes do: one pinned to the node's CPUs (its affinity is a subset of the CPU set) belongs
to the node, one free to run anywhere belongs to the machine.  This probe sums, over the
node's processes, the bytes they read and wrote (``/proc/<pid>/io``, counted when a page is
dirtied, as the run's own accounting is), their resident memory and major faults:

``storage.node.{read,write}_bytes``, ``memory.node.{rss,major_faults}``, ``system.node.nprocs``.

The counters stay monotonic across process exits: each process contributes what it did
between two reads (all of it, when it started after the previous read).  Only opened when a
CPU set smaller than the machine is configured: on a whole machine the kernel's totals say
the same for less.  An agent that runs inside the node's own PID namespace sees only the
processes started in it; ``--host-proc DIR`` (``$REVEAL_HOST_PROC``, a bind mount of the
machine's /proc) lets it see the node's processes that were started from outside.
"""
from __future__ import annotations

import os
import resource

from ..types import ChannelMeta
from .cpuset import parse_cpulist
from .probe import NAN, Probe

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = resource.getpagesize()

CHANNELS = [
    ("storage.node.read_bytes", "bytes", "counter"),
    ("storage.node.write_bytes", "bytes", "counter"),
    ("memory.node.rss", "bytes", "gauge"),
    ("memory.node.major_faults", "faults", "counter"),
    ("system.node.nprocs", "processes", "gauge"),
]


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _boot_time() -> float:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    return 0.0


class NodeProcsProbe(Probe):
    name = "procfs.nodeprocs"
    interval_s = 1.0

    def __init__(self, cpus: list[int] | None = None, proc: str = "/proc",
                 max_procs: int = 4096):
        super().__init__()
        self.cpus = set(cpus or ())
        self.proc = proc
        self.max_procs = max_procs
        self._last: dict[int, tuple[float, float, float]] = {}   # pid -> (rb, wb, majflt)
        self._totals = [0.0, 0.0, 0.0]
        self._prev_scan = 0.0            # wall clock of the previous read
        self._btime = 0.0
        self._lists: dict[str, list[int]] = {}
        self._self = -1                  # the agent's own PID as ``proc`` numbers it

    def open(self) -> None:
        try:
            online = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
        except OSError:
            online = set(range(os.cpu_count() or 1))
        if not self.cpus:
            self._unavailable("no CPU set configured: the node is the whole machine")
            return
        if self.cpus >= online:
            self._unavailable("the CPU set covers the whole machine")
            return
        try:
            # the agent's segment writes are the observer's, not a neighbour's; ``self`` in
            # the machine's /proc names the agent by its PID in that namespace
            self._self = int(os.readlink(f"{self.proc}/self"))
        except (OSError, ValueError):
            self._self = os.getpid()
        try:
            self._btime = _boot_time()
            self._scan(first=True)
        except OSError as e:
            self._unavailable(f"cannot read {self.proc}: {e}")
            return
        self._ready([ChannelMeta(n, u, k, self.name) for n, u, k in CHANNELS])

    def _mine(self, pid: int) -> bool:
        # from status, not sched_getaffinity(): ``proc`` may be the machine's /proc seen from
        # the agent's own PID namespace (--host-proc), whose PIDs the syscall cannot name
        try:
            st = _read(f"{self.proc}/{pid}/status")
            a = st.index(b"Cpus_allowed_list:")
            line = st[a + 18:st.index(b"\n", a)].strip().decode()
            return set(self._allowed(line)) <= self.cpus
        except (OSError, ValueError):
            return False

    def _allowed(self, text: str) -> list[int]:
        got = self._lists.get(text)
        if got is None:
            got = self._lists[text] = parse_cpulist(text)
        return got

    def _scan(self, first: bool = False) -> list[float]:
        import time
        now = time.time()
        seen: dict[int, tuple[float, float, float]] = {}
        rss = 0.0
        n = 0
        for name in os.listdir(self.proc):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid == self._self or n >= self.max_procs or not self._mine(pid):
                continue
            try:
                st = _read(f"{self.proc}/{pid}/stat")
                f = st[st.rindex(b")") + 2:].split()
                majflt, start = float(f[9]), float(f[19]) / _CLK_TCK + self._btime
                rss += float(f[21]) * _PAGE
                rb = wb = 0.0
                try:
                    for line in _read(f"{self.proc}/{pid}/io").splitlines():
                        if line.startswith(b"read_bytes:"):
                            rb = float(line.split()[1])
                        elif line.startswith(b"write_bytes:"):
                            wb = float(line.split()[1])
                except OSError:      # another user's process, without the right to read it
                    pass
            except (OSError, ValueError, IndexError):
                continue             # exited between listing and reading
            n += 1
            cur = (rb, wb, majflt)
            seen[pid] = cur
            if first:
                continue
            # what it did since the previous read: all of it if it started since then
            prev = self._last.get(pid)
            if prev is None:
                prev = (0.0, 0.0, 0.0) if start >= self._prev_scan - 1.0 else cur
            for i in range(3):
                self._totals[i] += max(0.0, cur[i] - prev[i])
        self._last = seen
        self._prev_scan = now
        return [self._totals[0], self._totals[1], rss, self._totals[2], float(n)]

    def sample(self) -> list[float]:
        try:
            return self._scan()
        except OSError:
            return [NAN] * len(CHANNELS)


def node_procs_probes(cpus: list[int] | None, proc: str | None = None) -> list[Probe]:
    """``proc``: the machine's /proc when the agent sits in a PID namespace of the node's
    (agent ``--host-proc``); the node's processes started from outside it are seen there."""
    return [NodeProcsProbe(cpus, proc or "/proc")] if cpus else []
