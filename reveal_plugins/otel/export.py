"""Sending spans over OTLP (http/protobuf or gRPC) within a time budget.

The end of a job waits on the sink hook, so :func:`send_spans` never blocks the caller for
more than ``budget_s``: the export runs in a daemon thread whose request timeout is the budget;
the caller goes on when the budget is spent or as soon as a first attempt fails (connection
refused, an error status), while the exporter's retries finish in the background (the report
stays on disk for ``reveal otel export``).  The exporters' own log lines (one per retry) are captured and replaced by a single
warning naming the endpoint, logged once per endpoint and process.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..store.rundir import write_file
from .config import OtelConfig, redact_url

log = logging.getLogger(__name__)

STATUS_FILE = "otel.json"
BATCH_SPANS = 512          # spans per request: ~1 MiB with full anomaly attributes
_OTLP_LOGGERS = ("opentelemetry.exporter",)
warned_endpoints: set[str] = set()
warned_lock = threading.Lock()


@dataclass
class ExportOutcome:
    """What happened to one export (also written to ``<run_dir>/otel.json``)."""

    ok: bool
    finished: bool          # False: the caller went on first (budget spent, or a first
                            # attempt failed while the exporter's retries went on)
    seconds: float          # how long the caller waited
    spans: int
    endpoint: str
    protocol: str
    trace_id: str = ""
    error: str | None = None
    t: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _recording_session(on_error: Callable[[], None] | None = None) -> Any:
    """A requests session that remembers why the last request failed (connection refused,
    read timeout, HTTP status): the HTTP exporter only says 'failed'."""
    import requests

    class RecordingSession(requests.Session):
        last_error: str | None = None

        def request(self, *a: Any, **kw: Any) -> Any:  # type: ignore[override]
            try:
                resp = super().request(*a, **kw)
            except requests.RequestException as e:
                cause = e.args[0] if e.args else e
                reason = getattr(cause, "reason", None) or cause
                self.last_error = f"{type(e).__name__}: {reason}"[:300]
                if on_error is not None:
                    on_error()
                raise
            if resp.status_code >= 400:
                self.last_error = f"HTTP {resp.status_code} {resp.reason}"
                if on_error is not None:
                    on_error()
            return resp

    return RecordingSession()


def make_span_exporter(cfg: OtelConfig, timeout_s: float | None = None,
                       session: Any = None) -> SpanExporter:
    """An OTLP span exporter for ``cfg`` (nothing is sent until ``export``); ``session`` is the
    requests session of the HTTP exporter."""
    timeout = float(timeout_s if timeout_s is not None else cfg.timeout_s)
    if cfg.protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        creds = None
        insecure = cfg.grpc_insecure("traces")
        if not insecure and cfg.certificate:
            with open(cfg.certificate, "rb") as f:
                creds = grpc.ssl_channel_credentials(f.read())
        return OTLPSpanExporter(endpoint=cfg.signal_endpoint("traces"), insecure=insecure,
                                credentials=creds, headers=dict(cfg.headers) or None,
                                timeout=timeout,
                                compression=grpc.Compression.Gzip if cfg.compression == "gzip"
                                else grpc.Compression.NoCompression)
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter(endpoint=cfg.signal_endpoint("traces"),
                            certificate_file=cfg.certificate, headers=dict(cfg.headers),
                            timeout=timeout, session=session,
                            compression=Compression.Gzip if cfg.compression == "gzip"
                            else Compression.NoCompression)


class _Capture(logging.Handler):
    """Collects the OTLP exporters' warnings per exporting thread while our exports run (the
    exporters log on the thread that calls ``export``), and keeps them from the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.by_thread: dict[int, list[str]] = {}
        self.callbacks: dict[int, Callable[[], None]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        msgs = self.by_thread.get(record.thread or 0)
        if msgs is not None and record.levelno >= logging.WARNING:
            try:
                msgs.append(record.getMessage())
            except Exception:  # a malformed record must not break the export
                pass
            cb = self.callbacks.get(record.thread or 0)
            if cb is not None:
                cb()


_capture_lock = threading.Lock()
_capture = _Capture()
_saved: dict[str, bool] = {}
_removed_filters: list[tuple[logging.Logger, list[logging.Filter]]] = []


def capture_on(on_warning: Callable[[], None] | None = None) -> None:
    """Start capturing the exporters' log records of the calling thread (``on_warning`` is
    called at each warning: the exporter is retrying or has failed)."""
    with _capture_lock:
        if not _capture.by_thread:
            for name in _OTLP_LOGGERS:
                lg = logging.getLogger(name)
                _saved[name] = lg.propagate
                lg.addHandler(_capture)
                lg.propagate = False
            # The SDK drops a repeated message within 20 s (DuplicateFilter); we need each
            # export's own reason, and we do the rate limiting ourselves (warn_once).
            for name, lg in list(logging.root.manager.loggerDict.items()):
                if name.startswith(_OTLP_LOGGERS) and isinstance(lg, logging.Logger):
                    dups = [f for f in lg.filters if type(f).__name__ == "DuplicateFilter"]
                    for f in dups:
                        lg.removeFilter(f)
                    if dups:
                        _removed_filters.append((lg, dups))
        _capture.by_thread[threading.get_ident()] = []
        if on_warning is not None:
            _capture.callbacks[threading.get_ident()] = on_warning


def capture_off() -> list[str]:
    """Stop capturing for the calling thread; return what it logged."""
    with _capture_lock:
        msgs = _capture.by_thread.pop(threading.get_ident(), [])
        _capture.callbacks.pop(threading.get_ident(), None)
        if not _capture.by_thread:
            for name in _OTLP_LOGGERS:
                lg = logging.getLogger(name)
                lg.removeHandler(_capture)
                lg.propagate = _saved.get(name, True)
            for lg, dups in _removed_filters:
                for f in dups:
                    lg.addFilter(f)
            _removed_filters.clear()
        return msgs


class _RedactFilter(logging.Filter):
    """Masks known credentials in the HTTP libraries' own records (urllib3 logs each request
    line, query string included, at DEBUG)."""

    secrets: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            try:
                msg = record.getMessage()
            except Exception:  # a malformed record: leave it to logging
                return True
            red = msg
            for x in self.secrets:
                red = red.replace(x, "***")
            if red != msg:
                record.msg, record.args = red, ()
        return True


_redact_filter = _RedactFilter()
_REDACTED_LOGGERS = ("urllib3.connectionpool", "urllib3.util.retry", "requests",
                     "grpc._channel", "grpc._cython.cygrpc")


def guard_logs(cfg: OtelConfig) -> None:
    """Before an export with ``cfg``: make sure the libraries' log records cannot carry its
    credentials (the filter is installed once; later configs add their secrets)."""
    new = [x for x in cfg.secrets() if x not in _redact_filter.secrets]
    if not new:
        return
    with warned_lock:
        _redact_filter.secrets = sorted(set(_redact_filter.secrets) | set(new), key=len,
                                        reverse=True)
        for name in _REDACTED_LOGGERS:
            lg = logging.getLogger(name)
            if _redact_filter not in lg.filters:
                lg.addFilter(_redact_filter)


def warn_once(endpoint: str, message: str) -> bool:
    """Log ``message`` once per endpoint and process; True when it was logged."""
    with warned_lock:
        if endpoint in warned_endpoints:
            log.debug("%s", message)
            return False
        warned_endpoints.add(endpoint)
    log.warning("%s", message)
    return True


def reset_warnings() -> None:
    """Forget which endpoints were warned about (tests; a long-lived process after recovery)."""
    with warned_lock:
        warned_endpoints.clear()


def failure_reason(messages: list[str]) -> str:
    """The most telling of the exporter's messages: the first (the cause), without its retry
    boilerplate."""
    if not messages:
        return "export failed"
    m = re.sub(r"^Transient error\s+", "", messages[0])
    m = re.sub(r"\s*encountered while exporting.*$", "", m)
    return m[:500]


def send_spans(spans: Sequence[ReadableSpan], cfg: OtelConfig, budget_s: float | None = None,
               exporter: SpanExporter | None = None,
               on_late: Callable[[ExportOutcome], None] | None = None) -> ExportOutcome:
    """Export ``spans``; return within ``budget_s`` (None: wait up to ``cfg.timeout_s``).

    Never raises for backend trouble: down, refusing (HTTP 4xx/5xx, gRPC errors) or slow
    backends come back as ``ok=False`` with the reason, logged once per endpoint.  With a
    budget, the first failed attempt (connection refused, an error status) ends the wait at
    once: the exporter's retries go on in the background until the budget's deadline, and if
    they succeed after the caller returned, ``on_late`` gets the final outcome.
    """
    t0 = time.monotonic()
    guard_logs(cfg)
    endpoint = redact_url(cfg.signal_endpoint("traces"))   # for logs and otel.json only
    wait = budget_s if budget_s is not None else cfg.timeout_s
    trace_id = format(spans[0].context.trace_id, "032x") if spans else ""
    box: dict[str, Any] = {}
    wake = threading.Event()
    lock = threading.Lock()
    on_error = wake.set if budget_s is not None else None   # the CLI waits for the retries

    def outcome(finished: bool) -> ExportOutcome:
        ok = finished and box.get("result") == SpanExportResult.SUCCESS
        error = None
        session = box.get("session")
        last = getattr(session, "last_error", None) or (
            failure_reason(list(box.get("live_messages") or [])) if box.get("live_messages") else None)
        if not ok:
            if finished:
                error = (box.get("error") or getattr(session, "last_error", None)
                         or failure_reason(box.get("messages") or []))
            elif last:
                error = f"{last} (gave up after {time.monotonic() - t0:.2f} s)"
            else:
                error = f"no answer within {wait:g} s"
        return ExportOutcome(ok=ok, finished=finished, seconds=round(time.monotonic() - t0, 4),
                             spans=len(spans), endpoint=endpoint, protocol=cfg.protocol,
                             trace_id=trace_id, error=cfg.redact(error), t=time.time())

    def work() -> None:
        capture_on(on_error)
        box["live_messages"] = _capture.by_thread.get(threading.get_ident())
        try:
            session = _recording_session(on_error) if exporter is None and \
                cfg.protocol != "grpc" else None
            box["session"] = session
            exp = exporter or make_span_exporter(cfg, timeout_s=wait, session=session)
            try:
                # a collector refuses requests over ~4 MiB: send big traces in batches
                result = SpanExportResult.SUCCESS
                for i in range(0, len(spans), BATCH_SPANS):
                    result = exp.export(list(spans[i:i + BATCH_SPANS]))
                    if result != SpanExportResult.SUCCESS:
                        break
                box["result"] = result
            finally:
                if exporter is None:
                    exp.shutdown()
        except Exception as e:  # bad certificate file, encoder bug ...
            box["error"] = f"{type(e).__name__}: {e}"
        finally:
            box["messages"] = capture_off()
            with lock:
                box["done"] = True
                late = box.get("returned")
            wake.set()
            if late:
                _finish(outcome(True), late=True)

    def _finish(o: ExportOutcome, late: bool = False) -> None:
        if o.ok:
            with warned_lock:  # a recovered backend deserves a fresh warning next time
                warned_endpoints.discard(endpoint)
            if late:
                log.info("OpenTelemetry export to %s completed after the caller went on "
                         "(trace %s)", endpoint, trace_id)
                if on_late is not None:
                    on_late(o)
        elif not late:
            warn_once(endpoint, f"OpenTelemetry export to {endpoint} ({cfg.protocol}) failed: "
                                f"{o.error}; the report stays on disk, re-send it with "
                                "`reveal otel export DIR`")

    th = threading.Thread(target=work, name="reveal-otel-export", daemon=True)
    th.start()
    if budget_s is None:
        th.join()
    else:
        wake.wait(wait)
    with lock:
        finished = bool(box.get("done"))
        box["returned"] = True
    o = outcome(finished)
    _finish(o)
    return o


def write_status(run_dir: str, outcome: ExportOutcome) -> None:
    """Record the outcome in ``<run_dir>/otel.json`` (best effort: a read-only run dir is fine).

    Written like every run-directory file (:func:`..store.rundir.write_file`): never
    through a symlink, and as root only into a directory root owns."""
    try:
        write_file(run_dir, STATUS_FILE, json.dumps(outcome.to_dict(), indent=1).encode())
    except OSError as e:
        log.debug("cannot write %s: %s", os.path.join(run_dir, STATUS_FILE), e)


def read_status(run_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(run_dir, STATUS_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_meta(run_dir: str) -> dict[str, Any] | None:
    """``meta.json`` of a run directory, or None when missing/unreadable (spans then use the
    report alone)."""
    try:
        with open(os.path.join(run_dir, "meta.json")) as f:
            meta = json.load(f)
        return meta if isinstance(meta, dict) else None
    except (OSError, ValueError) as e:
        log.debug("no usable meta.json in %s: %s", run_dir, e)
        return None


def export_report(report: dict[str, Any], meta: dict[str, Any] | None, cfg: OtelConfig,
                  budget_s: float | None = None, run_dir: str | None = None,
                  exporter: SpanExporter | None = None) -> ExportOutcome:
    """Build the run's trace and send it; with ``run_dir`` the outcome lands in ``otel.json``.

    ``budget_s`` bounds the whole call, span building included.
    """
    from .trace import build_spans
    t0 = time.monotonic()
    spans = build_spans(report, meta, cfg)
    left = None if budget_s is None else max(0.05, budget_s - (time.monotonic() - t0))
    written = threading.Event()

    def late(o: ExportOutcome) -> None:  # a long-lived caller: correct otel.json
        if run_dir and written.wait(5):
            write_status(run_dir, o)

    outcome = send_spans(spans, cfg, budget_s=left, exporter=exporter, on_late=late)
    outcome.seconds = round(time.monotonic() - t0, 4)
    if run_dir:
        write_status(run_dir, outcome)
    written.set()
    return outcome
