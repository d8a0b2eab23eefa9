"""Live metrics from the node agent through an OpenTelemetry MeterProvider.

Attached by the sink plugin's ``reveal_agent_started`` hook when ``[otel] metrics = true`` (or
``REVEAL_OTEL_METRICS=1``) and an endpoint is configured.  Every ``metrics_interval_s`` the
periodic reader asks the observable instruments, which read ``agent.latest()`` (one snapshot
per collection) and map channels to metric names:

* GPUs (``gpu.<i>.<metric>`` channels of the NVML probe) -> the ``hw.*`` semantic conventions
  of the pinned ``opentelemetry-semantic-conventions`` package (``hw.gpu.utilization``,
  ``hw.gpu.memory.usage``, ``hw.power``, ``hw.temperature``, ``hw.energy``, ``hw.errors``,
  ``hw.gpu.io``), with ``hw.id = gpu<i>`` and ``hw.type = gpu``; GPU clocks and throttle
  reasons, which have no convention, as ``reveal.gpu.*``;
* host -> ``system.cpu.utilization`` (by ``cpu.mode``), ``system.memory.usage`` /
  ``system.memory.utilization``, ``system.network.io``;
* ``reveal.anomaly.score``: the highest live-finding score since the previous collection (by
  subsystem), and ``reveal.runs.active``.

Job ids, users and run ids are not attributes of these metrics (a series per job explodes
cardinality); they live on the trace's spans and resource.  The Prometheus endpoint
(prometheus.py) adds one ``reveal.job.info`` series per *running* job (value 1, ``job_id`` and
``user``), which a query joins to the node's series, jobstats' way.
"""
from __future__ import annotations

import logging
import re
import socket
import threading
import time
from typing import Any, Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (MetricExporter, MetricExportResult,
                                              PeriodicExportingMetricReader)
from opentelemetry.sdk.resources import Resource
from opentelemetry.semconv._incubating.metrics import hw_metrics as hw
from opentelemetry.semconv._incubating.metrics import system_metrics as sysm

from .. import __version__
from .config import OtelConfig, redact_url
from .export import (capture_off, capture_on, failure_reason, warned_endpoints, warned_lock, guard_logs,
                     warn_once)

log = logging.getLogger(__name__)

GPU_RE = re.compile(r"^gpu\.(\d+)\.([a-z0-9_]+)$")
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

# GPU channel metric -> (instrument kind, metric name, unit, scale, extra attributes)
GPU_MAP: dict[str, tuple[str, str, str, float, dict[str, str]]] = {
    "util_sm": ("gauge", hw.HW_GPU_UTILIZATION, "1", 0.01, {"hw.gpu.task": "general"}),
    "util_mem": ("gauge", hw.HW_GPU_MEMORY_UTILIZATION, "1", 0.01, {}),
    "mem_used": ("updown", hw.HW_GPU_MEMORY_USAGE, "By", 1.0, {}),
    "mem_total": ("updown", hw.HW_GPU_MEMORY_LIMIT, "By", 1.0, {}),
    "power": ("gauge", hw.HW_POWER, "W", 1.0, {}),
    "energy": ("counter", hw.HW_ENERGY, "J", 1.0, {}),
    "temp": ("gauge", hw.HW_TEMPERATURE, "Cel", 1.0, {"hw.sensor_location": "gpu"}),
    "memory_temp": ("gauge", hw.HW_TEMPERATURE, "Cel", 1.0, {"hw.sensor_location": "memory"}),
    "pcie_tx": ("counter", hw.HW_GPU_IO, "By", 1.0, {"network.io.direction": "transmit"}),
    "pcie_rx": ("counter", hw.HW_GPU_IO, "By", 1.0, {"network.io.direction": "receive"}),
    "ecc_corrected": ("counter", hw.HW_ERRORS, "{error}", 1.0, {"error.type": "corrected"}),
    "ecc_uncorrected": ("counter", hw.HW_ERRORS, "{error}", 1.0, {"error.type": "uncorrected"}),
    "clock_sm": ("gauge", "reveal.gpu.clock.sm", "MHz", 1.0, {}),
    "clock_mem": ("gauge", "reveal.gpu.clock.memory", "MHz", 1.0, {}),
    "power_limit": ("gauge", "reveal.gpu.power.limit", "W", 1.0, {}),
}
GPU_THROTTLE_PREFIX = "throttle_"


class _Snapshot:
    """One ``agent.latest()`` per collection, shared by all callbacks of that collection."""

    def __init__(self, agent: Any):
        self.agent = agent
        self._t = 0.0
        self._data: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self) -> dict[str, float]:
        with self._lock:
            now = time.monotonic()
            if now - self._t > 0.5:
                latest = None
                try:
                    latest = self.agent.latest()
                except Exception as e:  # the agent's problem must not break the reader
                    log.debug("agent.latest() failed: %s", e)
                self._data = dict(latest[1]) if latest else {}
                self._t = now
            return self._data


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and v == v and v not in (float("inf"), float("-inf"))


class _OnceLoggingExporter(MetricExporter):
    """Delegates to an OTLP metric exporter; a failing backend is logged once per endpoint
    (not every interval), and a recovery re-arms the warning."""

    def __init__(self, inner: MetricExporter, endpoint: str,
                 redact: Callable[[str], str] = lambda s: s):
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner = inner
        self.endpoint = endpoint          # credentials already redacted
        self.redact = redact

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kw: Any) -> Any:
        capture_on()
        result, err = MetricExportResult.FAILURE, None
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kw)
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
        finally:
            msgs = capture_off()
        if result == MetricExportResult.SUCCESS:
            with warned_lock:
                warned_endpoints.discard(self.endpoint)
        else:
            warn_once(self.endpoint, f"OpenTelemetry metrics export to {self.endpoint} failed: "
                                     f"{self.redact(err or failure_reason(msgs))} (further failures "
                                     "not logged)")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kw)


def make_metric_exporter(cfg: OtelConfig) -> MetricExporter:
    timeout = min(cfg.timeout_s, max(0.5, cfg.metrics_interval_s * 0.8))
    endpoint = cfg.signal_endpoint("metrics")
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        inner = OTLPMetricExporter(endpoint=endpoint, insecure=cfg.grpc_insecure("metrics"),
                                   headers=dict(cfg.headers) or None, timeout=timeout)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        inner = OTLPMetricExporter(endpoint=endpoint, certificate_file=cfg.certificate,
                                   headers=dict(cfg.headers), timeout=timeout)
    guard_logs(cfg)
    return _OnceLoggingExporter(inner, redact_url(endpoint), cfg.redact)


class LiveMetrics:
    """The agent's MeterProvider and its instruments.  ``start`` never blocks (the first export
    happens one interval later); ``stop`` flushes and returns within ``timeout_s``."""

    def __init__(self, agent: Any, cfg: OtelConfig, exporter: MetricExporter | None = None,
                 reader: Any = None, job_info: bool = False):
        """``exporter`` / ``reader`` replace the OTLP exporter / periodic reader (tests, the
        Prometheus endpoint); ``job_info`` adds ``reveal.job.info`` (see the module doc)."""
        self.job_info = job_info
        self.agent = agent
        self.cfg = cfg
        self.snapshot = _Snapshot(agent)
        self._exporter = exporter
        self._reader = reader
        self._scores: dict[str, float] = {}
        self._seen: set[str] = set()
        self._scores_lock = threading.Lock()
        self._prev_cpu: dict[str, float] | None = None
        self.provider: MeterProvider | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        reader = self._reader
        if reader is None:
            exporter = self._exporter or make_metric_exporter(self.cfg)
            interval_ms = self.cfg.metrics_interval_s * 1000.0
            reader = PeriodicExportingMetricReader(
                exporter, export_interval_millis=interval_ms,
                export_timeout_millis=min(interval_ms, self.cfg.timeout_s * 1000))
        host = getattr(self.agent, "host", None) or socket.gethostname().split(".")[0]
        attrs = dict(self.cfg.resource_attributes)
        attrs.update({"service.name": self.cfg.service_name, "service.version": __version__,
                      "host.name": host})
        self.provider = MeterProvider(resource=Resource(attrs), metric_readers=[reader],
                                      shutdown_on_exit=False)
        self._instruments(self.provider.get_meter("reveal_plugins.otel", __version__))

    def stop(self, timeout_s: float = 1.0) -> None:
        provider, self.provider = self.provider, None
        if provider is None:
            return
        th = threading.Thread(target=lambda: provider.shutdown(timeout_millis=timeout_s * 1000),
                              name="reveal-otel-metrics-stop", daemon=True)
        th.start()
        th.join(timeout_s)
        if th.is_alive():
            log.warning("OpenTelemetry metrics did not flush within %.1f s; going on", timeout_s)

    def record_finding(self, anomaly: dict[str, Any]) -> None:
        sub = str(anomaly.get("subsystem") or "unknown")
        try:
            score = float(anomaly.get("score", 0.0))
        except (TypeError, ValueError):
            return
        with self._scores_lock:
            self._scores[sub] = max(score, self._scores.get(sub, float("-inf")))

    # -- instruments ----------------------------------------------------------------------
    def _instruments(self, meter: Any) -> None:
        by_name: dict[str, list[tuple[str, float, dict[str, str]]]] = {}
        kinds: dict[str, tuple[str, str]] = {}
        for metric, (kind, name, unit, scale, extra) in GPU_MAP.items():
            by_name.setdefault(name, []).append((metric, scale, extra))
            kinds[name] = (kind, unit)
        for name, members in by_name.items():
            kind, unit = kinds[name]
            cb = self._gpu_callback(members)
            self._make(meter, kind, name, unit, cb)
        self._make(meter, "gauge", "reveal.gpu.throttle", "1", self._gpu_throttle)
        self._make(meter, "gauge", sysm.SYSTEM_CPU_UTILIZATION, "1", self._cpu_util)
        self._make(meter, "updown", sysm.SYSTEM_MEMORY_USAGE, "By", self._mem_usage)
        self._make(meter, "gauge", sysm.SYSTEM_MEMORY_UTILIZATION, "1", self._mem_util)
        self._make(meter, "counter", sysm.SYSTEM_NETWORK_IO, "By", self._net_io)
        self._make(meter, "gauge", "reveal.anomaly.score", "1", self._anomaly_score)
        self._make(meter, "gauge", "reveal.runs.active", "{run}", self._runs_active)
        if self.job_info:
            self._make(meter, "gauge", "reveal.job.info", "1", self._jobs)

    @staticmethod
    def _make(meter: Any, kind: str, name: str, unit: str,
              cb: Callable[[CallbackOptions], Iterable[Observation]]) -> None:
        make = {"gauge": meter.create_observable_gauge,
                "counter": meter.create_observable_counter,
                "updown": meter.create_observable_up_down_counter}[kind]
        make(name, callbacks=[cb], unit=unit)

    def _gpu_callback(self, members: list[tuple[str, float, dict[str, str]]]):
        wanted = {m: (scale, extra) for m, scale, extra in members}

        def cb(options: CallbackOptions) -> Iterable[Observation]:
            out = []
            for ch, v in self.snapshot.get().items():
                m = GPU_RE.match(ch)
                if not m or m.group(2) not in wanted or not _finite(v):
                    continue
                scale, extra = wanted[m.group(2)]
                out.append(Observation(v * scale, {"hw.id": f"gpu{m.group(1)}", "hw.type": "gpu",
                                                   **extra}))
            return out
        return cb

    def _gpu_throttle(self, options: CallbackOptions) -> Iterable[Observation]:
        out = []
        for ch, v in self.snapshot.get().items():
            m = GPU_RE.match(ch)
            if m and m.group(2).startswith(GPU_THROTTLE_PREFIX) and _finite(v):
                out.append(Observation(v, {"hw.id": f"gpu{m.group(1)}", "hw.type": "gpu",
                                           "reveal.throttle.reason":
                                               m.group(2)[len(GPU_THROTTLE_PREFIX):]}))
        return out

    def _cpu_util(self, options: CallbackOptions) -> Iterable[Observation]:
        d = self.snapshot.get()
        cur = {mode: d.get(f"cpu.all.{mode}") for mode in CPU_MODES}
        if not all(_finite(v) for v in cur.values()):
            return []
        prev, self._prev_cpu = self._prev_cpu, cur  # type: ignore[assignment]
        if prev is None:
            return []
        delta = {k: cur[k] - prev[k] for k in CPU_MODES}  # type: ignore[operator]
        total = sum(delta.values())
        if total <= 0:
            return []
        return [Observation(delta[k] / total, {"cpu.mode": k}) for k in CPU_MODES]

    def _mem_usage(self, options: CallbackOptions) -> Iterable[Observation]:
        d = self.snapshot.get()
        total, avail = d.get("memory.MemTotal"), d.get("memory.MemAvailable")
        out = []
        if _finite(total) and _finite(avail):
            out.append(Observation((total - avail) * 1024.0, {"system.memory.state": "used"}))
        for key, state in (("memory.MemFree", "free"), ("memory.Cached", "cached"),
                           ("memory.Buffers", "buffers")):
            if _finite(d.get(key)):
                out.append(Observation(d[key] * 1024.0, {"system.memory.state": state}))
        return out

    def _mem_util(self, options: CallbackOptions) -> Iterable[Observation]:
        d = self.snapshot.get()
        total, avail = d.get("memory.MemTotal"), d.get("memory.MemAvailable")
        if _finite(total) and _finite(avail) and total > 0:
            return [Observation((total - avail) / total, {"system.memory.state": "used"})]
        return []

    def _net_io(self, options: CallbackOptions) -> Iterable[Observation]:
        out = []
        for ch, v in self.snapshot.get().items():
            if ch.startswith("network.") and _finite(v):
                parts = ch.split(".")
                if len(parts) == 3 and parts[2] in ("rx_bytes", "tx_bytes"):
                    out.append(Observation(v, {
                        "network.interface.name": parts[1],
                        "network.io.direction": "receive" if parts[2] == "rx_bytes"
                        else "transmit"}))
        return out

    def _anomaly_score(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._scores_lock:
            scores, self._scores = self._scores, {}
            # a subsystem that had findings reads 0 once they stop (the series does not vanish)
            for k in self._seen - set(scores):
                scores[k] = 0.0
            self._seen |= set(scores)
        return [Observation(v, {"reveal.anomaly.subsystem": k}) for k, v in scores.items()]

    def _jobs(self, options: CallbackOptions) -> Iterable[Observation]:
        try:
            runs = self.agent.runs()
        except Exception:
            return []
        seen = {(str(r.job_id or r.run_id), str(r.user or r.uid)) for r in runs}
        return [Observation(1, {"job_id": j, "user": u}) for j, u in sorted(seen)]

    def _runs_active(self, options: CallbackOptions) -> Iterable[Observation]:
        try:
            n = len(self.agent.runs())
        except Exception:
            return []
        return [Observation(n)]
