"""Foreign work on a run's GPUs: processes on them that are not the run's.

A leftover process of an earlier job, another user's notebook or a monitoring tool that holds a
CUDA context takes GPU memory and SM time from the job; NVML lists them (compute and graphics
process lists) and, where the driver keeps per-process samples, their SM share.  Per GPU of the
run, once a second: ``gpu.<i>.foreign_procs`` (count), ``gpu.<i>.foreign_mem`` (bytes they
hold) and ``gpu.<i>.foreign_sm`` (% SM time they used, where NVML gives it).

Which processes are the run's: members of the run's cgroup when it has one, else descendants
of the run's processes (``reveal record``/``reveal-torchrun`` register their own PID), else --
a Slurm job known by id only -- processes of the job's user.  The run directory gets counts and
sizes only; PIDs and command lines of foreign processes go to the agent's own log (root's).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..types import ChannelMeta, RunInfo
from .probe import NAN, Probe

log = logging.getLogger(__name__)


def running_processes(nv: Any, h: Any, kind: str = "Compute") -> list:
    """``nvmlDeviceGet{Compute,Graphics}RunningProcesses``, also on drivers before r510: the
    binding's plain call asks for the _v3 structs only and, without them, raises
    ``NVMLLibraryMismatchError`` (not an NVMLError) or FunctionNotFound; _v2 then answers."""
    try:
        return getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses")(h)
    except (nv.NVMLError_FunctionNotFound,
            getattr(nv, "NVMLLibraryMismatchError", nv.NVMLError_FunctionNotFound)):
        return getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses_v2")(h)


class GpuForeignProbe(Probe):
    name = "nvml.foreign"
    interval_s = 1.0

    def __init__(self, run: RunInfo, proc: str = "/proc"):
        super().__init__()
        self.run, self.proc = run, proc
        self.nv: Any = None
        self._h: list[tuple[int, Any]] = []
        self._putil = True
        self._last_ts: dict[int, int] = {}
        self._mine: dict[int, bool] = {}
        self._logged: set[int] = set()
        self._roots = {int(p) for p in (run.pids or [])}

    def open(self) -> None:
        try:
            import pynvml as nv
            nv.nvmlInit()
        except Exception as e:
            self._unavailable(f"NVML not available: {e}")
            return
        self.nv = nv
        try:
            want = self.run.gpus if self.run.gpus is not None else \
                list(range(nv.nvmlDeviceGetCount()))
            for i in want:
                try:
                    self._h.append((i, nv.nvmlDeviceGetHandleByIndex(i)))
                except nv.NVMLError as e:
                    log.debug("GPU %d: %s", i, e)
        except nv.NVMLError as e:
            self.close()
            self._unavailable(f"NVML: {e}")
            return
        if not self._h:
            self.close()
            self._unavailable("no GPU of this run could be opened")
            return
        if not hasattr(nv, "nvmlDeviceGetProcessUtilization"):
            self._putil = False
        chans: list[ChannelMeta] = []
        for i, _ in self._h:
            chans += [ChannelMeta(f"gpu.{i}.foreign_procs", "procs", "gauge", self.name,
                                  "processes on this GPU that are not the run's"),
                      ChannelMeta(f"gpu.{i}.foreign_mem", "bytes", "gauge", self.name,
                                  "GPU memory held by processes that are not the run's")]
            if self._putil:
                chans.append(ChannelMeta(f"gpu.{i}.foreign_sm", "%", "gauge", self.name,
                                         "SM time used by processes that are not the run's"))
        self._ready(chans)

    # -- whose process ---------------------------------------------------------------------
    def _is_run(self, pid: int) -> bool:
        hit = self._mine.get(pid)
        if hit is None:
            hit = self._mine[pid] = self._decide(pid)
        return hit

    def _decide(self, pid: int) -> bool:
        run = self.run
        if run.cgroup:
            rel = run.cgroup.split("/sys/fs/cgroup", 1)[-1].rstrip("/") or "/"
            # v2: the path as is; v1: without the controller folder (memory/, cpuacct/ ...)
            rels = {rel, "/" + rel.lstrip("/").partition("/")[2]} - {"/", ""}
            try:
                with open(f"{self.proc}/{pid}/cgroup") as f:
                    paths = [ln.rstrip("\n").split(":", 2)[-1] for ln in f]
            except OSError:
                return False
            return any(p == r or p.startswith(r + "/") for p in paths for r in rels)
        if self._roots:
            cur = pid
            for _ in range(64):  # bounded walk up the process tree
                if cur in self._roots:
                    return True
                try:
                    with open(f"{self.proc}/{cur}/stat", "rb") as f:
                        cur = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    return False
                if cur <= 1:
                    return False
            return False
        if run.uid is not None:
            try:
                return os.stat(f"{self.proc}/{pid}").st_uid == run.uid
            except OSError:
                return False
        return False

    def _log_foreign(self, gpu: int, pid: int) -> None:
        if pid in self._logged or len(self._logged) > 1024:
            return
        self._logged.add(pid)
        try:
            with open(f"{self.proc}/{pid}/cmdline", "rb") as f:
                cmd = f.read(256).replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        log.info("run %s: GPU %d has a foreign process pid %d (%s)", self.run.run_id, gpu,
                 pid, cmd)

    # -- sample ----------------------------------------------------------------------------
    def sample(self) -> list[float]:
        nv = self.nv
        out: list[float] = []
        seen: set[int] = set()
        for i, h in self._h:
            procs: dict[int, float] = {}
            try:
                for kind in ("Compute", "Graphics"):
                    for p in running_processes(nv, h, kind):
                        mem = p.usedGpuMemory
                        procs[int(p.pid)] = float(mem) if isinstance(mem, int) else NAN
            except nv.NVMLError:
                out += [NAN, NAN] + ([NAN] if self._putil else [])
                continue
            seen.update(procs)
            foreign = {pid: m for pid, m in procs.items() if not self._is_run(pid)}
            for pid in foreign:
                self._log_foreign(i, pid)
            mem = sum(v for v in foreign.values() if v == v) if foreign else 0.0
            out += [float(len(foreign)), mem]
            if self._putil:
                out.append(self._foreign_sm(i, h, foreign))
        for pid in [p for p in self._mine if p not in seen]:
            del self._mine[pid]   # PIDs are reused: decide again when one comes back
        return out

    def _foreign_sm(self, i: int, h: Any, foreign: dict[int, float]) -> float:
        nv = self.nv
        if not foreign:
            return 0.0
        last = self._last_ts.get(i, int((time.time() - 2.0) * 1e6))
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, last)
        except nv.NVMLError as e:
            # NOT_FOUND: no sample since `last` (nothing ran); others: not measurable here
            return 0.0 if getattr(e, "value", None) == 6 else NAN
        best: dict[int, float] = {}
        for s in samples:
            self._last_ts[i] = max(self._last_ts.get(i, 0), int(s.timeStamp))
            if int(s.pid) in foreign:
                best[int(s.pid)] = max(best.get(int(s.pid), 0.0), float(s.smUtil))
        return min(100.0, sum(best.values()))

    def close(self) -> None:
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:
                pass
            self.nv = None
