"""Which GPU each worker process computes on, from NVML (no code in the worker needed).

A worker shows up in ``nvmlDeviceGetComputeRunningProcesses`` once it has created its CUDA
context, usually a few seconds after it starts.  ``GpuMapper`` polls NVML for the worker PIDs
it was told about (every ``poll_s``, for at most ``give_up_s`` after each start) and reports
each found PID once.  Without NVML (no driver, no GPU, no nvidia-ml-py) it does nothing, at no
cost.  PIDs are those NVML sees: inside a container with its own PID namespace they may not
match, and the worker's own report (``instrument()``) is then the source.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ..probes.gpu_procs import running_processes

log = logging.getLogger(__name__)


def _load_nvml() -> Any | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception as e:  # ImportError, NVMLError (no driver / no GPU), OSError
        log.debug("NVML unavailable: %s", e)
        return None


def gpus_of_pids(nvml: Any, pids: set[int]) -> dict[int, list[dict[str, Any]]]:
    """``{pid: [{"gpu": NVML index, "gpu_uuid": ...}]}`` for those ``pids`` NVML lists."""
    out: dict[int, list[dict[str, Any]]] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            procs = running_processes(nvml, h)
        except Exception as e:
            log.debug("NVML device %d: %s", i, e)
            continue
        uuid = None
        for p in procs:
            if p.pid in pids:
                if uuid is None:
                    try:
                        uuid = nvml.nvmlDeviceGetUUID(h)
                        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                    except Exception:
                        uuid = ""
                out.setdefault(p.pid, []).append({"gpu": i, "gpu_uuid": uuid or None})
    return out


class GpuMapper:
    """Background poller: ``track(pid, info)``; calls ``found(info, gpus)`` once per PID."""

    def __init__(self, found: Callable[[dict[str, Any], list[dict[str, Any]]], None],
                 poll_s: float = 2.0, give_up_s: float = 120.0,
                 loader: Callable[[], Any | None] = _load_nvml) -> None:
        self.found = found
        self.poll_s = poll_s
        self.give_up_s = give_up_s
        self._loader = loader
        self._nvml: Any | None = None
        self._tried = False
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[float, dict[str, Any]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, pid: int, info: dict[str, Any]) -> None:
        with self._lock:
            if not self._tried:
                self._tried = True
                self._nvml = self._loader()
                if self._nvml is not None:
                    self._thread = threading.Thread(target=self._loop, name="reveal-gpu-map",
                                                    daemon=True)
                    self._thread.start()
            if self._nvml is None:
                return
            self._pending[pid] = (time.monotonic() + self.give_up_s, info)

    def poll_once(self) -> None:
        with self._lock:
            now = time.monotonic()
            for pid in [p for p, (dl, _) in self._pending.items() if dl < now]:
                del self._pending[pid]
            pending = dict(self._pending)
        if not pending or self._nvml is None:
            return
        try:
            hits = gpus_of_pids(self._nvml, set(pending))
        except Exception as e:
            log.debug("NVML query failed: %s", e)
            return
        for pid, gpus in hits.items():
            with self._lock:
                entry = self._pending.pop(pid, None)
            if entry is not None:
                try:
                    self.found(entry[1], gpus)
                except Exception as e:
                    log.debug("GPU mapping not recorded: %s", e)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll_once()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.poll_s + 1)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
