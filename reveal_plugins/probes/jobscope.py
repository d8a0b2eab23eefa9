"""Run accounting for a Slurm job known only by its id (the SPANK plugin registers runs so).

The agent finds the job's processes itself, again and again while the job runs (steps come and
go, and Slurm creates the job's cgroup only when the first step starts):

1. cgroup v1, Slurm's ``proctrack/cgroup`` / ``task/cgroup`` layout:
   ``<mount>/<controller>/slurm[_<node>]/uid_<uid>/job_<id>`` (every step below it).  Where
   an accounting controller holds the job (cpuacct, memory: ``task/cgroup``,
   ``jobacct_gather/cgroup``), its counters are read; where only ``proctrack/cgroup``'s freezer
   does, its member PIDs (``cgroup.procs`` of the job and its steps) are the process set;
2. cgroup v2 (Slurm >= 22.05 ``cgroup/v2``): ``<root>/system.slice/slurmstepd.scope/job_<id>``
   (or ``system.slice/<node>_slurmstepd.scope``: multiple-slurmd); only these fixed roots,
   never a search (users may create cgroups under their delegated ``user@UID.service``);
3. without cgroups (``proctrack/linuxproc``, ``pgid``): the process trees of the job's
   ``slurmstepd: [<id>.<step>]`` processes, found in ``/proc`` -- root's ``slurmstepd``
   executables only (a user can ``exec -a`` that command line).

The walk of a job's cgroup tree is bounded (depth and cgroups read: the job may create
sub-cgroups where Slurm delegates them).

The channel set is fixed when the run registers (segments have a fixed schema): the job's CPU
time (user, system), memory (anonymous/resident and charged), block I/O bytes, read/write
syscall bytes and process count.  Counters are kept monotonic across steps: when a step's
processes vanish, the job's totals never go backwards (each sample adds only the positive
change since the previous one).
"""
from __future__ import annotations

import glob
import os
from typing import Sequence

from ..types import ChannelMeta, RunInfo
from .cgroup import CgroupProbe, ProcessTree
from .probe import NAN, Probe

CHANNELS = [
    ChannelMeta("cpu.run.usage", "s", "counter", "jobscope", "CPU time of the job"),
    ChannelMeta("cpu.run.user", "s", "counter", "jobscope", "user CPU time of the job"),
    ChannelMeta("cpu.run.system", "s", "counter", "jobscope", "system CPU time of the job"),
    ChannelMeta("memory.run.anon", "bytes", "gauge", "jobscope",
                "anonymous memory of the job (resident memory without cgroups)"),
    ChannelMeta("memory.run.usage", "bytes", "gauge", "jobscope",
                "memory charged to the job (cgroup; resident memory without cgroups)"),
    ChannelMeta("storage.run.read_bytes", "bytes", "counter", "jobscope", "block bytes read"),
    ChannelMeta("storage.run.write_bytes", "bytes", "counter", "jobscope", "block bytes written"),
    ChannelMeta("storage.run.rchar", "bytes", "counter", "jobscope",
                "bytes read through syscalls (process trees only)"),
    ChannelMeta("storage.run.wchar", "bytes", "counter", "jobscope",
                "bytes written through syscalls (process trees only)"),
    ChannelMeta("system.run.nprocs", "processes", "gauge", "jobscope", "processes of the job"),
]
_NAMES = [c.name for c in CHANNELS]
_COUNTER = [c.kind == "counter" for c in CHANNELS]
#: tree channel -> fixed channel (the tree has no "anon" or "usage": RSS stands for both)
_TREE_MAP = {"memory.run.rss": ("memory.run.anon", "memory.run.usage")}


def job_cgroups(job_id: str, uid: int | None, root: str = "/sys/fs/cgroup") -> list[str]:
    """Directories of the job's cgroup (one per v1 hierarchy, or the v2 one).

    Only Slurm's own roots are read, at fixed depths: ``<ctrl>/slurm*/uid_<uid>/job_<id>``
    (v1) and ``system.slice/[<node>_]slurmstepd.scope/job_<id>`` (v2).  Never a recursive
    search: a user may create cgroups of any name under a delegated ``user@UID.service``, and
    a ``.../slurmstepd.scope/job_<id>`` there must not pass for the job's accounting."""
    job = f"job_{job_id}"
    uids = [f"uid_{uid}"] if uid is not None else ["uid_*"]
    out: list[str] = []
    for u in uids:
        out += [d for d in glob.glob(os.path.join(root, "*", "slurm*", u, job))
                if not os.path.relpath(d, root).startswith(_V2_NOT_SLURM)]
    if not out:
        out = glob.glob(os.path.join(root, "system.slice", "slurmstepd.scope", job)) or \
            glob.glob(os.path.join(root, "system.slice", "*_slurmstepd.scope", job))
    return sorted(d for d in out if os.path.isdir(d) and not os.path.islink(d))


#: v2 top-level cgroups that are not Slurm's (a v1 glob ``*/slurm*`` must not enter them)
_V2_NOT_SLURM = ("user.slice", "system.slice", "init.scope", "machine.slice")


#: v1 controllers whose files account for CPU, memory or I/O
_ACCOUNTING = ("cpu", "cpuacct", "memory", "blkio")


def _accounting(d: str, root: str) -> bool:
    rel = os.path.relpath(d, root).split(os.sep)
    if rel[0].startswith(("system.slice", "unified")) or os.path.exists(
            os.path.join(d, "cpu.stat")):
        return True        # v2: one hierarchy with every controller
    return any(c in _ACCOUNTING for c in rel[0].split(","))


#: bounds of one walk of a job's cgroup (it runs every rescan, under the agent's lock):
#: Slurm's tree is job/step/task (v1) or job/step/user|slurm/task (v2)
MAX_CGROUP_DEPTH = 4
MAX_CGROUP_DIRS = 512


def cgroup_members(d: str, limit: int = 4096, max_depth: int = MAX_CGROUP_DEPTH,
                   max_dirs: int = MAX_CGROUP_DIRS) -> list[int]:
    """PIDs in a cgroup and its children (v1 lists a task only in its own cgroup); at most
    ``max_dirs`` cgroups down to ``max_depth`` levels below ``d`` are read."""
    out: list[int] = []
    seen = 0
    for base, dirs, files in os.walk(d, followlinks=False):
        seen += 1
        depth = os.path.relpath(base, d).count(os.sep) + (base != d)
        if depth >= max_depth:
            dirs[:] = []           # do not descend further
        try:
            with open(os.path.join(base, "cgroup.procs"), "rb") as f:
                out += [int(x) for x in f.read(1 << 20).split()]
        except (OSError, ValueError):
            pass
        if len(out) >= limit or seen >= max_dirs:
            break
    return sorted(set(out))[:limit]


def _status(proc: str, pid: str) -> dict[str, str]:
    """Name, Uid and PPid of ``/proc/<pid>/status`` (empty when unreadable)."""
    out: dict[str, str] = {}
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            for line in f.read(4096).decode(errors="replace").splitlines():
                k, _, v = line.partition(":")
                if k in ("Name", "Uid", "PPid"):
                    out[k] = v.strip()
    except OSError:
        pass
    return out


def _root(st: dict[str, str]) -> bool:
    """Root's process: real and saved uid 0 (slurmstepd drops its effective uid to the job
    user's for moments -- seteuid keeps the other two; no user process has either)."""
    uids = st.get("Uid", "").split()
    return len(uids) == 4 and uids[0] == "0" and uids[2] == "0"


def _is_slurmstepd(proc: str, pid: str) -> bool:
    """A real slurmstepd: root's (real and saved uid 0), the ``slurmstepd`` executable
    (``Name``, which ``exec -a`` does not change), and a root parent -- slurmd, another
    slurmstepd, or the init/subreaper slurmd's double fork leaves it to."""
    st = _status(proc, pid)
    if not _root(st) or st.get("Name") != "slurmstepd":
        return False
    ppid = st.get("PPid", "")
    return ppid == "0" or (ppid.isdigit() and _root(_status(proc, ppid)))


def slurmstepd_pids(job_id: str, proc: str = "/proc") -> list[int]:
    """PIDs of the job's ``slurmstepd: [<id>.<step>]`` processes (root's only: any user can
    ``exec -a 'slurmstepd: [<id>.0]'``)."""
    want = f"slurmstepd: [{job_id}.".encode()
    out = []
    for d in os.listdir(proc):
        if not d.isdigit():
            continue
        try:
            with open(f"{proc}/{d}/cmdline", "rb") as f:
                if f.read(256).startswith(want) and _is_slurmstepd(proc, d):
                    out.append(int(d))
        except OSError:
            pass
    return sorted(out)


class JobScopeProbe(Probe):
    """The job's own accounting (see the module docstring); ``mode`` says which source is used
    now (``cgroup``, ``process-tree`` or ``none`` before the first step)."""

    name = "jobscope"

    def __init__(self, run: RunInfo, cgroup_root: str = "/sys/fs/cgroup", proc: str = "/proc",
                 rescan_every: int = 10):
        super().__init__()
        self.job_id = str(run.job_id)
        self.uid = run.uid
        self.cgroup_root = cgroup_root
        self.proc = proc
        self.rescan_every = rescan_every
        self.mode = "none"
        self.seen: list[str] = []     # sources used over the run, in order (meta.json note)
        self._n = 0
        self._inner: CgroupProbe | None = None
        self._tree: ProcessTree | None = None
        self._map: list[tuple[int, int]] = []     # (inner index, fixed index)
        self._last: list[float] | None = None
        self._acc = [0.0] * len(CHANNELS)
        self._gen = 0                 # +1 per source dropped: readings say which they came from
        self._parsed_gen = 0

    def open(self) -> None:
        if not self.job_id or not self.job_id.replace("_", "").isdigit():
            self._unavailable(f"job id {self.job_id!r}: not a Slurm job id")
            return
        self._ready(list(CHANNELS))
        self._resolve()

    def _resolve(self) -> None:
        found = job_cgroups(self.job_id, self.uid, self.cgroup_root)
        dirs = [d for d in found if _accounting(d, self.cgroup_root)]
        if dirs:
            if self.mode != "cgroup":
                self._drop()
                inner = CgroupProbe(cgroup=dirs[0], cgroup_root=self.cgroup_root,
                                    proc=self.proc)
                inner.open()
                if inner.available:
                    self._inner, self.mode = inner, "cgroup"
                    self._map = self._mapping([c.name for c in inner.channels])
                    self._saw(f"cgroup {dirs[0]}")
            return
        members = [cgroup_members(d) for d in found]
        roots = sorted({p for m in members for p in m}) if found else []
        how = f"processes of {found[0]}" if roots else "process-tree of slurmstepd"
        roots = roots or slurmstepd_pids(self.job_id, self.proc)
        if roots:
            if self._tree is None:
                self._drop()
                self._tree = ProcessTree(roots, self.proc)
                self.mode = "process-tree"
                self._saw(how)
                from .cgroup import TREE_CHANNELS
                self._map = self._mapping([c.name for c in TREE_CHANNELS])
            else:
                self._tree.roots = roots     # new steps join, finished ones leave
                self._saw(how)
        elif self.mode == "process-tree":
            self._drop()

    def _saw(self, what: str) -> None:
        if what not in self.seen:
            self.seen.append(what)

    @staticmethod
    def _mapping(names: Sequence[str]) -> list[tuple[int, int]]:
        out = []
        for i, n in enumerate(names):
            for target in _TREE_MAP.get(n, (n,)):
                if target in _NAMES:
                    out.append((i, _NAMES.index(target)))
        return out

    def _drop(self) -> None:
        if self._inner is not None:
            self._inner.close()
        if self._tree is not None:
            self._tree.close()
        self._inner = self._tree = None
        self.mode = "none"
        self._gen += 1             # the next source starts a new baseline for the deltas

    def sample(self) -> list[float]:
        return self.parse_raw(self.read_raw())

    def read_raw(self) -> tuple:
        """The source's reading, with what parsing it needs of the source as it is now (the
        source may change before the reading is parsed)."""
        if self._n % self.rescan_every == 0:
            self._resolve()
        self._n += 1
        src: CgroupProbe | ProcessTree | None = self._inner if self._inner is not None \
            else self._tree
        return (self._gen, self.mode, self._map, src,
                None if src is None else src.read_raw())

    def parse_raw(self, raw: tuple) -> list[float]:
        gen, mode, mapping, src, reading = raw
        if gen != self._parsed_gen:
            self._last, self._parsed_gen = None, gen
        cur = [NAN] * len(CHANNELS)   # this source's values in the fixed channel order
        if src is not None:
            values = list(src.parse_raw(reading))
            for i, j in mapping:
                cur[j] = values[i]
        vals = list(cur)
        if mode == "none":
            vals[_NAMES.index("system.run.nprocs")] = 0.0
        # counters: the sum of positive changes (a finished step's processes vanish)
        last = self._last
        mapped = {j for _, j in mapping}
        for j, is_c in enumerate(_COUNTER):
            if not is_c or j not in mapped:   # a channel this source does not have stays NaN
                continue
            v = vals[j]
            if v != v:          # NaN: no source for this channel now
                vals[j] = self._acc[j] if last is not None else NAN
                continue
            if last is not None and last[j] == last[j]:
                self._acc[j] += max(0.0, v - last[j])
            vals[j] = self._acc[j]
        self._last = cur if mode != "none" else None
        return vals

    def close(self) -> None:
        self._drop()

    def describe(self) -> dict:
        d = super().describe()
        if self.available:
            d["note"] = f"job {self.job_id}: " + (", then ".join(self.seen) or
                                                    "no processes found yet")
        return d
