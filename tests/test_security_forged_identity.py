"""Issue 22 (medium): identities an ordinary user can forge are not taken for Slurm's or the
agent's.  A user's ``exec -a 'slurmstepd: [123.0]'`` is not job 123's slurmstepd; a cgroup a
user creates under a delegated ``user@UID.service`` that mimics ``slurmstepd.scope/job_123`` is
not read; the walk of a job's cgroup tree is bounded; a user's process whose command line names
the agent module does not make the hooks believe an agent is starting.  Users are real
(``runuser -u nobody``): the checks read /proc as the root agent does."""
import os
import shutil
import subprocess
import time

import pytest

from reveal_plugins.slurm import hooks
from reveal_plugins.probes import jobscope
from reveal_plugins.probes.jobscope import (JobScopeProbe, cgroup_members, job_cgroups,
                                               slurmstepd_pids)
from reveal_plugins.types import RunInfo

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"),
                                reason="needs root and runuser (another user's processes)")

JOB = "918273645"      # unlikely to be a real job on the test machine


def _find(prefix: bytes, timeout: float = 5.0) -> int:
    """PID of the process whose command line starts with ``prefix``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        if f.read(256).startswith(prefix):
                            return int(d)
                except OSError:
                    pass
        time.sleep(0.05)
    raise AssertionError(f"no process {prefix!r}")


def _uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("Uid:")).split()[1])


@pytest.fixture
def spawn():
    procs = []

    def start(argv, user=None):
        argv = (["runuser", "-u", user, "--"] if user else []) + argv
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        return p
    yield start
    for p in procs:
        try:
            os.killpg(p.pid, 9)
        except OSError:
            pass
        p.wait()


def _run(job=JOB, uid=65534):
    return RunInfo(run_id=f"slurm-{job}", run_dir="/nonexistent", source="slurm", job_id=job,
                   uid=uid)


def test_users_exec_a_slurmstepd_is_not_the_jobs(spawn, tmp_path):
    spawn(["bash", "-c", f'exec -a "slurmstepd: [{JOB}.0]" sleep 60'], user="nobody")
    fake = _find(f"slurmstepd: [{JOB}.0]".encode())
    assert _uid(fake) == 65534
    assert fake not in slurmstepd_pids(JOB)
    p = JobScopeProbe(_run(), cgroup_root=str(tmp_path), rescan_every=1)
    p.open()
    p.sample()
    assert p.mode == "none" and "no processes found yet" in p.describe()["note"]


def test_roots_slurmstepd_executable_is_the_jobs(spawn, tmp_path):
    """The same command line from root's ``slurmstepd`` executable (Name in /proc/PID/status)
    with a root parent is still found (proctrack/linuxproc keeps working)."""
    exe = tmp_path / "slurmstepd"
    shutil.copy(shutil.which("sleep"), exe)
    spawn(["bash", "-c", f'exec -a "slurmstepd: [{JOB}.1]" {exe} 60'])
    real = _find(f"slurmstepd: [{JOB}.1]".encode())
    assert real in slurmstepd_pids(JOB)
    # root, but not the slurmstepd executable: not the job's either
    spawn(["bash", "-c", f'exec -a "slurmstepd: [{JOB}.2]" sleep 60'])
    other = _find(f"slurmstepd: [{JOB}.2]".encode())
    assert other not in slurmstepd_pids(JOB)


def test_user_cgroup_mimicking_the_job_under_a_user_slice_is_not_read(tmp_path):
    root = tmp_path / "cgroup"
    fake = root / "user.slice" / "user-65534.slice" / "user@65534.service" / "app.slice" / \
        "slurmstepd.scope" / f"job_{JOB}"
    fake.mkdir(parents=True)
    (fake / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (fake / "cpu.stat").write_text("usage_usec 5000000\nuser_usec 1\nsystem_usec 1\n")
    (fake / "memory.current").write_text(str(1 << 30))
    for d in [fake, *fake.parents]:
        if d == root:
            break
        os.chown(d, 65534, 65534)
    # also v1-looking: <ctrl>/slurm*/uid_N/job_N below a v2 user slice is not Slurm's
    v1 = root / "user.slice" / "slurm_x" / "uid_65534" / f"job_{JOB}"
    v1.mkdir(parents=True)
    (v1 / "cgroup.procs").write_text(f"{os.getpid()}\n")
    assert job_cgroups(JOB, 65534, str(root)) == []
    assert job_cgroups(JOB, None, str(root)) == []
    p = JobScopeProbe(_run(), cgroup_root=str(root), proc=str(tmp_path / "proc"),
                      rescan_every=1)
    os.makedirs(tmp_path / "proc")
    p.open()
    p.sample()
    assert p.mode == "none", p.describe()
    # Slurm's own v2 roots are still read
    real = root / "system.slice" / "slurmstepd.scope" / f"job_{JOB}"
    real.mkdir(parents=True)
    assert job_cgroups(JOB, 65534, str(root)) == [str(real)]
    multi = root / "system.slice" / "n1_slurmstepd.scope" / f"job_{JOB}"
    multi.mkdir(parents=True)
    real.rmdir()
    assert job_cgroups(JOB, 65534, str(root)) == [str(multi)]


def test_cgroup_walk_is_bounded_in_depth_and_entries(tmp_path):
    job = tmp_path / f"job_{JOB}"
    deep = job
    for i in range(12):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    (job / "cgroup.procs").write_text("11\n")
    (deep / "cgroup.procs").write_text("99\n")       # 12 levels down: past the bound
    assert cgroup_members(str(job)) == [11]
    wide = tmp_path / "wide"
    for i in range(jobscope.MAX_CGROUP_DIRS + 200):
        (wide / f"c{i:05d}").mkdir(parents=True)
        (wide / f"c{i:05d}" / "cgroup.procs").write_text(f"{1000 + i}\n")
    got = cgroup_members(str(wide))
    assert 0 < len(got) < jobscope.MAX_CGROUP_DIRS


def test_users_process_named_like_the_agent_is_not_an_agent_starting(spawn, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    spawn(["bash", "-c", 'exec -a "python3 -m reveal_plugins.agent.daemon --spool x" '
                         'sleep 60'], user="nobody")
    fake = _find(b"python3 -m reveal_plugins.agent.daemon --spool x")
    (spool / ".agent-starter").write_text(str(fake))     # the PID recycled by a user
    assert not hooks._agent_starting(str(spool))
    assert not hooks._is_agent(str(fake))
    # root's agent (by its command line) is
    spawn(["bash", "-c", 'exec -a "python3 -m reveal_plugins.agent.daemon --spool y" '
                         'sleep 60'])
    real = _find(b"python3 -m reveal_plugins.agent.daemon --spool y")
    (spool / ".agent-starter").write_text(str(real))
    assert hooks._agent_starting(str(spool))
