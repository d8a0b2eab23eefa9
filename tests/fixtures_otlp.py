"""Real OTLP receivers on loopback, started by the tests that need them.

* :class:`OtlpHttpReceiver` — ``http.server`` answering ``POST /v1/traces`` and ``/v1/metrics``,
  decoding the protobuf requests with ``opentelemetry-proto``; can answer slowly or refuse.
* :class:`OtlpGrpcReceiver` — grpcio's server with the TraceService / MetricsService servicers
  from ``opentelemetry-proto``; can answer slowly or refuse.
* :func:`otlp_blackhole` — a TCP port that accepts connections and never answers.
* :func:`otlp_dead_port` — a port nobody listens on (connection refused).

Received spans are flattened by :func:`flatten_spans` into plain dicts (hex ids, unix-second
times, Python attribute values) so tests read like the trace an operator sees.
"""
from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

try:  # every test session imports this module (conftest): never break other areas' tests
    from opentelemetry.proto.collector.metrics.v1 import (metrics_service_pb2,
                                                          metrics_service_pb2_grpc)
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
    _PROTO_MISSING = None
except ImportError as _e:  # pragma: no cover - the dev extra installs opentelemetry-proto
    _PROTO_MISSING = f"opentelemetry-proto/grpcio not installed ({_e}); pip install -e '.[dev,otel]'"

_OTEL_ENV_PREFIXES = ("OTEL_", "REVEAL_OTEL_")


def any_value(v: Any) -> Any:
    """AnyValue protobuf -> Python value."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def flatten_spans(req: Any) -> list[dict[str, Any]]:
    out = []
    for rs in req.resource_spans:
        res = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append({
                    "name": sp.name,
                    "trace_id": sp.trace_id.hex(),
                    "span_id": sp.span_id.hex(),
                    "parent_span_id": sp.parent_span_id.hex() or None,
                    "start": sp.start_time_unix_nano / 1e9,
                    "end": sp.end_time_unix_nano / 1e9,
                    "attributes": attrs(sp.attributes),
                    "events": [{"name": e.name, "t": e.time_unix_nano / 1e9,
                                "attributes": attrs(e.attributes)} for e in sp.events],
                    "status": sp.status.code,
                    "status_message": sp.status.message,
                    "resource": res,
                    "scope": ss.scope.name,
                })
    return out


class _Store:
    """What a receiver got, shared by its handler threads."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        if _PROTO_MISSING:
            pytest.skip(_PROTO_MISSING)
        self.trace_requests: list[Any] = []
        self.metric_requests: list[Any] = []
        self.headers: list[dict[str, str]] = []

    def add(self, kind: str, req: Any, headers: dict[str, str]) -> None:
        with self.lock:
            (self.trace_requests if kind == "traces" else self.metric_requests).append(req)
            self.headers.append(headers)
            self.lock.notify_all()

    def spans(self) -> list[dict[str, Any]]:
        with self.lock:
            reqs = list(self.trace_requests)
        return [s for r in reqs for s in flatten_spans(r)]

    def metric_names(self) -> set[str]:
        with self.lock:
            reqs = list(self.metric_requests)
        return {m.name for r in reqs for rm in r.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics}

    def wait_spans(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until at least ``n`` spans arrived; return them (maybe fewer on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            left = deadline - time.monotonic()
            if len(spans) >= n or left <= 0:
                return spans
            with self.lock:
                self.lock.wait(min(left, 0.1))

    def wait_metrics(self, timeout: float = 10.0) -> set[str]:
        deadline = time.monotonic() + timeout
        while True:
            names = self.metric_names()
            if names or time.monotonic() > deadline:
                return names
            with self.lock:
                self.lock.wait(0.1)


class OtlpHttpReceiver(_Store):
    """OTLP/HTTP (protobuf) receiver on 127.0.0.1; ``endpoint`` is the base URL.

    ``delay_s`` sleeps before answering (a slow backend); ``status`` != 200 refuses every
    request with that HTTP status, ``refuse_first`` = N refuses only the first N with 503 (a
    collector restarting).
    """

    def __init__(self, delay_s: float = 0.0, status: int = 200, refuse_first: int = 0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.status = status
        self.refuse_first = refuse_first   # answer 503 to this many requests, then accept
        self.refused = 0
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:  # keep pytest output clean
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                enc = (self.headers.get("Content-Encoding") or "").lower()
                if enc == "gzip":
                    body = gzip.decompress(body)
                elif enc == "deflate":
                    body = zlib.decompress(body)
                if self.path == "/v1/traces":
                    req, resp = (trace_service_pb2.ExportTraceServiceRequest(),
                                 trace_service_pb2.ExportTraceServiceResponse())
                    kind = "traces"
                elif self.path == "/v1/metrics":
                    req, resp = (metrics_service_pb2.ExportMetricsServiceRequest(),
                                 metrics_service_pb2.ExportMetricsServiceResponse())
                    kind = "metrics"
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req.ParseFromString(body)
                if store.delay_s:
                    time.sleep(store.delay_s)
                if store.status != 200 or store.refused < store.refuse_first:
                    store.refused += 1
                    self.send_response(store.status if store.status != 200 else 503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                store.add(kind, req, {k.lower(): v for k, v in self.headers.items()})
                data = resp.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="otlp-http-receiver")
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class OtlpGrpcReceiver(_Store):
    """OTLP/gRPC receiver on 127.0.0.1 (grpcio server, opentelemetry-proto servicers).

    ``delay_s`` sleeps before answering; ``refuse`` aborts every call with that gRPC status.
    """

    def __init__(self, delay_s: float = 0.0, refuse: Any = None) -> None:
        import grpc
        super().__init__()
        self.delay_s = delay_s
        self.refuse = refuse
        self.refused = 0
        store = self

        def handle(kind: str, request: Any, context: Any, response: Any) -> Any:
            if store.delay_s:
                time.sleep(store.delay_s)
            if store.refuse is not None:
                store.refused += 1
                context.abort(store.refuse, "refused by test receiver")
            store.add(kind, request, {k: v for k, v in context.invocation_metadata()})
            return response

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                return handle("traces", request, context,
                              trace_service_pb2.ExportTraceServiceResponse())

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                return handle("metrics", request, context,
                              metrics_service_pb2.ExportMetricsServiceResponse())

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server.start()

    def close(self) -> None:
        self.server.stop(grace=0).wait(2)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def otel_clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> pytest.MonkeyPatch:
    """No OTEL_* / REVEAL_OTEL_* from the ambient environment, an empty config file instead of
    /etc/reveal/reveal.toml, no stale 'logged once' state."""
    import os
    for k in list(os.environ):
        if k.startswith(_OTEL_ENV_PREFIXES):
            monkeypatch.delenv(k, raising=False)
    empty = tmp_path / "reveal-empty.toml"
    empty.write_text("")
    monkeypatch.setenv("REVEAL_CONFIG", str(empty))
    from reveal_plugins.otel.export import reset_warnings
    reset_warnings()
    return monkeypatch


@pytest.fixture
def otlp_http():
    r = OtlpHttpReceiver()
    yield r
    r.close()


@pytest.fixture
def otlp_grpc():
    r = OtlpGrpcReceiver()
    yield r
    r.close()


@pytest.fixture
def otlp_dead_port() -> str:
    """Base URL of a loopback port nobody listens on."""
    return f"http://127.0.0.1:{_free_port()}"


@pytest.fixture
def otlp_blackhole():
    """Base URL of a port that accepts TCP connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


def make_otel_report(n_anomalies: int = 3, source: str = "slurm", t0: float = 1_700_000_000.0,
                     exit_code: int = 0) -> dict[str, Any]:
    """A ``reveal.report/1`` report written by hand from the schema: a 2-step job on one node
    with anomalies in step 0, step 1 and (with ``n_anomalies`` > 3) spread over the run."""
    steps = [{"step_id": "0", "start": t0 + 1.0, "end": t0 + 40.0},
             {"step_id": "1", "start": t0 + 41.0, "end": t0 + 95.0}]
    base = [
        {"id": "a1", "start": t0 + 10.0, "end": t0 + 16.0, "node": "node1", "step_id": None,
         "subsystem": "gpu", "score": 7.25,
         "evidence": [{"channel": "gpu.0.clock_sm", "deviation": -6.5, "baseline": 1980.0,
                       "observed": 1410.0},
                      {"channel": "gpu.0.temperature", "deviation": 5.1, "baseline": 61.0,
                       "observed": 87.0},
                      {"channel": "gpu.0.power", "deviation": 2.0, "baseline": 300.0,
                       "observed": 250.0}],
         "hints": [{"title": "GPU 0 thermally throttled", "why": "SM clock fell 29% while at 87 C",
                    "action": "check airflow; nvidia-smi -q -d PERFORMANCE", "severity": "critical"},
                   {"title": "Consider a power cap review", "why": "power below limit",
                    "action": "nvidia-smi -pl 300", "severity": "info"}]},
        {"id": "a2", "start": t0 + 50.0, "end": t0 + 53.0, "node": "node1", "step_id": "1",
         "subsystem": "network", "score": 4.0,
         "evidence": [{"channel": "network.tcp.retrans_segs", "deviation": 9.0}],
         "hints": [{"title": "TCP retransmissions", "why": "retransmits 40x baseline",
                    "action": "ethtool -S eth0; check NCCL_SOCKET_IFNAME", "severity": "warning"}]},
        {"id": "a3", "start": t0 + 96.0, "end": t0 + 99.0, "node": "node1", "step_id": None,
         "subsystem": "storage", "score": 3.2,
         "evidence": [{"channel": "storage.sda.io_ticks", "deviation": 4.4}],
         "hints": []},
    ]
    anomalies = base[:n_anomalies]
    subsystems = ["cpu", "gpu", "memory", "network", "storage", "system"]
    for i in range(len(anomalies), n_anomalies):
        s = t0 + 1.0 + (i * 0.09) % 98.0
        sub = subsystems[i % len(subsystems)]
        anomalies.append({
            "id": f"a{i + 1}", "start": s, "end": s + 3.0, "node": "node1", "step_id": None,
            "subsystem": sub, "score": 2.0 + (i % 50) / 10.0,
            "evidence": [{"channel": f"{sub}.ch{j}", "deviation": float(8 - j)} for j in range(8)],
            "hints": [{"title": f"hint {i}", "why": "because", "action": "do x",
                       "severity": "warning"}]})
    return {
        "schema": "reveal.report/1", "status": "ok",
        "run": {"source": source, "job_id": "4242" if source == "slurm" else None,
                "step_id": None, "user": "alice",
                "command": ["python", "train.py", "--epochs", "3"], "exit_code": exit_code,
                "start": t0, "end": t0 + 100.0, "nodes": ["node1"], "steps": steps},
        "telemetry": {"interval_s": 0.1, "samples": 1000, "channels": 412, "bytes_stored": 1_600_000,
                      "probes": [{"name": "procfs", "available": True, "reason": None},
                                 {"name": "nvml", "available": False, "reason": "no NVIDIA driver"}]},
        "anomalies": anomalies,
        "summary": f"{len(anomalies)} anomalies; worst: gpu throttling",
    }


def make_otel_meta(t0: float = 1_700_000_000.0) -> dict[str, Any]:
    """A ``meta.json`` dict matching :func:`make_otel_report` (only what the sink reads)."""
    return {"schema": "reveal.run/1",
            "run": {"run_id": "slurm-4242-node1", "run_dir": "/tmp/x", "source": "slurm",
                    "host": "node1", "job_id": "4242", "extra": {"cluster": "testcluster"}},
            "host": {"hostname": "node1"}, "interval_s": 0.1,
            "steps": [{"step_id": "0", "start": t0 + 1.0, "end": t0 + 40.0, "exit_code": 0},
                      {"step_id": "1", "start": t0 + 41.0, "end": t0 + 95.0, "exit_code": 3}],
            "start": t0, "end": t0 + 100.0, "exit_code": 0}


@pytest.fixture
def otel_report() -> dict[str, Any]:
    return make_otel_report()


SLURM_OTEL_CONFIG = "reveal-otel-test.toml"


def slurm_analyzer_with_otel(run_dir: str, cfg: dict[str, Any]) -> Any:
    """A Slurm hook-config ``analyzer`` (``tests.fixtures_otlp:slurm_analyzer_with_otel``) for
    end-to-end tests.  The Epilog (and the detached analysis it starts) runs without the test's
    environment, so the OTel configuration a test wants is a file next to the hooks' own
    configuration (``$REVEAL_SLURM_CONFIG``); then the normal analysis and sinks run."""
    import os
    slurm_cfg = os.environ.get("REVEAL_SLURM_CONFIG")
    if slurm_cfg:
        path = os.path.join(os.path.dirname(slurm_cfg), SLURM_OTEL_CONFIG)
        if os.path.isfile(path):
            os.environ["REVEAL_CONFIG"] = path
    from reveal_plugins.analysis import analyze_and_publish
    return analyze_and_publish(run_dir, cfg)
