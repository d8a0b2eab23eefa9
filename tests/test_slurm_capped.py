"""The Epilog's detached analysis runs in a memory/CPU cap: an analysis that exceeds its cap or
its (run-length-scaled) timeout leaves a report with ``status: partial`` and the reason, the
Epilog still exits 0 and the node stays idle."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from reveal_plugins.slurm.capped import CgroupCap, make_cap
from reveal_plugins.slurm.config import SlurmConfig, parse_config
from reveal_plugins.slurm.hooks import analysis_timeout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = "#!/bin/sh\nsrun sleep 2\n"


def _report(run_dir, timeout=30.0):
    path = os.path.join(run_dir, "report.json")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            time.sleep(0.2)
    pytest.fail(f"no {path} after {timeout:g} s")


@pytest.fixture
def run_dir(tmp_path):
    from reveal_plugins.detect.synth import SynthHost
    d = str(tmp_path / "run")
    SynthHost(2).write_run(d, 30.0, 0.1)
    os.chmod(str(tmp_path), 0o755)
    return d


def _analyze(run_dir, tmp_path, text):
    cfg = tmp_path / "slurm.toml"
    cfg.write_text(text)
    os.chmod(str(cfg), 0o644)
    env = dict(os.environ, REVEAL_SLURM_CONFIG=str(cfg), PYTHONPATH=ROOT,
               REVEAL_SLURM_LOG=str(tmp_path / "hooks.log"))
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.slurm.cli", "_analyze", run_dir],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return (tmp_path / "hooks.log").read_text()


def _cgroup_available():
    try:
        make = CgroupCap(64, 100, 0, f"probe-{os.getpid()}")
    except OSError as e:
        return str(e)
    make.cleanup()
    return None


@pytest.mark.parametrize("cap", ["cgroup", "rlimit"])
def test_memory_cap_hit_gives_a_partial_report(run_dir, tmp_path, cap, report_schema_validate):
    if os.geteuid() != 0:
        pytest.skip("the analysis caps are root's (the Epilog)")
    if cap == "cgroup" and _cgroup_available():
        pytest.skip(f"no cgroup to create here: {_cgroup_available()}")
    log = _analyze(run_dir, tmp_path, 'analyzer = "tests.slurm_fault_analyzers:hog"\n'
                   f'analysis_memory_max_mb = 300\nanalysis_cap = "{cap}"\n')
    rep = _report(run_dir, 1)
    report_schema_validate(rep)
    assert rep["status"] == "partial"
    assert "memory cap of 300 MB reached" in rep["status_reason"] and cap in rep["status_reason"]
    assert "ANALYSIS STOPPED" in rep["summary"]
    from reveal_plugins.report.text import render_text
    text = render_text(rep, color=False)
    assert "Analysis stopped" in text and "No anomalies" not in text
    assert "report status partial" in log
    for d in ("/sys/fs/cgroup/memory/reveal.analysis", "/sys/fs/cgroup/reveal.analysis"):
        if os.path.isdir(d):   # the cgroup it made is gone
            assert not [n for n in os.listdir(d) if n.startswith("job")]


def test_uncapped_analysis_of_the_same_run_succeeds(run_dir, tmp_path):
    """The cap is what stops the analysis: a real analysis under the default cap finishes."""
    log = _analyze(run_dir, tmp_path, "")
    rep = _report(run_dir, 1)
    assert rep["status"] == "ok", rep["status_reason"]
    assert "analysed in" in log


def test_timeout_gives_a_partial_report(run_dir, tmp_path):
    t0 = time.monotonic()
    _analyze(run_dir, tmp_path, 'analyzer = "tests.slurm_fault_analyzers:slow"\n'
             'analysis_timeout_s = 1\nanalysis_timeout_per_hour_s = 0\n')
    assert time.monotonic() - t0 < 20
    rep = _report(run_dir, 1)
    assert rep["status"] == "partial" and "analysis_timeout_s=1" in rep["status_reason"]


def test_timeout_scales_with_run_length(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    cfg = SlurmConfig()
    for hours, want in ((0.5, 605.0), (24, 840.0), (168, 2280.0)):
        (d / "meta.json").write_text(json.dumps({"start": 1e9, "end": 1e9 + hours * 3600}))
        assert analysis_timeout(cfg, str(d)) == (pytest.approx(want), pytest.approx(hours))
    cfg = parse_config({"analysis_timeout_max_s": 1000.0}, "x.toml")
    assert analysis_timeout(cfg, str(d))[0] == 1000.0
    with pytest.raises(ValueError, match="analysis_cap"):
        parse_config({"analysis_cap": "docker"}, "x.toml")


def test_no_cap_available_falls_back(monkeypatch):
    notes = []
    monkeypatch.setattr("reveal_plugins.slurm.capped.CGROOT", "/nonexistent")
    monkeypatch.setattr("reveal_plugins.slurm.capped.systemd_running", lambda: False)
    cap = make_cap("auto", 100, 100, 5, "x", notes)
    assert cap.kind == "rlimit"
    assert make_cap("off", 100, 100, 5, "x").kind == "off"


# -- on a real Slurm ---------------------------------------------------------------------------

@pytest.mark.slurm
@pytest.mark.slow
def test_epilog_analysis_over_its_memory_cap(slurm_cluster):
    c = slurm_cluster
    off = c.log_offset()
    with c.hook_config(f'spool = "{c.spool}"\n'
                       'analyzer = "tests.slurm_fault_analyzers:hog"\n'
                       'analysis_memory_max_mb = 300\n'):
        job = c.run_batch(JOB)
        assert job.state == "COMPLETED", job.info
        rep = _report(c.run_dir(job.job_id), 60)
    assert rep["status"] == "partial", rep
    assert "memory cap of 300 MB reached" in rep["status_reason"]
    assert rep["run"]["job_id"] == str(job.job_id)
    state = c.node_state()
    if state != "idle":
        c.resume_node()
        pytest.fail(f"node {state} after the job: {c.hook_log_since(off)[-1500:]}")
    assert c.hook_wall_times("epilog")[job.job_id] < 1.5    # the Epilog returned at once
    log = c.hook_log_since(off)
    assert "analysis stopped: memory cap" in log and "Traceback" not in log
