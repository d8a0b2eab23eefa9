"""Capture torchelastic's own events and metrics into the run's ``events.jsonl``.

torchelastic reports what its agent does through two public channels:

* ``torch.distributed.elastic.events``: ``Event`` objects (worker START per worker and attempt,
  worker SUCCEEDED/FAILED/TERMINATED at the end, agent state changes) logged to the handler
  named by ``--event-log-handler`` (default ``null``), and ``RdzvEvent`` objects (every
  rendezvous step) logged to the ``dynamic_rendezvous`` handler;
* the ERROR line of ``torch.distributed.elastic.multiprocessing.api`` naming the first failed
  worker of a group (the only place a failure that leads to a restart is reported);
* ``torch.distributed.elastic.metrics``: ``put_metric`` values (restarts left, run states,
  ``@prof`` durations of rendezvous / start / stop) sent to the handler configured for the
  ``torchelastic`` group.

``install(sink)`` puts a tee in front of those handlers (whatever the user chose keeps
working) and turns each record into a flat ``elastic`` event.  Call it before
``torch.distributed.run.main``.  ``sink(event_name, t, **fields)`` must not raise (``fields`` has a ``name`` key: take the
first two parameters positionally).
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

Sink = Callable[..., None]
_MAX_ERROR = 2000  # raw_error / error_trace can be whole tracebacks: keep the head


def _flat_worker_event(ev: Any) -> dict[str, Any]:
    """Flatten a torchelastic ``Event`` into the fields of an ``elastic`` event."""
    md = dict(ev.metadata or {})
    inner: dict[str, Any] = {}
    try:
        inner = json.loads(md.pop("metadata", None) or "{}")
    except (TypeError, ValueError):
        pass

    def one(v: Any) -> Any:  # torchelastic wraps some values in 1-tuples (lists after JSON)
        return v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v

    out: dict[str, Any] = {
        "kind": "worker" if str(ev.source).endswith("WORKER") else "agent",
        "name": ev.name,
        "state": md.get("state"),
        "rdzv_id": md.get("run_id"),
        "group_rank": md.get("group_rank"),
        "global_rank": md.get("global_rank"),
        "local_rank": one(inner.get("local_rank")),
        "role": md.get("role"),
        "hostname": md.get("hostname"),
        "restart": md.get("agent_restarts"),
        "group_world_size": inner.get("group_world_size"),
        "entry_point": inner.get("entry_point"),
        "exit_code": one(inner.get("exit_code")),
    }
    wid = md.get("worker_id")
    pid = one(inner.get("worker_pid"))
    if pid is None and wid not in (None, "None", ""):
        try:
            pid = int(wid)  # LocalElasticAgent: worker id == PID
        except ValueError:
            pass
    out["pid"] = pid
    if md.get("duration_ms") is not None:
        out["duration_ms"] = md["duration_ms"]
    if md.get("raw_error"):
        out["error"] = str(md["raw_error"])[:_MAX_ERROR]
    return {k: v for k, v in out.items() if v is not None}


# Rendezvous housekeeping repeated every few seconds while training runs: not worth a line.
_RDZV_NOISE = ("._keep_alive", "_DistributedRendezvousOpExecutor.run")


def _flat_rdzv_event(ev: Any) -> dict[str, Any] | None:
    if str(ev.name).endswith(_RDZV_NOISE):
        return None
    out = {
        "kind": "rendezvous",
        "name": ev.name,
        "rdzv_id": ev.run_id,
        "message": ev.message,
        "hostname": ev.hostname,
        "pid": ev.pid,
        "node_state": getattr(ev.node_state, "value", str(ev.node_state)),
        "master_endpoint": ev.master_endpoint or None,
        "rank": ev.rank,
        "local_id": ev.local_id,
    }
    if ev.error_trace:
        out["error"] = ev.error_trace[-_MAX_ERROR:]
    return {k: v for k, v in out.items() if v is not None}


class _TeeHandler(logging.Handler):
    """Sends each event record to ``sink`` and then to the handler it replaced."""

    def __init__(self, sink: Sink, parse: Callable[[str], Any], flatten: Callable[[Any], dict],
                 inner: logging.Handler | None) -> None:
        super().__init__()
        self.sink, self.parse, self.flatten, self.inner = sink, parse, flatten, inner

    def emit(self, record: logging.LogRecord) -> None:
        try:
            ev = self.parse(record.getMessage())
            ts = getattr(ev, "timestamp", None)
            t = ts / 1000.0 if isinstance(ts, (int, float)) and ts > 0 else time.time()
            fields = self.flatten(ev)
            if fields is not None:
                self.sink("elastic", t, **fields)
        except Exception as e:  # a telemetry bug must never break the launch
            log.debug("elastic event not recorded: %s", e)
        if self.inner is not None and not isinstance(self.inner, logging.NullHandler):
            self.inner.handle(record)


class _FailureLogHandler(logging.Handler):
    """torchelastic reports a failed worker group (before restarting it) only in a log line of
    ``torch.distributed.elastic.multiprocessing.api``; its events carry failures only at the
    very end.  This turns that line into a ``FAILED`` worker event."""

    TEMPLATE = "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s"

    def __init__(self, sink: Sink) -> None:
        super().__init__(level=logging.ERROR)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.msg != self.TEMPLATE or not isinstance(record.args, tuple):
                return
            code, local_rank, pid, _binary = record.args
            self.sink("elastic", record.created, kind="worker",
                      name="torchelastic.worker.status.FAILED", state="FAILED",
                      exit_code=code, local_rank=local_rank, pid=pid,
                      source="torch.distributed.elastic.multiprocessing")
        except Exception as e:
            log.debug("worker failure not recorded: %s", e)


FAILURE_LOGGER = "torch.distributed.elastic.multiprocessing.api"


def install(sink: Sink, event_log_handler: str = "null") -> Callable[[], None]:
    """Route torchelastic events and metrics to ``sink``; returns a function that undoes it."""
    from torch.distributed.elastic import events as tev
    from torch.distributed.elastic import metrics as tmetrics
    from torch.distributed.elastic.events import handlers as th
    from torch.distributed.elastic.events.api import Event, RdzvEvent

    saved = dict(th._log_handlers)
    if event_log_handler not in th._log_handlers:
        raise ValueError(f"--event-log-handler {event_log_handler!r}: not one of "
                         f"{sorted(th._log_handlers)}")
    tees = {
        event_log_handler: _TeeHandler(sink, Event.deserialize, _flat_worker_event,
                                       saved[event_log_handler]),
        "dynamic_rendezvous": _TeeHandler(sink, RdzvEvent.deserialize, _flat_rdzv_event,
                                          saved.get("dynamic_rendezvous")),
    }
    for dest, tee in tees.items():
        th._log_handlers[dest] = tee
        lg = tev._events_loggers.get(dest)  # a logger made earlier keeps its old handler
        if lg is not None:
            lg.addHandler(tee)

    class _Metrics(tmetrics.MetricHandler):
        def emit(self, m: Any) -> None:
            try:
                sink("elastic", m.timestamp if m.timestamp > 1e9 else time.time(),
                     kind="metric", metric=m.name, value=m.value, group=m.group_name)
            except Exception as e:
                log.debug("elastic metric not recorded: %s", e)

    old_metrics = tmetrics.getStream("torchelastic").handler
    metric_handler = _Metrics()
    tmetrics.configure(metric_handler, group="torchelastic")

    fail_logger = logging.getLogger(FAILURE_LOGGER)
    fail_handler = _FailureLogHandler(sink)
    fail_logger.addHandler(fail_handler)

    def uninstall() -> None:
        fail_logger.removeHandler(fail_handler)
        th._log_handlers.clear()
        th._log_handlers.update(saved)
        for dest, tee in tees.items():
            lg = tev._events_loggers.get(dest)
            if lg is not None:
                lg.removeHandler(tee)
                if not lg.handlers:
                    tev._events_loggers.pop(dest, None)
        tmetrics.configure(old_metrics, group="torchelastic")

    return uninstall
