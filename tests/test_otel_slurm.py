"""End to end on a real Slurm (the ``slurm_cluster`` session fixture): a job's Epilog analysis
sends one trace (job -> steps) to a receiver the test starts; a hung backend never delays the
Epilog, and the job's run can be re-sent by job id."""
import json
import os
import time

import pytest

from fixtures_otlp import SLURM_OTEL_CONFIG

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOB = "#!/bin/sh\nsrun -n1 sleep 1\nsrun -n1 sh -c 'sleep 0.5; exit 0'\n"
ANALYZER = "tests.fixtures_otlp:slurm_analyzer_with_otel"


def _otel_config(cluster, text):
    path = os.path.join(os.path.dirname(cluster.hook_config_path), SLURM_OTEL_CONFIG)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    return path


def _wait_file(path, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.2)
    return False


def _run_job(cluster, user, otel_toml):
    path = _otel_config(cluster, otel_toml)
    try:
        with cluster.hook_config(cluster.default_hook_config + f'analyzer = "{ANALYZER}"\n'):
            job = cluster.run_batch(JOB, user=user, timeout=180)
            run_dir = cluster.run_dir(job.job_id)
            assert _wait_file(os.path.join(run_dir, "otel.json")), \
                f"no otel.json in {run_dir}; hook log:\n{cluster.hook_log_since(0)[-3000:]}"
    finally:
        os.unlink(path)
    return job, run_dir


def test_slurm_job_produces_one_trace(slurm_cluster, slurm_users, otlp_http):
    job, run_dir = _run_job(slurm_cluster, slurm_users[0],
                            f'[otel]\nendpoint = "{otlp_http.endpoint}"\nbudget_s = 5\n')
    assert job.state == "COMPLETED", job.info
    report = json.load(open(os.path.join(run_dir, "report.json")))
    meta = json.load(open(os.path.join(run_dir, "meta.json")))
    n = 1 + len(report["run"].get("steps") or []) + len(report["anomalies"])
    spans = otlp_http.wait_spans(n)
    assert len(spans) == n and len({s["trace_id"] for s in spans}) == 1
    roots = [s for s in spans if s["parent_span_id"] is None]
    assert len(roots) == 1
    root = roots[0]
    assert root["name"] == "slurm job"
    assert root["attributes"]["slurm.job.id"] == job.job_id
    assert root["attributes"]["user.name"] == slurm_users[0]
    assert root["resource"]["reveal.scheduler"] == "slurm"
    extra = meta["run"].get("extra") or {}
    if extra.get("cluster"):
        assert root["resource"]["slurm.cluster.name"] == extra["cluster"]
        assert root["attributes"]["reveal.cluster"] == extra["cluster"]
    assert root["resource"]["host.name"]
    # the root covers the telemetry (the report's run start/end) and every step
    r_steps = report["run"]["steps"]
    assert abs(root["start"] - min([report["run"]["start"]] + [s["start"] for s in r_steps])) < 1e-6
    assert abs(root["end"] - max([report["run"]["end"]] + [s["end"] for s in r_steps])) < 1e-6
    assert root["attributes"]["reveal.telemetry.start"] == report["run"]["start"]
    steps = {s["name"]: s for s in spans if s["name"].startswith("step ")}
    assert {"step 0", "step 1"} <= set(steps), sorted(steps)
    m_steps = {s["step_id"]: s for s in meta["steps"]}
    for sid in ("0", "1"):
        sp = steps[f"step {sid}"]
        assert sp["parent_span_id"] == root["span_id"]
        assert abs(sp["start"] - m_steps[sid]["start"]) < 1e-6    # real step times
        assert abs(sp["end"] - m_steps[sid]["end"]) < 1e-6
        assert root["start"] <= sp["start"] < sp["end"] <= root["end"]
    assert steps["step 0"]["end"] <= steps["step 1"]["start"] + 1e-6
    assert json.load(open(os.path.join(run_dir, "otel.json")))["ok"]


def test_slurm_epilog_not_delayed_by_a_hung_backend_then_re_export_by_job_id(
        slurm_cluster, slurm_users, otlp_blackhole, otlp_http, monkeypatch):
    job, run_dir = _run_job(slurm_cluster, slurm_users[0],
                            f'[otel]\nendpoint = "{otlp_blackhole}"\nprotocol = "grpc"\n')
    assert job.state == "COMPLETED", job.info
    status = json.load(open(os.path.join(run_dir, "otel.json")))
    # nobody waits on the detached analysis: it grants the export the full timeout_s (10 s by
    # default), not the 1 s job-end budget, and no more
    assert not status["ok"] and status["seconds"] < 10 + 1.5, status
    # the export runs in the analysis the Epilog starts detached: the Epilog (interpreter start
    # included, on a busy machine) never waits for it
    epilog_s = slurm_cluster.hook_wall_times("epilog").get(job.job_id)
    assert epilog_s is not None and epilog_s < 2.5, epilog_s
    assert slurm_cluster.node_state() == "idle"
    # the backend is back: re-send the job by its id (run dirs found under the spool)
    from reveal_plugins.otel.cli import main
    monkeypatch.setenv("REVEAL_SPOOL", slurm_cluster.spool)
    assert main(["export", job.job_id, "--endpoint", otlp_http.endpoint]) == 0
    spans = otlp_http.wait_spans(1)
    assert spans[0]["trace_id"] == status["trace_id"]
