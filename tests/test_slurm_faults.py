"""Injected hook faults on a real Slurm: the job COMPLETES, the node stays IDLE (never drained),
and the hook log names the cause.  Every fault runs in both hook modes: ``spank`` (the SPANK
plugin's job_prolog/job_epilog in C, Python detached) and ``scripts`` (slurm.conf Prolog=/
Epilog= running ``reveal slurm prolog|epilog``)."""
import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOB = "#!/bin/sh\nsrun true\n"


@pytest.fixture(scope="module", params=["spank", "scripts"])
def cluster(request, slurm_cluster):
    with slurm_cluster.hook_mode(request.param):
        yield slurm_cluster


@contextlib.contextmanager
def spool_at(cluster, spool):
    """Point both the hook configuration and the SPANK plugin at ``spool``."""
    with cluster.hook_config(f'spool = "{spool}"\n'), cluster.spank_args(f"spool={spool}"):
        yield


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


def test_invalid_config(cluster):
    off = cluster.log_offset()
    # The configuration stays broken until the (possibly detached) hooks have run.
    with cluster.hook_config('spool = "/x"\nepilog_budget_s = = 1\n'):
        job = cluster.run_batch(JOB)
        log = survived(cluster, job, off, "configuration error", "invalid TOML", "line 2",
                       "reveal-slurm epilog")
    assert "epilog" in log and (cluster.mode == "spank" or "prolog" in log)


def test_config_with_unknown_key(cluster):
    off = cluster.log_offset()
    with cluster.hook_config('spool_dir = "/x"\n'):
        job = cluster.run_batch(JOB)
        survived(cluster, job, off, "unknown key 'spool_dir'")


@pytest.mark.parametrize("kind", ["directory", "binary"])
def test_unreadable_config(cluster, kind):
    off = cluster.log_offset()
    path = cluster.hook_config_path
    os.rename(path, path + ".saved")
    try:
        if kind == "directory":
            os.mkdir(path)
        else:
            open(path, "wb").write(b"\xff\xfe\x00spool")
        job = cluster.run_batch(JOB)
        survived(cluster, job, off, "configuration error",
                 "Is a directory" if kind == "directory" else "not UTF-8")
    finally:
        if os.path.isdir(path):
            os.rmdir(path)
        elif os.path.exists(path):
            os.remove(path)
        os.rename(path + ".saved", path)


def _mount_tmpfs(path, opts):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    return path


def _umount(path):
    subprocess.run(["umount", "-l", path], capture_output=True)


def test_unwritable_spool_read_only_fs(cluster):
    spool = _mount_tmpfs(os.path.join(cluster.base, "ro-spool"), "ro,size=1m")
    off = cluster.log_offset()
    try:
        with spool_at(cluster, spool):
            job = cluster.run_batch(JOB)
            survived(cluster, job, off, "Read-only file system")
    finally:
        _umount(spool)


def test_unwritable_spool_not_a_directory(cluster):
    off = cluster.log_offset()
    with spool_at(cluster, f"{cluster.conf}/spool"):
        job = cluster.run_batch(JOB)
        survived(cluster, job, off, "Not a directory")


def test_agent_killed_mid_job_then_recovers(cluster, slurm_users):
    user = slurm_users[0]
    # Make sure an agent runs and serves this job.
    cluster.run_batch(JOB, user=user)
    off = cluster.log_offset()
    job_id = cluster.sbatch("#!/bin/sh\nsrun sleep 3\n", user=user).stdout.strip()
    deadline = time.monotonic() + 30
    while cluster.job_state(job_id).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.1)
    time.sleep(1.0)
    pid = cluster.agent_pid()
    assert pid, "no agent answered"
    os.kill(pid, signal.SIGKILL)
    job = cluster.wait(job_id)
    survived(cluster, job, off, "the agent died or never ran for this job")
    # The next job starts a fresh agent and is recorded again.
    job2 = cluster.run_batch("#!/bin/sh\nsleep 1\nsrun true\n", user=user)
    assert job2.state == "COMPLETED"
    report = os.path.join(cluster.run_dir(job2.job_id), "report.json")
    deadline = time.monotonic() + 90  # the new agent may close the run after the job ended
    while not os.path.exists(report):
        assert time.monotonic() < deadline, cluster.hook_log_since(off)[-2000:]
        time.sleep(0.2)
    meta = json.load(open(os.path.join(cluster.run_dir(job2.job_id), "meta.json")))
    assert "0" in {s["step_id"] for s in meta["steps"]}
    assert cluster.agent_pid() not in (None, pid)


def test_analysis_raising(cluster):
    off = cluster.log_offset()
    with cluster.hook_config(f'spool = "{cluster.spool}"\n'
                                   'analyzer = "tests.slurm_fault_analyzers:boom"\n'):
        job = cluster.run_batch(JOB)
        survived(cluster, job, off, "analysis failed (tests.slurm_fault_analyzers:boom)",
                 "RuntimeError: injected analysis failure")


def test_analysis_slower_than_its_budget(cluster):
    off = cluster.log_offset()
    with cluster.hook_config(f'spool = "{cluster.spool}"\n'
                                   'analyzer = "tests.slurm_fault_analyzers:slow"\n'
                                   'analysis_timeout_s = 1\n'):
        t0 = time.monotonic()
        job = cluster.run_batch(JOB)
        assert time.monotonic() - t0 < 20  # the job is not held up by the analysis
        survived(cluster, job, off, "analysis exceeded analysis_timeout_s=1")
    times = cluster.hook_wall_times("epilog")
    assert times[job.job_id] < 1.5


def test_disk_full_spool(cluster, slurm_users):
    spool = _mount_tmpfs(os.path.join(cluster.base, "full-spool"), "size=2m,mode=0755")
    off = cluster.log_offset()
    try:
        with spool_at(cluster, spool):
            job_id = cluster.sbatch("#!/bin/sh\nsrun sleep 4\n",
                                          user=slurm_users[0]).stdout.strip()
            meta = os.path.join(cluster.run_dir(job_id, spool), "meta.json")
            deadline = time.monotonic() + 30
            while not os.path.exists(meta):
                assert time.monotonic() < deadline, "the job was never registered"
                time.sleep(0.1)
            # The spool fills up while the job runs.
            with open(os.path.join(spool, "filler"), "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            job = cluster.wait(job_id)
            log = survived(cluster, job, off, "No space left on device", timeout=30)
        assert "analysis" in log
    finally:
        cluster.stop_agent(spool)
        _umount(spool)


def test_broken_python_environment_never_drains(slurm_cluster):
    """The installed wrappers with an interpreter that cannot start (a broken virtualenv):
    Prolog and Epilog exit 0, the job completes, the node stays idle, slurmd's log says why."""
    from reveal_plugins.slurm.install import script
    hooks = os.path.join(slurm_cluster.base, "hooks")
    saved = {h: open(os.path.join(hooks, h)).read() for h in ("prolog", "epilog")}
    broken = os.path.join(slurm_cluster.base, "broken-venv-python")
    with open(broken, "w") as f:
        f.write("#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    os.chmod(broken, 0o755)
    try:
        for h in saved:
            with open(os.path.join(hooks, h), "w") as f:
                f.write(script(h, {"REVEAL_SLURM_LOG": slurm_cluster.hook_log},
                               python=broken))
        with slurm_cluster.hook_mode("scripts"):
            t0 = time.monotonic()
            job = slurm_cluster.run_batch(JOB)
            assert job.state == "COMPLETED", job.info
            assert time.monotonic() - t0 < 30
            state = slurm_cluster.node_state()
            if state != "idle":
                slurm_cluster.resume_node()
                pytest.fail(f"node drained by a broken Python: {state}")
        log = open(slurm_cluster.hook_log).read()
        assert f"reveal-slurm prolog: job={job.job_id} the hook exited 1" in log, log[-2000:]
        assert f"reveal-slurm epilog: job={job.job_id} the hook exited 1" in log, log[-2000:]
    finally:
        for h, text in saved.items():
            with open(os.path.join(hooks, h), "w") as f:
                f.write(text)
