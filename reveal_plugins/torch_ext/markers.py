"""Iteration markers: the worker side (``instrument()``) and the launcher side (``MarkerReceiver``).

A worker calls ``instrument()`` once (or sets ``REVEAL_ITERATION_MARKERS=1`` under
``reveal-torchrun``).  It registers a global optimizer step post-hook that appends the wall-clock
end time of each step to a list -- nothing else on the hot path -- and every ``FLUSH_S`` seconds
(or ``FLUSH_N`` steps) sends the batch as one Unix datagram to the launcher's socket named by
``$REVEAL_MARKER_SOCK``.  Sending never blocks: when the launcher is gone or its queue is full the
batch is dropped and counted.  The launcher's ``MarkerReceiver`` turns batches into ``iteration``
events (see ``iteration_events``) and the first batch of each worker into a ``rank`` event.

Datagram: ``<header JSON>\\0<float64 step end times>``; the header carries rank, local_rank,
group_rank, world_size, pid, host, restart attempt, first step number, drops, and gpu.
"""
from __future__ import annotations

import array
import atexit
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

ENV_SOCK = "REVEAL_MARKER_SOCK"
ENV_AUTO = "REVEAL_ITERATION_MARKERS"
FLUSH_S = 0.5           # at most this long between batches (bounds what a crash loses)
FLUSH_N = 1024          # and at most this many steps per batch (8 KiB datagram)
MIN_EVENT_SPAN_S = 0.1  # launcher side: merge steps so a rank writes <= ~10 events/s

_lock = threading.Lock()
_marker: "_Marker | None" = None


def _gpu_of_this_process() -> int | None:
    """Host GPU index this process computes on, if CUDA is already initialised (never initialises
    it: that would cost seconds and memory in a CPU-only job)."""
    try:
        import torch
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        dev = torch.cuda.current_device()
    except Exception:
        return None
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in vis.split(",") if v.strip()]
    if ids and dev < len(ids):
        return int(ids[dev]) if ids[dev].isdigit() else None
    return dev


class _Marker:
    """Per-process state of the step hook.  ``hook`` is the hot path: keep it tiny."""

    def __init__(self, sock_path: str | None) -> None:
        self.sock_path = sock_path
        self.sock: socket.socket | None = None
        if sock_path:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.sock.setblocking(False)
        self.times: list[float] = []
        self.first_step = 1            # step number of times[0]
        self.step = 0
        self.next_flush = 0.0
        self.sent = 0
        self.dropped = 0
        self.batches = 0
        self.opt_id: int | None = None  # the optimizer whose steps count as iterations
        self.env = {
            "rank": int(os.environ.get("RANK", "0")),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "group_rank": int(os.environ.get("GROUP_RANK", "0")),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "host": socket.gethostname(),
        }
        self.handle: Any = None

    def hook(self, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
        t = time.time()
        if self.opt_id is None:
            self.opt_id = id(optimizer)
        elif id(optimizer) != self.opt_id:
            return  # several optimizers: the first one that steps defines an iteration
        self.step += 1
        self.times.append(t)
        if t >= self.next_flush or len(self.times) >= FLUSH_N:
            self.flush(t)

    def flush(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.next_flush = now + FLUSH_S
        if not self.times:
            return
        times, self.times = self.times, []
        first, self.first_step = self.first_step, self.first_step + len(times)
        if self.sock is None:
            return
        hdr = dict(self.env, pid=os.getpid(), first_step=first, dropped=self.dropped,
                   batch=self.batches)
        if self.batches == 0:
            hdr["gpu"] = _gpu_of_this_process()
        payload = json.dumps(hdr).encode() + b"\0" + array.array("d", times).tobytes()
        self.batches += 1
        try:
            self.sock.sendto(payload, self.sock_path)
            self.sent += len(times)
        except OSError:  # launcher gone, queue full, socket removed: never disturb training
            self.dropped += len(times)


def instrument(optimizer: Any = None, sock_path: str | None = None) -> bool:
    """Report each optimizer step as an iteration marker to ``reveal-torchrun``.

    Call once per worker process, any time before training (idempotent).  With ``optimizer``
    only that optimizer's steps count; otherwise the first optimizer that steps defines an
    iteration.  Returns True when markers go to a launcher (``$REVEAL_MARKER_SOCK`` is set), False
    when there is nobody to receive them (the hook is then not installed: zero cost).
    """
    global _marker
    with _lock:
        if _marker is not None:
            return _marker.sock is not None
        path = sock_path or os.environ.get(ENV_SOCK)
        if not path:
            log.info("reveal instrument(): $%s not set (not under reveal-torchrun); "
                     "iteration markers off", ENV_SOCK)
            return False
        import torch.optim.optimizer as _opt
        m = _Marker(path)
        m.next_flush = time.time() + FLUSH_S
        if optimizer is not None:
            m.handle = optimizer.register_step_post_hook(m.hook)
        else:
            m.handle = _opt.register_optimizer_step_post_hook(m.hook)
        atexit.register(m.flush)
        _marker = m
        return True


def uninstrument() -> None:
    """Flush and remove the hook (tests, benchmarks)."""
    global _marker
    with _lock:
        m, _marker = _marker, None
    if m is not None:
        m.flush()
        if m.handle is not None:
            m.handle.remove()
        atexit.unregister(m.flush)
        if m.sock is not None:
            m.sock.close()


def maybe_auto_instrument() -> bool:
    """Honour ``REVEAL_ITERATION_MARKERS=1`` (called by the worker bootstrap)."""
    if os.environ.get(ENV_AUTO, "") in ("", "0", "false", "no", "off"):
        return False
    return instrument()


class _OptimizerWatcher:
    """Meta-path finder that calls ``maybe_auto_instrument()`` right after
    ``torch.optim.optimizer`` is first imported -- so the worker bootstrap never imports torch
    itself (the script may still set up its environment before ``import torch``)."""

    TARGET = "torch.optim.optimizer"

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.TARGET:
            return None
        import importlib.util
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        orig = loader.exec_module

        def exec_module(module: Any) -> None:
            orig(module)
            try:
                maybe_auto_instrument()
            except Exception as e:  # never break the user's import of torch
                log.warning("reveal: iteration markers not installed: %s", e)
        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_import_hook() -> None:
    """Worker bootstrap for ``REVEAL_ITERATION_MARKERS=1`` (see launcher.BOOTSTRAP)."""
    if os.environ.get(ENV_AUTO, "") in ("", "0", "false", "no", "off"):
        return
    if _OptimizerWatcher.TARGET in sys.modules:
        maybe_auto_instrument()
    elif not any(isinstance(f, _OptimizerWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _OptimizerWatcher())


# ----------------------------------------------------------------------------- launcher side

def decode(payload: bytes) -> tuple[dict[str, Any], list[float]]:
    """Split one datagram into (header dict, step end times); ValueError when malformed."""
    head, sep, body = payload.partition(b"\0")
    if not sep:
        raise ValueError("marker datagram without header separator")
    hdr = json.loads(head)
    if not isinstance(hdr, dict) or "rank" not in hdr or "first_step" not in hdr:
        raise ValueError(f"marker header lacks rank/first_step: {head[:200]!r}")
    if len(body) % 8:
        raise ValueError(f"marker body of {len(body)} bytes is not a float64 array")
    return hdr, array.array("d", body).tolist()


def iteration_events(rank: int, first_step: int, times: list[float], prev_t: float | None,
                     min_span: float = MIN_EVENT_SPAN_S) -> list[dict[str, Any]]:
    """``iteration`` events for consecutive step end ``times`` of one rank.

    ``prev_t`` is the end time of step ``first_step - 1`` (None when unknown: the first step then
    has no duration and yields no event).  Steps shorter than ``min_span`` are merged so that
    each event covers at least ``min_span`` seconds: ``n`` steps ending at step ``step`` at time
    ``t``, ``dt`` = mean seconds per step over them, ``dt_max`` = the longest of them.
    """
    out: list[dict[str, Any]] = []
    n = 0
    span = 0.0
    dmax = 0.0
    for i, t in enumerate(times):
        if prev_t is not None:
            d = t - prev_t
            n += 1
            span += d
            dmax = max(dmax, d)
            if span >= min_span:
                ev = {"t": t, "rank": rank, "step": first_step + i, "dt": span / n}
                if n > 1:
                    ev["n"] = n
                    ev["dt_max"] = dmax
                out.append(ev)
                n, span, dmax = 0, 0.0, 0.0
        prev_t = t
    if n:  # a tail shorter than min_span: still report it (the batch may be the last one)
        ev = {"t": times[-1], "rank": rank, "step": first_step + len(times) - 1, "dt": span / n}
        if n > 1:
            ev["n"] = n
            ev["dt_max"] = dmax
        out.append(ev)
    return out


class MarkerReceiver:
    """Launcher side: a Unix datagram socket and a thread turning batches into events.

    ``emit(events)`` is called from the receiver thread with the list of events one datagram
    yields (dicts with ``t`` and ``event``): ``iteration`` events, and a ``rank`` event for
    a worker's first batch when it knows its GPU.
    """

    def __init__(self, sock_path: str, emit: Callable[..., Any]) -> None:
        self.path = sock_path
        self.emit = emit
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.bind(sock_path)
        os.chmod(sock_path, 0o600)  # only this user's workers may send
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._last: dict[tuple[int, int], tuple[int, float]] = {}  # (rank, pid) -> (step, t)
        self.seen: dict[tuple[int, int], dict[str, Any]] = {}
        self.steps = 0
        self.dropped = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._loop, name="reveal-markers", daemon=True)

    def start(self) -> "MarkerReceiver":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(1 << 17)
            except socket.timeout:
                continue
            except OSError:
                return
            self.handle(data)

    def handle(self, data: bytes) -> None:
        try:
            hdr, times = decode(data)
        except (ValueError, UnicodeDecodeError) as e:
            self.errors += 1
            if self.errors <= 3:
                log.warning("reveal-torchrun: ignored a malformed iteration marker (%s)", e)
            return
        rank, pid = int(hdr["rank"]), int(hdr.get("pid", 0))
        key = (rank, pid)
        out: list[dict[str, Any]] = []
        if key not in self.seen:
            self.seen[key] = hdr
            if hdr.get("gpu") is not None:
                out.append({"t": times[0] if times else time.time(), "event": "rank",
                            **{k: hdr.get(k) for k in ("rank", "local_rank", "group_rank",
                                                       "world_size", "pid", "host", "restart",
                                                       "gpu")}, "gpu_source": "worker"})
        last = self._last.get(key)
        first = int(hdr["first_step"])
        prev_t = last[1] if last and last[0] == first - 1 else None
        self.dropped = max(self.dropped, int(hdr.get("dropped", 0)))
        for ev in iteration_events(rank, first, times, prev_t):
            out.append({"t": ev.pop("t"), "event": "iteration", **ev})
        if times:
            self._last[key] = (first + len(times) - 1, times[-1])
            self.steps += len(times)
        if out:
            try:
                self.emit(out)
            except Exception as e:
                log.debug("iteration events lost: %s", e)

    def close(self, drain_s: float = 0.3) -> None:
        """Stop after draining what workers flushed at exit."""
        deadline = time.time() + drain_s
        self.sock.settimeout(0.05)
        self._stop.set()
        self._thread.join(timeout=1.0)
        while time.time() < deadline:
            try:
                data = self.sock.recv(1 << 17)
            except (socket.timeout, BlockingIOError):
                break
            except OSError:
                break
            self.handle(data)
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

