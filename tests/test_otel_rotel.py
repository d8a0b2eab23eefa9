"""A real third-party collector in between: Rotel (the ``rotel`` wheel on PyPI ships its
``rotel-agent`` binary).  Reveal -> Rotel (OTLP/HTTP or gRPC) -> our receiver (the other
protocol): the trace survives a real collector's decode, batch and re-encode."""
import os
import socket
import subprocess
import time

import pytest

from fixtures_otlp import OtlpGrpcReceiver, OtlpHttpReceiver, make_otel_meta, make_otel_report
from reveal_plugins.otel.config import load_config
from reveal_plugins.otel.export import export_report

rotel = pytest.importorskip("rotel", reason="the rotel collector wheel is not installed "
                                             "(pip install rotel)")
ROTEL = os.path.join(os.path.dirname(rotel.__file__), "rotel-agent")


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@pytest.mark.parametrize("into, out", [("http/protobuf", "grpc"), ("grpc", "http")])
def test_trace_through_rotel(tmp_path, into, out):
    receiver = OtlpGrpcReceiver() if out == "grpc" else OtlpHttpReceiver()
    hp, gp = _free_port(), _free_port()
    proc = subprocess.Popen(
        [ROTEL, "start", "--otlp-http-endpoint", f"127.0.0.1:{hp}",
         "--otlp-grpc-endpoint", f"127.0.0.1:{gp}", "--exporter", "otlp",
         "--otlp-exporter-endpoint", receiver.endpoint, "--otlp-exporter-protocol", out,
         "--pid-file", str(tmp_path / "rotel.pid"), "--log-file", str(tmp_path / "rotel.log"),
         "--batch-timeout", "100ms"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        port = hp if into == "http/protobuf" else gp
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "rotel did not start listening"
                time.sleep(0.05)
        cfg = load_config(overrides={"endpoint": f"http://127.0.0.1:{port}", "protocol": into},
                          environ={})
        outcome = export_report(make_otel_report(), make_otel_meta(), cfg, budget_s=1.0)
        assert outcome.ok, outcome.error
        spans = receiver.wait_spans(6, timeout=10)
        by = {s["name"]: s for s in spans}
        assert sorted(by) == ["anomaly gpu", "anomaly network", "anomaly storage", "slurm job",
                              "step 0", "step 1"]
        assert by["anomaly gpu"]["parent_span_id"] == by["step 0"]["span_id"]
        assert by["slurm job"]["trace_id"] == outcome.trace_id
        assert by["slurm job"]["start"] == 1_700_000_000.0
        assert by["anomaly gpu"]["events"][0]["attributes"]["reveal.hint.title"] == \
            "GPU 0 thermally throttled"
        assert by["slurm job"]["resource"]["host.name"] == "node1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        receiver.close()
