"""Per-run resource accounting: the run's cgroup (v1 or v2), or its process tree.

Built from a :class:`~reveal_plugins.types.RunInfo` when a run registers:

- ``run.cgroup`` given (``/slurm/uid_0/job_7/step_0``, or an absolute path under the cgroup
  mount): that cgroup is read, in every v1 controller hierarchy (``cpu``, ``cpuacct``,
  ``memory``, ``blkio``) where it exists, or in the v2 unified hierarchy.
- only ``run.pids``: their CPU cgroup is looked up in ``/proc/<pid>/cgroup``; if it is the root
  cgroup (as for ``reveal record`` on a machine without per-session cgroups) or is shared with
  processes outside the run, the probe sums the *process tree* instead: utime/stime (with the
  reaped children's cutime/cstime, so time does not vanish when a child exits), RSS, major
  faults, ``/proc/<pid>/io`` bytes and the number of processes/threads.  The tree is re-walked
  through ``/proc/<pid>/task/*/children`` once a second (bounded by ``max_procs``); PIDs are read
  on every sample.  When the PIDs' *memory* cgroup is not the root, its limit, fail count and
  OOM kills are added (an OOM there hits the run even if the cgroup is shared).

Channels: ``cpu.run.*`` (seconds of CPU, throttling), ``memory.run.*`` (bytes, fail counts,
OOM events), ``storage.run.*`` (bytes), ``system.run.nprocs``.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from ..types import ChannelMeta, RunInfo
from .probe import NAN, Probe

_UNLIMITED = 1 << 60          # v1 reports "no limit" as a huge page-rounded number
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: files of limits and of the OOM state (memory.limit_in_bytes, memory.max, the CPU quota,
#: oom_control) are read once a second and their last reading repeated in between: they change
#: when someone sets a limit or the OOM killer strikes, which one second places well enough,
#: and at 10 Hz each costs ~20 µs of kernel and parsing per tick.  Usage, stat, I/O and the
#: fail/event counters (failcnt, memory.events: rates while a job presses on its limit) are
#: read on every tick.
HOLD_S = 1.0
_now = time.monotonic


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class _File:
    """A persistent fd read with one ``pread`` per sample (sysfs/cgroupfs regenerate on read)."""

    __slots__ = ("path", "fd")

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self) -> bytes:
        return os.pread(self.fd, 65536, 0)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _kv(data: bytes) -> dict[bytes, bytes]:
    toks = data.split()
    return dict(zip(toks[0::2], toks[1::2]))


def _num(tok: bytes | None, scale: float = 1.0, unlimited_nan: bool = False) -> float:
    if tok is None or tok == b"max":
        return NAN
    v = float(tok)
    if unlimited_nan and v >= _UNLIMITED:
        return NAN
    return v * scale


class _Reader:
    """One file → several channels.  ``parse(bytes) -> list[float]`` in channel order.

    ``hold_s`` > 0: the file is read at most once per ``hold_s`` seconds and its last reading
    repeated in between (see :data:`HOLD_S`); the repeat is the same bytes object, whose
    values are not parsed again."""

    def __init__(self, path: str, channels: list[ChannelMeta],
                 parse: Callable[[bytes], list[float]], hold_s: float = 0.0):
        self.file = _File(path)
        self.channels = channels
        self.parse = parse
        self.hold_s = hold_s
        self._next = 0.0
        self._held: bytes | None = None
        self._parsed: tuple[bytes | None, list[float]] = (None, [])
        parse(self.file.read())  # fail at open, not at every sample

    def read(self) -> list[float]:
        return self.parse_raw(self.read_raw())

    def read_raw(self) -> bytes | None:
        if self.hold_s:
            now = _now()
            if now < self._next:
                return self._held
            self._next = now + self.hold_s
        try:
            raw = self.file.read()
        except OSError:
            raw = None
        if self.hold_s:
            self._held = raw
        return raw

    def parse_raw(self, raw: bytes | None) -> list[float]:
        if raw is not None and raw is self._parsed[0]:
            return list(self._parsed[1])
        vals = [NAN] * len(self.channels)
        try:
            if raw is not None:
                vals = self.parse(raw)
        except ValueError:
            pass
        if self.hold_s:
            self._parsed = (raw, list(vals))
        return vals


def _ch(name: str, unit: str, kind: str, desc: str) -> ChannelMeta:
    return ChannelMeta(name, unit, kind, "cgroup", desc)


def _kv_reader(path: str, spec: list[tuple[bytes, ChannelMeta, float]],
               hold_s: float = 0.0) -> "_Reader | None":
    """A ``key value`` file (cpu.stat, memory.events ...): channels only for the keys the kernel
    writes (``throttled_usec`` exists only with the cpu controller, ``oom_kill`` only on newer
    kernels), so no channel is NaN forever."""
    try:
        present = _kv(_read(path))
    except OSError:
        return None
    spec = [s for s in spec if s[0] in present]
    if not spec:
        return None
    keys = [k for k, _, _ in spec]
    scales = [sc for _, _, sc in spec]

    def parse(b: bytes) -> list[float]:
        d = _kv(b)
        return [_num(d.get(k), sc) for k, sc in zip(keys, scales)]
    try:
        return _Reader(path, [c for _, c, _ in spec], parse, hold_s)
    except (OSError, ValueError):
        return None


# -- cgroup layout -----------------------------------------------------------------------------

def find_hierarchies(root: str = "/sys/fs/cgroup") -> dict[str, str]:
    """Map controller → mount directory: v1 controllers by name, the v2 hierarchy as ``"v2"``.

    Handles pure v2 (``root/cgroup.controllers``), hybrid (``root/unified``) and v1 (one
    directory per controller, co-mounted ``cpu,cpuacct`` included).
    """
    out: dict[str, str] = {}
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        out["v2"] = root
        return out
    if os.path.exists(os.path.join(root, "unified", "cgroup.controllers")):
        out["v2"] = os.path.join(root, "unified")
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for d in sorted(names):
        full = os.path.join(root, d)
        if d == "unified" or os.path.islink(full) or not os.path.isdir(full):
            continue
        for ctl in d.split(","):
            out.setdefault(ctl, full)
    return out


def _pid_cgroups(pid: int, proc: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` → {controller: path}; the v2 line is under key ``"v2"``."""
    out: dict[str, str] = {}
    for line in _read(f"{proc}/{pid}/cgroup").decode().splitlines():
        _, ctls, path = line.split(":", 2)
        if ctls == "":
            out["v2"] = path
        for c in ctls.split(","):
            if c:
                out[c] = path
    return out


# -- cgroup readers -----------------------------------------------------------------------------

def _v1_readers(dirs: dict[str, str]) -> list[_Reader]:
    """``dirs``: controller → the run's directory in that hierarchy (only existing ones)."""
    rs: list[_Reader] = []

    def add(ctl: str, fname: str, chans: list[ChannelMeta], parse, hold_s: float = 0.0) -> None:
        d = dirs.get(ctl)
        if d is None or not os.path.exists(os.path.join(d, fname)):
            return
        try:
            rs.append(_Reader(os.path.join(d, fname), chans, parse, hold_s))
        except (OSError, ValueError):
            pass

    add("cpuacct", "cpuacct.usage",
        [_ch("cpu.run.usage", "s", "counter", "CPU time of the run's cgroup (cpuacct.usage)")],
        lambda b: [float(b) * 1e-9])

    def addkv(ctl: str, fname: str, spec, hold_s: float = 0.0) -> None:
        d = dirs.get(ctl)
        if d is not None:
            r = _kv_reader(os.path.join(d, fname), spec, hold_s)
            if r is not None:
                rs.append(r)

    addkv("cpuacct", "cpuacct.stat",
          [(b"user", _ch("cpu.run.user", "s", "counter", "user CPU time (cpuacct.stat)"),
            1 / _CLK_TCK),
           (b"system", _ch("cpu.run.system", "s", "counter", "system CPU time (cpuacct.stat)"),
            1 / _CLK_TCK)])
    addkv("cpu", "cpu.stat", _THROTTLE_SPEC + [
        (b"throttled_time", _ch("cpu.run.throttled_time", "s", "counter",
                                "time throttled by the CFS quota"), 1e-9)])
    if "cpu" in dirs and os.path.exists(os.path.join(dirs["cpu"], "cpu.cfs_quota_us")):
        try:
            period = _File(os.path.join(dirs["cpu"], "cpu.cfs_period_us"))

            def quota(b: bytes, period=period) -> list[float]:
                q = float(b)
                return [NAN if q < 0 else q / float(period.read())]
            rs.append(_Reader(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"),
                              [_ch("cpu.run.limit_cores", "cores", "gauge",
                                   "CFS quota / period (NaN = no limit)")], quota, HOLD_S))
        except (OSError, ValueError):
            pass
    add("memory", "memory.usage_in_bytes",
        [_ch("memory.run.usage", "bytes", "gauge", "memory charged to the run's cgroup")],
        lambda b: [float(b)])
    add("memory", "memory.limit_in_bytes",
        [_ch("memory.run.limit", "bytes", "gauge", "memory limit (NaN = none)")],
        lambda b: [_num(b.strip(), unlimited_nan=True)], HOLD_S)
    add("memory", "memory.failcnt",
        [_ch("memory.run.failcnt", "events", "counter", "times usage hit the limit")],
        lambda b: [float(b)])
    addkv("memory", "memory.oom_control",
          [(b"under_oom", _ch("memory.run.under_oom", "flag", "gauge",
                              "1 while the cgroup is under OOM"), 1.0),
           (b"oom_kill", _ch("memory.run.oom_kill", "kills", "counter",
                             "processes killed by the OOM killer"), 1.0)], HOLD_S)
    addkv("memory", "memory.stat",
          [(b"total_rss", _ch("memory.run.anon", "bytes", "gauge", "anonymous memory (total_rss)"),
            1.0),
           (b"total_cache", _ch("memory.run.file", "bytes", "gauge", "page cache (total_cache)"),
            1.0)])
    add("blkio", "blkio.throttle.io_service_bytes",
        [_ch("storage.run.read_bytes", "bytes", "counter", "bytes read from block devices"),
         _ch("storage.run.write_bytes", "bytes", "counter", "bytes written to block devices")],
        _v1_blkio)
    procs_dir = dirs.get("cpuacct") or dirs.get("cpu") or dirs.get("memory")
    if procs_dir:
        try:
            rs.append(_Reader(os.path.join(procs_dir, "cgroup.procs"),
                              [_ch("system.run.nprocs", "processes", "gauge",
                                   "processes in the run's cgroup")],
                              lambda b: [float(b.count(b"\n"))]))
        except OSError:
            pass
    return rs


_THROTTLE_SPEC = [
    (b"nr_periods", _ch("cpu.run.nr_periods", "periods", "counter",
                        "CFS enforcement periods elapsed"), 1.0),
    (b"nr_throttled", _ch("cpu.run.nr_throttled", "periods", "counter",
                          "periods in which the run was throttled"), 1.0),
]


def _v1_blkio(b: bytes) -> list[float]:
    r = w = 0.0
    for line in b.splitlines():
        parts = line.split()
        if len(parts) == 3:
            if parts[1] == b"Read":
                r += float(parts[2])
            elif parts[1] == b"Write":
                w += float(parts[2])
    return [r, w]


def _v2_io(b: bytes) -> list[float]:
    r = w = 0.0
    for tok in b.split():
        if tok.startswith(b"rbytes="):
            r += float(tok[7:])
        elif tok.startswith(b"wbytes="):
            w += float(tok[7:])
    return [r, w]


def _v2_readers(d: str) -> list[_Reader]:
    rs: list[_Reader] = []

    def add(fname: str, chans: list[ChannelMeta], parse, hold_s: float = 0.0) -> None:
        p = os.path.join(d, fname)
        if not os.path.exists(p):
            return
        try:
            rs.append(_Reader(p, chans, parse, hold_s))
        except (OSError, ValueError):
            pass

    def addkv(fname: str, spec) -> None:
        r = _kv_reader(os.path.join(d, fname), spec)
        if r is not None:
            rs.append(r)

    addkv("cpu.stat", [
        (b"usage_usec", _ch("cpu.run.usage", "s", "counter",
                            "CPU time of the run's cgroup (cpu.stat usage_usec)"), 1e-6),
        (b"user_usec", _ch("cpu.run.user", "s", "counter", "user CPU time"), 1e-6),
        (b"system_usec", _ch("cpu.run.system", "s", "counter", "system CPU time"), 1e-6),
    ] + _THROTTLE_SPEC + [
        (b"throttled_usec", _ch("cpu.run.throttled_time", "s", "counter",
                                "time throttled by cpu.max"), 1e-6)])
    add("cpu.max", [_ch("cpu.run.limit_cores", "cores", "gauge", "cpu.max quota / period "
                        "(NaN = no limit)")],
        lambda b: (lambda t: [NAN if t[0] == b"max" else float(t[0]) / float(t[1])])(b.split()),
        HOLD_S)
    add("memory.current", [_ch("memory.run.usage", "bytes", "gauge",
                               "memory charged to the run's cgroup")], lambda b: [float(b)])
    add("memory.max", [_ch("memory.run.limit", "bytes", "gauge", "memory.max (NaN = none)")],
        lambda b: [_num(b.strip(), unlimited_nan=True)], HOLD_S)
    addkv("memory.events", [
        (b"high", _ch("memory.run.high", "events", "counter",
                      "times usage went over memory.high"), 1.0),
        (b"max", _ch("memory.run.failcnt", "events", "counter", "times usage hit memory.max"),
         1.0),
        (b"oom", _ch("memory.run.oom", "events", "counter", "OOM situations"), 1.0),
        (b"oom_kill", _ch("memory.run.oom_kill", "kills", "counter",
                          "processes killed by the OOM killer"), 1.0)])
    addkv("memory.stat", [
        (b"anon", _ch("memory.run.anon", "bytes", "gauge", "anonymous memory"), 1.0),
        (b"file", _ch("memory.run.file", "bytes", "gauge", "page cache"), 1.0)])
    add("io.stat",
        [_ch("storage.run.read_bytes", "bytes", "counter", "bytes read from block devices"),
         _ch("storage.run.write_bytes", "bytes", "counter", "bytes written to block devices")],
        _v2_io)
    add("cgroup.procs", [_ch("system.run.nprocs", "processes", "gauge",
                             "processes in the run's cgroup")],
        lambda b: [float(b.count(b"\n"))])
    return rs


# -- process tree ----------------------------------------------------------------------------------

TREE_CHANNELS = [
    _ch("cpu.run.usage", "s", "counter", "CPU time of the run's processes (+ reaped children)"),
    _ch("cpu.run.user", "s", "counter", "user CPU time of the run's processes"),
    _ch("cpu.run.system", "s", "counter", "system CPU time of the run's processes"),
    _ch("memory.run.rss", "bytes", "gauge", "resident memory summed over the run's processes"),
    _ch("memory.run.major_faults", "faults", "counter", "major page faults (+ reaped children)"),
    _ch("storage.run.read_bytes", "bytes", "counter", "bytes fetched from storage (/proc/pid/io)"),
    _ch("storage.run.write_bytes", "bytes", "counter", "bytes sent to storage (/proc/pid/io)"),
    _ch("storage.run.rchar", "bytes", "counter", "bytes read through read-like syscalls"),
    _ch("storage.run.wchar", "bytes", "counter", "bytes written through write-like syscalls"),
    _ch("system.run.nprocs", "processes", "gauge", "processes in the run's tree"),
    _ch("system.run.nthreads", "threads", "gauge", "threads in the run's tree"),
]


class ProcessTree:
    """Sums /proc/<pid>/stat and /proc/<pid>/io over the run's roots and their descendants.

    Exited processes leave the tree; their CPU time and I/O reappear in the reaping parent's
    cumulative child fields, so the counters stay (nearly) monotonic.  A process whose root
    exited and whose children were re-parented outside the tree is no longer followed.
    """

    def __init__(self, roots: Sequence[int], proc: str = "/proc", max_procs: int = 512,
                 rescan_every: int = 10, startup: int = 30):
        self.roots = list(roots)
        self.startup = startup
        self.proc = proc
        self.max_procs = max_procs
        self.rescan_every = rescan_every
        self._n = 0
        self.pids: list[int] = []
        self._files: dict[int, tuple[_File, _File | None]] = {}
        # Monotonic floors: a process that exits before it is reaped briefly drops out.
        self._last: list[float] | None = None

    def _children(self, pid: int) -> list[int]:
        out: list[int] = []
        try:
            tasks = os.listdir(f"{self.proc}/{pid}/task")
        except OSError:
            return out
        for t in tasks:
            try:
                fd = os.open(f"{self.proc}/{pid}/task/{t}/children", os.O_RDONLY)
                try:
                    out.extend(int(x) for x in os.read(fd, 65536).split())
                finally:
                    os.close(fd)
            except (OSError, ValueError):
                pass
        return out

    def rescan(self) -> None:
        seen: list[int] = []
        todo = [p for p in self.roots if os.path.exists(f"{self.proc}/{p}")]
        me = os.getpid()  # the agent itself may be a child of the run's root (reveal record)
        while todo and len(seen) < self.max_procs:
            p = todo.pop()
            if p in seen or (p == me and p not in self.roots):
                continue
            seen.append(p)
            todo.extend(self._children(p))
        for p in list(self._files):
            if p not in seen:
                for f in self._files.pop(p):
                    if f is not None:
                        f.close()
        for p in seen:
            if p not in self._files:
                try:
                    st = _File(f"{self.proc}/{p}/stat")
                except OSError:
                    continue
                try:
                    io = _File(f"{self.proc}/{p}/io")
                except OSError:  # another user's process without ptrace rights
                    io = None
                self._files[p] = (st, io)
        self.pids = [p for p in seen if p in self._files]

    def read(self) -> list[float]:
        return self.parse_raw(self.read_raw())

    def read_raw(self) -> list[tuple[bytes, bytes | None]]:
        """``(stat, io)`` bytes of each process now (see :meth:`Probe.read_raw`)."""
        # Launchers fork their workers right after start: follow the tree on every sample for
        # the first ``startup`` samples, then every ``rescan_every`` (short-lived children
        # missed later still count, through the parent's cumulative child time).
        if self._n < self.startup or self._n % self.rescan_every == 0:
            self.rescan()
        self._n += 1
        out = []
        for p in self.pids:
            stf, iof = self._files[p]
            try:
                data = stf.read()
            except OSError:
                continue
            if not data:
                continue
            io = None
            if iof is not None:
                try:
                    io = iof.read()
                except OSError:
                    pass
            out.append((data, io))
        return out

    def parse_raw(self, raw: list[tuple[bytes, bytes | None]]) -> list[float]:
        """The tree's sums from a :meth:`read_raw` reading, held monotonic (in reading order)."""
        ut = st = rss = majflt = nthreads = 0.0
        rb = wb = rc = wc = 0.0
        nprocs = 0
        for data, iodata in raw:
            # comm may contain spaces/parentheses: fields start after the last ')'
            f = data[data.rindex(b")") + 2:].split()
            # f[0] is field 3 (state): field k is f[k-3]
            majflt += float(f[9]) + float(f[10])          # majflt, cmajflt
            ut += float(f[11]) + float(f[13])             # utime, cutime
            st += float(f[12]) + float(f[14])             # stime, cstime
            nthreads += float(f[17])
            rss += float(f[21]) * _PAGE
            nprocs += 1
            if iodata is not None:
                try:
                    io = _kv(iodata.replace(b":", b""))
                    rc += float(io.get(b"rchar", 0))
                    wc += float(io.get(b"wchar", 0))
                    rb += float(io.get(b"read_bytes", 0))
                    wb += float(io.get(b"write_bytes", 0))
                except ValueError:
                    pass
        if nprocs == 0:
            return [NAN] * 9 + [0.0, 0.0]
        ut /= _CLK_TCK
        st /= _CLK_TCK
        cur = [ut + st, ut, st, rss, majflt, rb, wb, rc, wc, float(nprocs), nthreads]
        # Counters never go backwards: a child that exited but is not yet reaped is missing for
        # a moment; hold the previous value instead of reporting a dip (and a negative rate).
        if self._last is not None:
            for i in (0, 1, 2, 4, 5, 6, 7, 8):
                if cur[i] < self._last[i]:
                    cur[i] = self._last[i]
        self._last = cur
        return cur

    def close(self) -> None:
        for fs in self._files.values():
            for f in fs:
                if f is not None:
                    f.close()
        self._files.clear()


# -- the probe ---------------------------------------------------------------------------------

class CgroupProbe(Probe):
    """Run-scoped accounting (see the module docstring for how the source is chosen).

    ``mode`` after ``open()``: ``"cgroup-v1"``, ``"cgroup-v2"`` or ``"process-tree"``;
    ``source`` names the cgroup path or the root PIDs.
    """

    name = "cgroup"

    def __init__(self, run: RunInfo | None = None, *, cgroup: str | None = None,
                 pids: Sequence[int] | None = None, cgroup_root: str = "/sys/fs/cgroup",
                 proc: str = "/proc", max_procs: int = 512):
        super().__init__()
        self.cgroup = cgroup if cgroup is not None else (run.cgroup if run else None)
        self.pids = list(pids if pids is not None else (run.pids if run else []))
        self.cgroup_root = cgroup_root
        self.proc = proc
        self.max_procs = max_procs
        self.mode = ""
        self.source = ""
        self._readers: list[_Reader] = []
        self._tree: ProcessTree | None = None

    def open(self) -> None:
        try:
            self._open()
        except Exception as e:  # open() never raises
            self.close()
            self._unavailable(f"cgroup accounting failed to open: {type(e).__name__}: {e}")

    def _resolve(self, hier: dict[str, str], path: str) -> dict[str, str]:
        """The run's directory in each hierarchy where it exists."""
        path = path.rstrip("/") or "/"
        root = self.cgroup_root.rstrip("/")
        if path.startswith(root + "/"):          # absolute path under the mount
            rel = path[len(root):]
            for ctl, mnt in hier.items():
                if path == mnt or path.startswith(mnt + "/"):
                    rel = path[len(mnt):] or "/"
                    break
            path = rel
        out = {}
        for ctl, mnt in hier.items():
            d = mnt + (path if path != "/" else "")
            if os.path.isdir(d):
                out[ctl] = d
        return out

    def _open(self) -> None:
        hier = find_hierarchies(self.cgroup_root)
        if self.cgroup:
            dirs = self._resolve(hier, self.cgroup)
            if not dirs:
                self._unavailable(f"cgroup {self.cgroup!r} not found under {self.cgroup_root}")
                return
            self._from_dirs(dirs, self.cgroup)
            if not self._readers:
                self._unavailable(f"cgroup {self.cgroup!r}: no readable accounting files")
                return
        elif self.pids:
            alive = [p for p in self.pids if os.path.exists(f"{self.proc}/{p}")]
            if not alive:
                self._unavailable(f"run PIDs {self.pids} have exited")
                return
            try:
                cg = _pid_cgroups(alive[0], self.proc)
            except OSError:
                cg = {}
            cpu_path = ((cg.get("cpuacct") or cg.get("cpu"))
                        if ("cpuacct" in hier or "cpu" in hier) else None)
            if cpu_path is None and "v2" in hier:
                cpu_path = cg.get("v2")
            if cpu_path and cpu_path != "/" and self._dedicated(hier, cg, alive):
                # each hierarchy has its own path for the PID (they differ when, say, only
                # the memory controller is delegated to a container)
                dirs: dict[str, str] = {}
                for ctl, path in cg.items():
                    if ctl in hier and path != "/":
                        dirs.update(self._resolve({ctl: hier[ctl]}, path))
                self._from_dirs(dirs, cpu_path)
            if not self._readers:
                self._tree = ProcessTree(alive, self.proc, self.max_procs)
                self._tree.rescan()
                self.mode, self.source = "process-tree", f"pids {alive}"
                # An enclosing (shared) memory cgroup still limits and OOM-kills the run.
                mem = cg.get("memory")
                if mem and mem != "/" and "memory" in hier:
                    d = self._resolve({"memory": hier["memory"]}, mem)
                    for r in _v1_readers(d):
                        if r.channels[0].name in ("memory.run.limit", "memory.run.failcnt",
                                                  "memory.run.under_oom"):
                            self._readers.append(r)
                        else:
                            r.file.close()
        else:
            self._unavailable("run has neither a cgroup nor PIDs")
            return
        chans = list(TREE_CHANNELS) if self._tree else []
        for r in self._readers:
            chans.extend(r.channels)
        self._ready(chans)

    def _dedicated(self, hier: dict[str, str], cg: dict[str, str], pids: list[int]) -> bool:
        """True when the PIDs' CPU cgroup holds only the run's process tree (a Slurm step, a
        systemd-run scope), so its counters are the run's; a login session's cgroup is not."""
        key = "cpuacct" if "cpuacct" in cg and "cpuacct" in hier else (
            "cpu" if "cpu" in cg and "cpu" in hier else "v2")
        if key not in hier or key not in cg:
            return False
        d = self._resolve({key: hier[key]}, cg[key]).get(key)
        if not d:
            return False
        try:
            members = {int(x) for x in _read(os.path.join(d, "cgroup.procs")).split()}
        except (OSError, ValueError):
            return False
        tree = ProcessTree(pids, self.proc, self.max_procs)
        tree.rescan()
        mine = set(tree.pids)
        tree.close()
        return bool(members) and members <= mine

    def _from_dirs(self, dirs: dict[str, str], label: str) -> None:
        v1 = {k: v for k, v in dirs.items() if k != "v2"}
        if any(k in v1 for k in ("cpu", "cpuacct", "memory")):
            self._readers = _v1_readers(v1)
            self.mode = "cgroup-v1"
        if not self._readers and "v2" in dirs:
            self._readers = _v2_readers(dirs["v2"])
            self.mode = "cgroup-v2"
        self.source = label

    def add_pids(self, pids: Sequence[int]) -> None:
        """More processes of the run (a launcher's workers, a later step): a process-tree
        probe follows them from now on; a cgroup already holds them."""
        if self._tree is not None:
            for p in pids:
                if isinstance(p, int) and p > 0 and p not in self._tree.roots:
                    self._tree.roots.append(p)
            self._tree.rescan()

    def sample(self) -> list[float]:
        return self.parse_raw(self.read_raw())

    def read_raw(self) -> tuple[Any, list[bytes | None]]:
        return (self._tree.read_raw() if self._tree else None,
                [r.read_raw() for r in self._readers])

    def parse_raw(self, raw: tuple[Any, list[bytes | None]]) -> list[float]:
        tree, files = raw
        out: list[float] = self._tree.parse_raw(tree) if self._tree else []
        for r, b in zip(self._readers, files):
            out.extend(r.parse_raw(b))
        return out

    def close(self) -> None:
        for r in self._readers:
            r.file.close()
        self._readers = []
        if self._tree:
            self._tree.close()

    def describe(self) -> dict:
        d = super().describe()
        if self.available:
            d["note"] = f"{self.mode}: {self.source}"
        return d
