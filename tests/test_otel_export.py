"""The sink against real OTLP receivers on loopback (HTTP and gRPC), and against backends that
are down, refuse or hang: the job end never waits more than the budget, the failure is logged
once with the endpoint, the report stays on disk and `reveal otel export` re-sends it."""
import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from fixtures_otlp import OtlpGrpcReceiver, OtlpHttpReceiver, make_otel_meta, make_otel_report
from reveal_plugins.hooks.manager import get_plugin_manager
from reveal_plugins.otel import sink
from reveal_plugins.otel.export import read_status

BUDGET = 1.0
SLACK = 0.5     # thread join + scheduling on a shared, busy 2-core machine
DELIVERY_BUDGET = "5"   # tests of what arrives (not of the budget) must not race a busy CI
T0 = 1_700_000_000.0


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "report.json").write_text(json.dumps(make_otel_report()))
    (d / "meta.json").write_text(json.dumps(make_otel_meta()))
    return str(d)


def _report(run_dir):
    with open(os.path.join(run_dir, "report.json")) as f:
        return json.load(f)


def _timed_sink(run_dir):
    t = time.monotonic()
    sink.reveal_report_ready(_report(run_dir), run_dir, {}, None)
    return time.monotonic() - t


def _assert_trace(spans):
    names = sorted(s["name"] for s in spans)
    assert names == ["anomaly gpu", "anomaly network", "anomaly storage", "slurm job",
                     "step 0", "step 1"]
    by = {s["name"]: s for s in spans}
    root = by["slurm job"]
    assert root["parent_span_id"] is None
    assert len({s["trace_id"] for s in spans}) == 1
    assert by["step 0"]["parent_span_id"] == root["span_id"]
    assert by["anomaly gpu"]["parent_span_id"] == by["step 0"]["span_id"]
    assert by["anomaly network"]["parent_span_id"] == by["step 1"]["span_id"]
    assert (root["start"], root["end"]) == (T0, T0 + 100)
    assert (by["anomaly gpu"]["start"], by["anomaly gpu"]["end"]) == (T0 + 10, T0 + 16)
    assert root["attributes"]["slurm.job.id"] == "4242"
    assert root["attributes"]["user.name"] == "alice"
    assert root["resource"]["host.name"] == "node1"
    assert root["resource"]["service.name"] == "reveal"
    gpu = by["anomaly gpu"]
    assert gpu["attributes"]["reveal.anomaly.subsystem"] == "gpu"
    assert gpu["attributes"]["reveal.anomaly.evidence.channels"][0] == "gpu.0.clock_sm"
    hints = [e for e in gpu["events"] if e["name"] == "hint"]
    assert [h["attributes"]["reveal.hint.severity"] for h in hints] == ["critical", "info"]
    assert hints[0]["attributes"]["reveal.hint.action"].startswith("check airflow")


def test_sink_is_a_registered_builtin_plugin():
    pm = get_plugin_manager()
    assert pm.has_plugin("reveal_plugins.otel.sink")


def test_export_off_sends_nothing_and_costs_nothing(otel_clean_env, run_dir):
    assert _timed_sink(run_dir) < 0.05
    assert read_status(run_dir) is None


def test_http_receiver_gets_the_trace(otel_clean_env, run_dir, otlp_http):
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_http.endpoint)
    otel_clean_env.setenv("REVEAL_OTEL_BUDGET_S", DELIVERY_BUDGET)
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=lab,authorization=Bearer%20t")
    _timed_sink(run_dir)
    spans = otlp_http.wait_spans(6)
    _assert_trace(spans)
    assert otlp_http.headers[0]["x-tenant"] == "lab"
    assert otlp_http.headers[0]["authorization"] == "Bearer t"
    st = read_status(run_dir)
    assert st["ok"] and st["spans"] == 6 and st["trace_id"] == spans[0]["trace_id"]


def test_http_gzip(otel_clean_env, run_dir, otlp_http):
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_http.endpoint)
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    otel_clean_env.setenv("REVEAL_OTEL_BUDGET_S", DELIVERY_BUDGET)
    _timed_sink(run_dir)
    _assert_trace(otlp_http.wait_spans(6))


def test_grpc_receiver_gets_the_trace(otel_clean_env, run_dir, otlp_grpc):
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_grpc.endpoint)
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=lab")
    otel_clean_env.setenv("REVEAL_OTEL_BUDGET_S", DELIVERY_BUDGET)
    _timed_sink(run_dir)
    _assert_trace(otlp_grpc.wait_spans(6))
    assert otlp_grpc.headers[0]["x-tenant"] == "lab"


def test_config_file_routes_export(otel_clean_env, run_dir, otlp_grpc, tmp_path):
    cfg = tmp_path / "reveal.toml"
    cfg.write_text(f'[otel]\nendpoint = "{otlp_grpc.endpoint}"\nprotocol = "grpc"\n')
    otel_clean_env.setenv("REVEAL_CONFIG", str(cfg))
    otel_clean_env.setenv("REVEAL_OTEL_BUDGET_S", DELIVERY_BUDGET)
    _timed_sink(run_dir)
    _assert_trace(otlp_grpc.wait_spans(6))


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_backend_down_costs_at_most_the_budget_and_logs_once(otel_clean_env, run_dir,
                                                             otlp_dead_port, protocol, caplog):
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_dead_port)
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    caplog.set_level(logging.DEBUG, logger="opentelemetry")
    caplog.set_level(logging.WARNING, logger="reveal_plugins")
    times = [_timed_sink(run_dir) for _ in range(2)]
    assert max(times) < BUDGET + SLACK, times
    # reveal's own warning, once; the gRPC exporter may still log a retry of its own from the
    # export thread after the budget ended (seen in 1 of 3 runs on a loaded 2-core VM)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING
                and r.name.startswith("reveal_plugins")]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    msg = warnings[0].getMessage()
    assert otlp_dead_port.split("//")[1] in msg and "reveal otel export" in msg
    st = read_status(run_dir)
    assert not st["ok"]
    assert "refused" in st["error"].lower() or "UNAVAILABLE" in st["error"], st["error"]
    assert os.path.isfile(os.path.join(run_dir, "report.json"))


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_backend_that_never_answers(otel_clean_env, run_dir, otlp_blackhole, protocol):
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_blackhole)
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    dt = _timed_sink(run_dir)
    assert dt < BUDGET + SLACK, dt
    st = read_status(run_dir)
    assert not st["ok"]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_slow_backend_then_re_export(otel_clean_env, run_dir, protocol):
    slow = (OtlpHttpReceiver(delay_s=3.0) if protocol != "grpc"
            else OtlpGrpcReceiver(delay_s=3.0))
    try:
        otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", slow.endpoint)
        otel_clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        dt = _timed_sink(run_dir)
        assert dt < BUDGET + SLACK, dt
        assert not read_status(run_dir)["ok"]
        # the backend recovers: the operator re-sends the finished run
        slow.delay_s = 0.0
        from reveal_plugins.cli import main
        assert main(["otel", "export", run_dir]) == 0
        _assert_trace([s for s in slow.wait_spans(6) if True][-6:])
        assert read_status(run_dir)["ok"]
    finally:
        slow.close()


def test_refusing_backends(otel_clean_env, run_dir, caplog):
    http = OtlpHttpReceiver(status=503)
    g = OtlpGrpcReceiver(refuse=grpc.StatusCode.PERMISSION_DENIED)
    try:
        for ep, proto in ((http.endpoint, "http/protobuf"), (g.endpoint, "grpc")):
            otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ep)
            otel_clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
            assert _timed_sink(run_dir) < BUDGET + SLACK
            assert not read_status(run_dir)["ok"]
            assert ("503" if proto != "grpc" else "PERMISSION_DENIED") in \
                read_status(run_dir)["error"]
        assert http.refused >= 1 and g.refused >= 1
        assert "PERMISSION_DENIED" in read_status(run_dir)["error"]
    finally:
        http.close()
        g.close()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_job_end_process_exits_promptly_with_a_hung_backend(otel_clean_env, run_dir,
                                                            otlp_blackhole, protocol):
    """What a Slurm epilog sees: the process that runs the sink exits within the budget of
    the hook call, even though the export thread is still stuck."""
    code = textwrap.dedent(f"""
        import json, time, sys
        from reveal_plugins.otel import sink
        rep = json.load(open({os.path.join(run_dir, 'report.json')!r}))
        print(time.time(), flush=True)
        sink.reveal_report_ready(rep, {run_dir!r}, {{}}, None)
    """)
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=otlp_blackhole,
               OTEL_EXPORTER_OTLP_PROTOCOL=protocol)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=30)
    end = time.time()
    assert p.returncode == 0, p.stderr
    started = float(p.stdout.split()[0])
    assert end - started < BUDGET + 0.6, end - started
    assert otlp_blackhole.split("//")[1] in p.stderr       # logged once, with the endpoint
    assert p.stderr.count("OpenTelemetry export to") == 1


def test_cli_export_via_command_line_endpoint(otel_clean_env, run_dir, otlp_http):
    p = subprocess.run(["reveal", "otel", "export", run_dir, "--endpoint", otlp_http.endpoint],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "sent 6 spans" in p.stdout
    _assert_trace(otlp_http.wait_spans(6))


def test_cli_errors_are_clear(otel_clean_env, tmp_path, run_dir, otlp_dead_port):
    from reveal_plugins.otel.cli import main
    assert main(["export", run_dir]) == 2                       # nothing configured
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", str(empty), "--endpoint", "http://127.0.0.1:1"]) == 1
    assert main(["export", run_dir, "--endpoint", otlp_dead_port, "--timeout", "0.5"]) == 1


def test_cli_dry_run_prints_the_spans(otel_clean_env, run_dir, capsys):
    from reveal_plugins.otel.cli import main
    assert main(["export", run_dir, "--dry-run"]) == 0
    spans = json.loads(capsys.readouterr().out)
    assert spans[0]["name"] == "slurm job" and len(spans) == 6


def test_cli_resends_every_failed_export_under_the_spool(otel_clean_env, tmp_path,
                                                         otlp_dead_port, otlp_http):
    spool = tmp_path / "spool"
    dirs = []
    for job in ("11", "12"):
        d = spool / "jobs" / job / "node1"
        d.mkdir(parents=True)
        rep = make_otel_report()
        rep["run"]["job_id"] = job
        (d / "report.json").write_text(json.dumps(rep))
        dirs.append(str(d))
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_dead_port)
    sink.reveal_report_ready(_report(dirs[0]), dirs[0], {}, None)       # fails: backend down
    from reveal_plugins.otel.cli import main
    assert main(["export", "--failed", "--spool", str(spool),
                 "--endpoint", otlp_http.endpoint]) == 0
    spans = otlp_http.wait_spans(6)
    assert {s["attributes"].get("slurm.job.id") for s in spans if not s["parent_span_id"]} == {"11"}
    assert read_status(dirs[0])["ok"] and read_status(dirs[1]) is None
    assert main(["export", "--failed", "--spool", str(spool),
                 "--endpoint", otlp_http.endpoint]) == 0      # nothing left to re-send


def test_retry_that_succeeds_after_the_caller_went_on_corrects_the_status(otel_clean_env,
                                                                          run_dir):
    """A collector restarting answers 503 once: the job end goes on at once, the exporter
    retries in the background (within a 3 s budget here) and otel.json ends up ok."""
    r = OtlpHttpReceiver(refuse_first=1)
    try:
        otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.endpoint)
        otel_clean_env.setenv("REVEAL_OTEL_BUDGET_S", "3")
        assert _timed_sink(run_dir) < 0.5
        assert not read_status(run_dir)["ok"]
        _assert_trace(r.wait_spans(6, timeout=5))
        deadline = time.monotonic() + 5
        while not read_status(run_dir)["ok"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read_status(run_dir)["ok"] and r.refused == 1
    finally:
        r.close()


def test_detached_caller_waits_for_a_slow_backend(otel_clean_env, run_dir):
    """budget_s from the caller (the Slurm Epilog's background analysis grants it): nobody waits
    on it, so a backend answering after 1.5 s still gets the trace at the first try."""
    slow = OtlpHttpReceiver(delay_s=1.5)
    try:
        otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", slow.endpoint)
        t = time.monotonic()
        sink.reveal_report_ready(_report(run_dir), run_dir, {}, 600)
        assert 1.4 < time.monotonic() - t < 5
        assert read_status(run_dir)["ok"]
    finally:
        slow.close()


@pytest.fixture
def _keep_root_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.mark.parametrize("path", ["child", "stopped"])
def test_detached_epilog_analysis_gives_the_otel_sink_the_full_timeout(
        otel_clean_env, tmp_path, monkeypatch, _keep_root_logging, path):
    """The Slurm Epilog's detached analysis (``_analyze --child``, and the supervisor's
    'stopped' report) is waited on by nobody: the OTel sink gets its full ``timeout_s``, not
    the 1 s job-end budget (issue 23: the sink looked for a flag no caller set)."""
    from types import SimpleNamespace

    from reveal_plugins.detect.synth import SynthHost
    from reveal_plugins.otel import export
    from reveal_plugins.slurm import hooks

    run = SynthHost(2, seed=3).write_run(str(tmp_path / "r"), 30)
    slurm_toml = tmp_path / "slurm.toml"
    slurm_toml.write_text('analysis_cap = "off"\n')
    os.chmod(str(slurm_toml), 0o644)
    monkeypatch.setenv("REVEAL_SLURM_CONFIG", str(slurm_toml))
    monkeypatch.setenv("REVEAL_SLURM_LOG", str(tmp_path / "hooks.log"))
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "7")
    budgets = []

    def fake_export(report, meta, cfg, budget_s=None, **kw):
        budgets.append(budget_s)
        return SimpleNamespace(ok=False)
    monkeypatch.setattr(export, "export_report", fake_export)
    if path == "child":
        assert hooks.analyze_child(run) == 0
    else:   # the supervisor publishes a 'stopped' report when the cap or the timeout hit
        monkeypatch.setattr(hooks, "_run_capped", lambda *a: "stopped by the test")
        monkeypatch.setattr("os.nice", lambda inc: 0)   # (it would renice pytest itself)
        assert hooks.analyze_job(run) == 0
    assert len(budgets) == 1 and 6.5 < budgets[0] <= 7.0, budgets
