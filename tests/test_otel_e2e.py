"""End to end: the real `reveal record` with OTEL_EXPORTER_OTLP_ENDPOINT set produces one trace
at a receiver on loopback, with the run's real times; with the backend hung, the command's end
is delayed by at most the budget and the run is re-sent later."""
import json
import os
import subprocess
import time

import pytest

pytestmark = pytest.mark.slow


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "REVEAL_OTEL_"))}
    env.update(kw)
    return env


def _record(out, env, cmd=("sh", "-c", "sleep 1.5; exit 3")):
    t = time.monotonic()
    p = subprocess.run(["reveal", "record", "--out", str(out), "--", *cmd], env=env,
                       capture_output=True, text=True, timeout=120)
    return p, time.monotonic() - t


def test_reveal_record_produces_one_trace(tmp_path, otlp_http):
    empty = tmp_path / "reveal.toml"
    empty.write_text("")
    out = tmp_path / "run"
    p, _ = _record(out, _env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_http.endpoint,
                             REVEAL_CONFIG=str(empty), REVEAL_OTEL_BUDGET_S="5"))
    assert p.returncode == 3, p.stderr               # CMD's exit code passes through
    meta = json.loads((out / "meta.json").read_text())
    report = json.loads((out / "report.json").read_text())
    spans = otlp_http.wait_spans(1 + len(report["run"].get("steps") or [])
                                 + len(report["anomalies"]))
    assert len({s["trace_id"] for s in spans}) == 1
    roots = [s for s in spans if s["parent_span_id"] is None]
    assert len(roots) == 1
    root = roots[0]
    assert root["name"] == "reveal record"
    assert root["attributes"]["process.command_args"] == ["sh", "-c", "sleep 1.5; exit 3"]
    assert root["attributes"]["process.exit.code"] == 3
    assert root["status"] == 2                        # STATUS_CODE_ERROR
    assert root["attributes"]["reveal.telemetry.samples"] == report["telemetry"]["samples"] > 5
    # real times: the run's own start/end (what the report says), not the export time
    assert abs(root["start"] - report["run"]["start"]) < 1e-6
    assert abs(root["end"] - report["run"]["end"]) < 1e-6
    assert 1.4 < root["end"] - root["start"] < 30
    assert abs(root["start"] - meta["start"]) < 1.0
    assert root["resource"]["host.name"]
    ids = {s["span_id"] for s in spans}
    assert all(s["parent_span_id"] in ids for s in spans if s is not root)
    status = json.loads((out / "otel.json").read_text())
    assert status["ok"] and status["trace_id"] == root["trace_id"]


def test_reveal_record_with_hung_backend_is_delayed_by_at_most_the_budget(tmp_path,
                                                                        otlp_blackhole,
                                                                        otlp_http):
    empty = tmp_path / "reveal.toml"
    empty.write_text("")
    out = tmp_path / "run"
    p, wall = _record(out, _env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_blackhole,
                                OTEL_EXPORTER_OTLP_PROTOCOL="grpc", REVEAL_CONFIG=str(empty)),
                      cmd=("true",))
    assert p.returncode == 0, p.stderr
    status = json.loads((out / "otel.json").read_text())
    assert not status["ok"] and status["seconds"] < 1.5, status   # the sink's own wait
    assert p.stderr.count("OpenTelemetry export to") == 1
    assert otlp_blackhole.split("//")[1] in p.stderr
    assert (out / "report.json").is_file()
    # later, the backend is back: re-send the finished run
    r = subprocess.run(["reveal", "otel", "export", str(out), "--endpoint", otlp_http.endpoint],
                       env=_env(REVEAL_CONFIG=str(empty)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    spans = otlp_http.wait_spans(1)
    assert spans[0]["trace_id"] == status["trace_id"]    # same ids as the lost export


def test_reveal_torchrun_produces_one_trace(tmp_path, otlp_grpc):
    pytest.importorskip("torch")
    import pathlib
    import sys
    train = pathlib.Path(__file__).resolve().parent.parent / "examples" / "train.py"
    empty = tmp_path / "reveal.toml"
    empty.write_text("")
    out = tmp_path / "run"
    env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_grpc.endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
               REVEAL_CONFIG=str(empty), PYTHONUNBUFFERED="1", REVEAL_OTEL_BUDGET_S="5")
    env.pop("SLURM_JOB_ID", None)
    p = subprocess.run([sys.executable, "-m", "reveal_plugins.torch_ext.launcher",
                        "--reveal-out", str(out), "--reveal-interval", "0.2", "--standalone",
                        "--nproc-per-node", "1", str(train), "--model", "mlp", "--steps", "30",
                        "--log-every", "0"], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    n = 1 + len(report["run"].get("steps") or []) + len(report["anomalies"])
    spans = otlp_grpc.wait_spans(n)
    assert len(spans) == n and len({s["trace_id"] for s in spans}) == 1
    root = [s for s in spans if s["parent_span_id"] is None]
    assert len(root) == 1 and root[0]["name"] == "torchrun launch"
    assert root[0]["resource"]["reveal.scheduler"] == "torchrun"
    assert abs(root[0]["start"] - report["run"]["start"]) < 1e-6
    assert abs(root[0]["end"] - report["run"]["end"]) < 1e-6
    assert str(train) in root[0]["attributes"]["process.command_args"]
