"""Injected hook faults on a real Slurm: the job COMPLETES, the node stays IDLE (never drained),
and the hook log names the cause."""
import json
import os
import signal
import subprocess
import time

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOB = "#!/bin/sh\nsrun true\n"


def survived(cluster, job, offset, *causes, timeout=15):
    """Assert the job completed, the node is idle, and every cause shows up in the hook log."""
    assert job.state == "COMPLETED", job.info
    state = cluster.node_state()
    if state != "idle":
        cluster.resume_node()  # keep the session usable, then fail loudly
        pytest.fail(f"node {cluster.node} is {state!r} after the job (hook log: "
                    f"{cluster.hook_log_since(offset)[-1500:]})")
    deadline = time.monotonic() + timeout
    while True:
        log = cluster.hook_log_since(offset)
        missing = [c for c in causes if c not in log]
        if not missing:
            return log
        if time.monotonic() > deadline:
            pytest.fail(f"hook log lacks {missing}:\n{log[-2000:]}")
        time.sleep(0.2)


def test_invalid_config(slurm_cluster):
    off = slurm_cluster.log_offset()
    with slurm_cluster.hook_config('spool = "/x"\nepilog_budget_s = = 1\n'):
        job = slurm_cluster.run_batch(JOB)
    log = survived(slurm_cluster, job, off, "configuration error", "invalid TOML",
                   "line 2")
    assert "prolog" in log and "epilog" in log


def test_config_with_unknown_key(slurm_cluster):
    off = slurm_cluster.log_offset()
    with slurm_cluster.hook_config('spool_dir = "/x"\n'):
        job = slurm_cluster.run_batch(JOB)
    survived(slurm_cluster, job, off, "unknown key 'spool_dir'")


@pytest.mark.parametrize("kind", ["directory", "binary"])
def test_unreadable_config(slurm_cluster, kind):
    off = slurm_cluster.log_offset()
    path = slurm_cluster.hook_config_path
    os.rename(path, path + ".saved")
    try:
        if kind == "directory":
            os.mkdir(path)
        else:
            open(path, "wb").write(b"\xff\xfe\x00spool")
        job = slurm_cluster.run_batch(JOB)
    finally:
        if os.path.isdir(path):
            os.rmdir(path)
        elif os.path.exists(path):
            os.remove(path)
        os.rename(path + ".saved", path)
    survived(slurm_cluster, job, off, "configuration error",
             "Is a directory" if kind == "directory" else "not UTF-8")


def _mount_tmpfs(path, opts):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    return path


def _umount(path):
    subprocess.run(["umount", "-l", path], capture_output=True)


def test_unwritable_spool_read_only_fs(slurm_cluster):
    spool = _mount_tmpfs(os.path.join(slurm_cluster.base, "ro-spool"), "ro,size=1m")
    off = slurm_cluster.log_offset()
    try:
        with slurm_cluster.hook_config(f'spool = "{spool}"\n'):
            job = slurm_cluster.run_batch(JOB)
        survived(slurm_cluster, job, off, "Read-only file system")
    finally:
        _umount(spool)


def test_unwritable_spool_not_a_directory(slurm_cluster):
    off = slurm_cluster.log_offset()
    with slurm_cluster.hook_config(f'spool = "{slurm_cluster.conf}/spool"\n'):
        job = slurm_cluster.run_batch(JOB)
    survived(slurm_cluster, job, off, "Not a directory")


def test_agent_killed_mid_job_then_recovers(slurm_cluster, slurm_users):
    user = slurm_users[0]
    # Make sure an agent runs and serves this job.
    slurm_cluster.run_batch(JOB, user=user)
    off = slurm_cluster.log_offset()
    job_id = slurm_cluster.sbatch("#!/bin/sh\nsrun sleep 3\n", user=user).stdout.strip()
    deadline = time.monotonic() + 30
    while slurm_cluster.job_state(job_id).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.1)
    time.sleep(1.0)
    pid = slurm_cluster.agent_pid()
    assert pid, "no agent answered"
    os.kill(pid, signal.SIGKILL)
    job = slurm_cluster.wait(job_id)
    survived(slurm_cluster, job, off, "the agent died or never ran for this job")
    # The next job starts a fresh agent and is recorded again.
    job2 = slurm_cluster.run_batch("#!/bin/sh\nsleep 1\nsrun true\n", user=user)
    assert job2.state == "COMPLETED"
    meta = json.load(open(os.path.join(slurm_cluster.run_dir(job2.job_id), "meta.json")))
    assert "0" in {s["step_id"] for s in meta["steps"]}
    assert slurm_cluster.agent_pid() not in (None, pid)


def test_analysis_raising(slurm_cluster):
    off = slurm_cluster.log_offset()
    with slurm_cluster.hook_config(f'spool = "{slurm_cluster.spool}"\n'
                                   'analyzer = "tests.slurm_fault_analyzers:boom"\n'):
        job = slurm_cluster.run_batch(JOB)
        survived(slurm_cluster, job, off, "analysis failed (tests.slurm_fault_analyzers:boom)",
                 "RuntimeError: injected analysis failure")


def test_analysis_slower_than_its_budget(slurm_cluster):
    off = slurm_cluster.log_offset()
    with slurm_cluster.hook_config(f'spool = "{slurm_cluster.spool}"\n'
                                   'analyzer = "tests.slurm_fault_analyzers:slow"\n'
                                   'analysis_timeout_s = 1\n'):
        t0 = time.monotonic()
        job = slurm_cluster.run_batch(JOB)
        assert time.monotonic() - t0 < 20  # the job is not held up by the analysis
        survived(slurm_cluster, job, off, "analysis exceeded analysis_timeout_s=1")
    times = slurm_cluster.hook_wall_times("epilog")
    assert times[job.job_id] < 1.5


def test_disk_full_spool(slurm_cluster, slurm_users):
    spool = _mount_tmpfs(os.path.join(slurm_cluster.base, "full-spool"), "size=2m,mode=0755")
    off = slurm_cluster.log_offset()
    try:
        with slurm_cluster.hook_config(f'spool = "{spool}"\n'):
            job_id = slurm_cluster.sbatch("#!/bin/sh\nsrun sleep 4\n",
                                          user=slurm_users[0]).stdout.strip()
            meta = os.path.join(slurm_cluster.run_dir(job_id, spool), "meta.json")
            deadline = time.monotonic() + 30
            while not os.path.exists(meta):
                assert time.monotonic() < deadline, "the job was never registered"
                time.sleep(0.1)
            # The spool fills up while the job runs.
            with open(os.path.join(spool, "filler"), "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            job = slurm_cluster.wait(job_id)
            log = survived(slurm_cluster, job, off, "No space left on device", timeout=30)
        assert "analysis" in log
    finally:
        slurm_cluster.stop_agent(spool)
        _umount(spool)
