"""Real jobs on a real Slurm (the ``slurm_cluster`` session fixture): per-step telemetry, the
``--reveal`` option, reports readable by the job's user only."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import SCHEMA_PATH
from reveal_plugins.spool import job_run_dirs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TWO_STEPS = """#!/bin/sh
srun -n1 sh -c 'i=0; while [ $i -lt 1000000 ]; do i=$((i+1)); done'
srun -n1 dd if=/dev/urandom of=/dev/null bs=1M count=600 status=none
"""


def wait_file(path, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.2)
    return False


def reveal_as(cluster, user, *args):
    cmd = [sys.executable, "-m", "reveal_plugins.cli", *args]
    if user:
        cmd = ["runuser", "-u", user, "--", "env", f"REVEAL_SPOOL={cluster.spool}",
               f"PYTHONPATH={os.path.dirname(os.path.dirname(__file__))}", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")


@pytest.fixture(scope="module")
def two_step_job(slurm_cluster, slurm_users):
    user = slurm_users[0]
    job = slurm_cluster.run_batch(TWO_STEPS, user=user, timeout=180)
    return job, user


def test_two_step_job_one_run_dir_with_step_boundaries(slurm_cluster, two_step_job):
    job, user = two_step_job
    assert job.state == "COMPLETED", job.info
    assert slurm_cluster.node_state() == "idle"
    dirs = job_run_dirs(job.job_id, slurm_cluster.spool)
    assert dirs == [slurm_cluster.run_dir(job.job_id)]
    meta = json.load(open(os.path.join(dirs[0], "meta.json")))
    assert meta["run"]["source"] == "slurm" and meta["run"]["user"] == user
    assert meta["run"]["job_id"] == job.job_id and meta["exit_code"] == 0
    steps = {s["step_id"]: s for s in meta["steps"]}
    assert {"batch", "0", "1"} <= set(steps), steps
    s0, s1, batch = steps["0"], steps["1"], steps["batch"]
    assert s0["start"] < s0["end"] <= s1["start"] < s1["end"]
    # Each step's slurmstepd reports its end after srun returned: allow a little overlap.
    assert batch["start"] < s0["start"] and s1["end"] <= batch["end"] + 0.5
    assert steps["extern"]["start"] <= batch["start"]
    assert s0["exit_code"] == 0 and s1["exit_code"] == 0
    # Real work took real time in each step.
    assert s0["end"] - s0["start"] > 0.2 and s1["end"] - s1["start"] > 0.2
    events = [json.loads(line) for line in open(os.path.join(dirs[0], "events.jsonl"))]
    assert [e["event"] for e in events].count("run_end") == 1


def test_report_valid_and_summary_for_the_user_only(slurm_cluster, two_step_job, slurm_users):
    jsonschema = pytest.importorskip("jsonschema")
    job, user = two_step_job
    other = slurm_users[1]
    run_dir = slurm_cluster.run_dir(job.job_id)
    assert wait_file(os.path.join(run_dir, "summary.txt")), \
        slurm_cluster.hook_log_since(0)[-2000:]
    report = json.load(open(os.path.join(run_dir, "report.json")))
    jsonschema.validate(report, json.load(open(SCHEMA_PATH)))
    assert report["run"]["source"] == "slurm" and report["run"]["job_id"] == job.job_id
    assert {"0", "1"} <= {s["step_id"] for s in report["run"].get("steps", [])}
    summary = open(os.path.join(run_dir, "summary.txt")).read()
    assert f"Slurm job {job.job_id}" in summary and "steps:" in summary

    r = reveal_as(slurm_cluster, user, "report", job.job_id)
    assert r.returncode == 0, r.stderr
    assert job.job_id in r.stdout
    r = reveal_as(slurm_cluster, user, "report", job.job_id, "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["run"]["job_id"] == job.job_id

    r = reveal_as(slurm_cluster, other, "report", job.job_id)
    assert r.returncode != 0
    assert "anomal" not in r.stdout.lower()
    for name in ("report.json", "summary.txt", "meta.json", "events.jsonl"):
        r = subprocess.run(["runuser", "-u", other, "--", "cat", os.path.join(run_dir, name)],
                           capture_output=True, text=True)
        assert r.returncode != 0 and "Permission denied" in r.stderr
        r = subprocess.run(["runuser", "-u", other, "--", "sh", "-c",
                            f"echo forged > {os.path.join(run_dir, name)}"],
                           capture_output=True, text=True)
        assert r.returncode != 0
    assert "forged" not in open(os.path.join(run_dir, "report.json")).read()


def test_reveal_off_step_not_recorded(slurm_cluster, slurm_users):
    job = slurm_cluster.run_batch("#!/bin/sh\nsrun --reveal=off true\nsrun --reveal=live true\n"
                                  "srun true\n", user=slurm_users[0])
    assert job.state == "COMPLETED"
    meta = json.load(open(os.path.join(slurm_cluster.run_dir(job.job_id), "meta.json")))
    steps = {s["step_id"] for s in meta["steps"]}
    assert "0" not in steps and {"1", "2", "batch"} <= steps
    modes = {e.get("step_id"): e.get("mode") for e in map(
        json.loads, open(os.path.join(slurm_cluster.run_dir(job.job_id), "events.jsonl")))
        if e["event"] == "step_start"}
    assert modes["1"] == "live" and modes["2"] == "on"


def test_sbatch_reveal_off_skips_batch_and_inherited_steps(slurm_cluster, slurm_users):
    job = slurm_cluster.run_batch("#!/bin/sh\nsrun true\nsrun --reveal=on true\n",
                                  user=slurm_users[0], args=("--reveal=off",))
    assert job.state == "COMPLETED"
    meta = json.load(open(os.path.join(slurm_cluster.run_dir(job.job_id), "meta.json")))
    steps = {s["step_id"] for s in meta["steps"]}
    assert "batch" not in steps and "0" not in steps and "1" in steps


@pytest.mark.parametrize("tool", ["sbatch", "srun", "salloc"])
def test_bogus_reveal_value_rejected_and_job_not_started(slurm_cluster, slurm_users, tool):
    user = slurm_users[0]
    before = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True,
                            text=True, env=slurm_cluster.env).stdout.split()
    if tool == "sbatch":
        r = slurm_cluster.sbatch("#!/bin/sh\ntrue\n", user=user, args=("--reveal=bogus",),
                                 check=False)
    else:
        argv = [tool, "--reveal=bogus", "true"]
        r = subprocess.run(["runuser", "-u", user, "--", "env",
                            f"SLURM_CONF={slurm_cluster.conf}", *argv], capture_output=True,
                           text=True, timeout=60, cwd=slurm_cluster.workdir(user))
    assert r.returncode != 0
    assert "invalid value 'bogus' for --reveal (expected off, on or live)" in r.stderr
    after = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True,
                           text=True, env=slurm_cluster.env).stdout.split()
    assert after == before


def test_srun_help_lists_the_option(slurm_cluster):
    r = subprocess.run(["srun", "--help"], capture_output=True, text=True,
                       env=slurm_cluster.env, timeout=30)
    assert "--reveal=[off|on|live]" in r.stdout


def test_job_info_from_slurm_clis(slurm_cluster, two_step_job):
    job, user = two_step_job
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "slurm", "job-info",
                        job.job_id], capture_output=True, text=True,
                       env=slurm_cluster.env, timeout=60)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["job_id"] == job.job_id and info["user"] == user
    assert info["state"] == "COMPLETED" and info["nodes"] == slurm_cluster.node
    assert info["source"] in ("squeue", "scontrol")


def test_spank_mode_registers_in_c_within_budget(slurm_cluster, two_step_job, slurm_users):
    # two_step_job started the agent (cold start: the detached Python prolog registered it).
    job = slurm_cluster.run_batch("#!/bin/sh\nsrun true\n", user=slurm_users[0])
    meta = json.load(open(os.path.join(slurm_cluster.run_dir(job.job_id), "meta.json")))
    assert meta["run"]["extra"].get("registered_by") == "spank"
    assert slurm_cluster.hook_wall_times("prolog")[job.job_id] < 0.5
    assert slurm_cluster.hook_wall_times("epilog")[job.job_id] < 1.0


def test_scripts_mode_records_steps_too(slurm_cluster, slurm_users):
    with slurm_cluster.hook_mode("scripts"):
        job = slurm_cluster.run_batch("#!/bin/sh\nsrun true\nsrun true\n", user=slurm_users[0])
        assert job.state == "COMPLETED" and slurm_cluster.node_state() == "idle"
    # (On a cold node the agent may still be starting: the report comes once it closed the run.)
    assert wait_file(os.path.join(slurm_cluster.run_dir(job.job_id), "report.json"))
    meta = json.load(open(os.path.join(slurm_cluster.run_dir(job.job_id), "meta.json")))
    assert "registered_by" not in meta["run"]["extra"]
    assert {"0", "1", "batch"} <= {s["step_id"] for s in meta["steps"]}
    assert job.job_id in slurm_cluster.hook_wall_times("prolog")


def test_task_hooks_mode_without_spank(slurm_cluster, slurm_users):
    """Sites that load no SPANK plugin: TaskProlog/TaskEpilog (as the job user) mark steps."""
    user = slurm_users[0]
    with slurm_cluster.hook_mode("tasks"):
        # Task hooks run as the user and cannot queue requests for an agent still starting
        # (only root's queued requests count): make sure one runs, as a service would.
        slurm_cluster.run_batch("#!/bin/sh\ntrue\n")
        job = slurm_cluster.run_batch("#!/bin/sh\nsrun -n2 sh -c 'echo RUN=$REVEAL_RUN_ID'\n"
                                      "srun true\n", user=user, args=("-n2",))
        assert job.state == "COMPLETED" and slurm_cluster.node_state() == "idle"
    assert f"RUN=slurm-{job.job_id}" in slurm_cluster.job_output(job, user)
    run_dir = slurm_cluster.run_dir(job.job_id)
    assert wait_file(os.path.join(run_dir, "report.json"))
    events = [json.loads(line) for line in open(os.path.join(run_dir, "events.jsonl"))]
    starts = [e["step_id"] for e in events if e["event"] == "step_start"]
    # once per step on the node (local task 0 only), sent over the socket as the job's user
    assert sorted(starts) == ["0", "1", "batch"], events
    assert all(e.get("source") == "task-hook" for e in events if e["event"] == "step_start")
    meta = json.load(open(os.path.join(run_dir, "meta.json")))
    assert {s["step_id"] for s in meta["steps"]} == {"0", "1", "batch"}
