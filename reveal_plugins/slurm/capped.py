"""A resource cap for the Epilog's detached analysis: it runs as root on a node that already
runs the next job, so its memory and CPU are bounded, and when a cap or the timeout stops it
the run still gets a report (``status: partial`` with the reason).

The cap is, by preference (``analysis_cap = "auto"``):

* ``systemd``: a transient scope (``systemd-run --scope -p MemoryMax= -p MemorySwapMax=0
  -p CPUQuota=``) where systemd is the init system;
* ``cgroup``: a cgroup created for this analysis under ``reveal.analysis/`` (cgroup v2:
  ``memory.max``, ``memory.swap.max``, ``cpu.max``; v1: ``memory.limit_in_bytes`` (+memsw),
  ``cpu.cfs_quota_us``), entered by the child before it executes anything, removed after;
* ``rlimit``: ``RLIMIT_DATA`` (allocation fails: MemoryError) -- no CPU-rate cap, only nice.

:class:`Cap` says what it is (``kind``), wraps the child's argv, enters the cap in the child
(``preexec``), and after the child ended tells whether the memory cap killed it.
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import time
from typing import Callable

CGROOT = "/sys/fs/cgroup"
PARENT = "reveal.analysis"
CAPS = ("auto", "systemd", "cgroup", "rlimit", "off")


class Cap:
    """No cap (``off``), and the interface of the real ones."""

    kind = "off"

    def __init__(self, memory_mb: int, cpu_pct: int, nice: int, name: str):
        self.memory_mb, self.cpu_pct, self.nice, self.name = memory_mb, cpu_pct, nice, name

    def wrap(self, argv: list[str]) -> list[str]:
        return argv

    def preexec(self) -> Callable[[], None]:
        nice = self.nice

        def enter() -> None:
            os.setsid()
            try:
                os.nice(nice)
            except OSError:
                pass
        return enter

    def memory_killed(self, returncode: int) -> bool:
        return False

    def kill(self, pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass

    def cleanup(self) -> None:
        pass

    def describe(self) -> str:
        return f"{self.kind} (memory {self.memory_mb} MB, CPU {self.cpu_pct} %, nice {self.nice})"


class SystemdCap(Cap):
    kind = "systemd"

    def wrap(self, argv: list[str]) -> list[str]:
        return [shutil.which("systemd-run") or "systemd-run", "--scope", "--quiet", "--collect",
                f"--unit={self.name}", "-p", f"MemoryMax={self.memory_mb}M",
                "-p", "MemorySwapMax=0", "-p", f"CPUQuota={self.cpu_pct}%",
                f"--nice={self.nice}", "--"] + argv

    def memory_killed(self, returncode: int) -> bool:
        # the scope's OOM kill is the only SIGKILL we did not send ourselves
        return returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)


class CgroupCap(Cap):
    """A cgroup of our own (v2, or v1's memory and cpu hierarchies)."""

    kind = "cgroup"

    def __init__(self, *a, root: str | None = None):
        super().__init__(*a)
        self.root = root or CGROOT
        self.v2 = os.path.exists(os.path.join(self.root, "cgroup.controllers"))
        self.dirs: list[str] = []
        if self.v2:
            self._setup_v2()
        else:
            self._setup_v1()

    @staticmethod
    def _write(path: str, value: str) -> None:
        with open(path, "w") as f:
            f.write(value)

    def _setup_v2(self) -> None:
        ctl = open(os.path.join(self.root, "cgroup.controllers")).read().split()
        if "memory" not in ctl:
            raise OSError("cgroup v2 without the memory controller")
        parent = os.path.join(self.root, PARENT)
        os.makedirs(parent, mode=0o755, exist_ok=True)
        want = " ".join(f"+{c}" for c in ("memory", "cpu") if c in ctl)
        for d in (self.root, parent):
            self._write(os.path.join(d, "cgroup.subtree_control"), want)
        d = os.path.join(parent, self.name)
        os.mkdir(d, 0o755)
        self.dirs = [d]
        self._write(os.path.join(d, "memory.max"), str(self.memory_mb << 20))
        if os.path.exists(os.path.join(d, "memory.swap.max")):
            self._write(os.path.join(d, "memory.swap.max"), "0")
        if os.path.exists(os.path.join(d, "cpu.max")):
            self._write(os.path.join(d, "cpu.max"), f"{self.cpu_pct * 1000} 100000")

    def _setup_v1(self) -> None:
        mem = os.path.join(self.root, "memory")
        if not os.path.exists(os.path.join(mem, "memory.limit_in_bytes")):
            raise OSError(f"no cgroup memory controller under {self.root}")
        d = os.path.join(mem, PARENT, self.name)
        os.makedirs(d, mode=0o755)
        self.dirs = [d]
        self._write(os.path.join(d, "memory.limit_in_bytes"), str(self.memory_mb << 20))
        sw = os.path.join(d, "memory.memsw.limit_in_bytes")
        if os.path.exists(sw):   # no swapping around the cap (after the memory limit)
            try:
                self._write(sw, str(self.memory_mb << 20))
            except OSError:
                pass
        cpu = os.path.join(self.root, "cpu")
        if os.path.exists(os.path.join(cpu, "cpu.cfs_quota_us")):
            c = os.path.join(cpu, PARENT, self.name)
            os.makedirs(c, mode=0o755)
            self.dirs.append(c)
            period = int(open(os.path.join(c, "cpu.cfs_period_us")).read())
            self._write(os.path.join(c, "cpu.cfs_quota_us"), str(period * self.cpu_pct // 100))

    def preexec(self) -> Callable[[], None]:
        procs = [os.path.join(d, "cgroup.procs") for d in self.dirs]
        base = super().preexec()

        def enter() -> None:
            for p in procs:      # before exec: nothing runs outside the cap
                with open(p, "w") as f:
                    f.write(str(os.getpid()))
            base()
        return enter

    def _oom_kills(self) -> int:
        name = "memory.events" if self.v2 else "memory.oom_control"
        try:
            for line in open(os.path.join(self.dirs[0], name)):
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (OSError, ValueError, IndexError):
            pass
        return 0

    def memory_killed(self, returncode: int) -> bool:
        return self._oom_kills() > 0

    def kill(self, pid: int) -> None:
        super().kill(pid)
        for d in self.dirs:      # and whatever the analysis started
            try:
                for p in open(os.path.join(d, "cgroup.procs")).read().split():
                    os.kill(int(p), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def cleanup(self) -> None:
        for d in self.dirs:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:     # processes still exiting
                    time.sleep(0.05)


class RlimitCap(Cap):
    kind = "rlimit"

    def preexec(self) -> Callable[[], None]:
        limit = self.memory_mb << 20
        base = super().preexec()

        def enter() -> None:
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
            base()
        return enter

    def describe(self) -> str:
        return f"rlimit (RLIMIT_DATA {self.memory_mb} MB, no CPU-rate cap, nice {self.nice})"


def systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system") and shutil.which("systemd-run") is not None


def make_cap(kind: str, memory_mb: int, cpu_pct: int, nice: int, name: str,
             notes: list[str] | None = None) -> Cap:
    """The strongest cap available among those ``kind`` allows (``auto``: all, in order)."""
    order = {"auto": ("systemd", "cgroup", "rlimit"), "systemd": ("systemd",),
             "cgroup": ("cgroup",), "rlimit": ("rlimit",), "off": ()}[kind]
    args = (memory_mb, cpu_pct, nice, name)
    for k in order:
        if k == "systemd" and systemd_running():
            return SystemdCap(*args)
        if k == "cgroup" and os.geteuid() == 0:
            try:
                return CgroupCap(*args)
            except OSError as e:
                if notes is not None:
                    notes.append(f"no cgroup for the analysis ({e})")
        if k == "rlimit":
            return RlimitCap(*args)
    return Cap(*args)
