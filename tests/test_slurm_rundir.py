"""Permission model of run directories created by a root agent (reveal_plugins/store/rundir).

Two real non-root users who share a primary group: A owns a job, B must not read or overwrite
A's telemetry or report; a symlink planted where a user could write never makes root write
through it.
"""
import os
import pwd
import shutil
import subprocess
import tempfile

import pytest

from reveal_plugins.store.rundir import RunDirError, acl_users, create_run_dir, write_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the permission model needs root")


def as_user(user, *argv):
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True,
                          timeout=30)


@pytest.fixture
def spool():
    # Not under pytest's tmp_path: that is 0700, so the test users could not reach anything.
    base = tempfile.mkdtemp(prefix="reveal-rundir-")
    os.chmod(base, 0o755)
    yield os.path.join(base, "spool")
    shutil.rmtree(base, ignore_errors=True)


def _job_files(spool, uid):
    run_dir = create_run_dir(os.path.join(spool, "jobs", "42", "node1"), uid=uid)
    # What the agent and the analysis write there (same modes as the store).
    fd = os.open(os.path.join(run_dir, "meta.json"), os.O_WRONLY | os.O_CREAT, 0o640)
    os.write(fd, b'{"secret": "telemetry of A"}')
    os.close(fd)
    os.makedirs(os.path.join(run_dir, "segments"), mode=0o750)
    write_file(run_dir, "report.json", b'{"summary": "report of A"}')
    return run_dir


def test_job_user_reads_other_users_cannot(spool, slurm_users):
    a, b = slurm_users
    ua, ub = pwd.getpwnam(a), pwd.getpwnam(b)
    assert ua.pw_gid == ub.pw_gid  # the hard case: same primary group
    run_dir = _job_files(spool, ua.pw_uid)
    assert run_dir == os.path.join(os.path.realpath(spool), "jobs", "42", "node1")
    st = os.stat(run_dir)
    assert (st.st_uid, st.st_gid) == (0, 0)
    assert acl_users(run_dir) == [ua.pw_uid]

    r = as_user(a, "cat", os.path.join(run_dir, "report.json"), os.path.join(run_dir, "meta.json"))
    assert r.returncode == 0 and "report of A" in r.stdout and "telemetry of A" in r.stdout
    assert as_user(a, "ls", os.path.join(spool, "jobs", "42")).stdout.split() == ["node1"]
    assert as_user(a, "ls", os.path.join(run_dir, "segments")).returncode == 0

    for path in ("report.json", "meta.json"):
        r = as_user(b, "cat", os.path.join(run_dir, path))
        assert r.returncode != 0 and "Permission denied" in r.stderr
    assert as_user(b, "ls", os.path.join(spool, "jobs", "42")).returncode != 0
    # Nobody but root can list the jobs of others or write anywhere in the job.
    assert as_user(a, "ls", os.path.join(spool, "jobs")).returncode != 0
    for user in (a, b):
        r = as_user(user, "sh", "-c", f"echo x > {run_dir}/report.json")
        assert r.returncode != 0
        r = as_user(user, "sh", "-c", f"ln -s /etc/shadow {run_dir}/evil")
        assert r.returncode != 0
    assert open(os.path.join(run_dir, "report.json")).read() == '{"summary": "report of A"}'


def test_planted_symlink_is_never_followed(spool, tmp_path, slurm_users):
    a, _ = slurm_users
    uid = pwd.getpwnam(a).pw_uid
    create_run_dir(os.path.join(spool, "jobs", "1", "n"), uid=uid)
    target = tmp_path / "target"
    target.mkdir()
    # A misconfigured spool where users could write (e.g. jobs/ made 1777 by an admin):
    os.chmod(os.path.join(spool, "jobs"), 0o1777)
    os.symlink(str(target), os.path.join(spool, "jobs", "7"))
    with pytest.raises(RunDirError, match="writable by group/other"):
        create_run_dir(os.path.join(spool, "jobs", "7", "n"), uid=uid)
    os.chmod(os.path.join(spool, "jobs"), 0o711)
    # Even in a root-only directory, a symlink component is refused, not followed.
    with pytest.raises(RunDirError, match="symlink"):
        create_run_dir(os.path.join(spool, "jobs", "7", "n"), uid=uid)
    assert list(target.iterdir()) == []

    # A symlink planted at a file name is replaced, never written through.
    run_dir = os.path.join(spool, "jobs", "1", "n")
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    os.symlink(str(victim), os.path.join(run_dir, "summary.txt"))
    write_file(run_dir, "summary.txt", b"summary")
    assert victim.read_text() == "untouched"
    assert not os.path.islink(os.path.join(run_dir, "summary.txt"))
    # ... and a run directory that is itself a symlink is refused by the writer.
    os.symlink(str(target), os.path.join(spool, "jobs", "1", "link"))
    with pytest.raises(RunDirError):
        write_file(os.path.join(spool, "jobs", "1", "link"), "summary.txt", b"x")
    assert list(target.iterdir()) == []


def test_paths_outside_the_spool_and_foreign_owners_refused(spool, tmp_path, slurm_users):
    a, _ = slurm_users
    ua = pwd.getpwnam(a)
    with pytest.raises(RunDirError, match="outside the spool"):
        create_run_dir(os.path.join(spool, "jobs", "..", "..", "x"), uid=ua.pw_uid,
                       spool=spool)
    with pytest.raises(RunDirError, match="only inside its spool"):
        create_run_dir(str(tmp_path / "home" / "run"), uid=ua.pw_uid)
    # A directory inside the spool owned by a user (planted) is refused.
    create_run_dir(os.path.join(spool, "jobs", "5", "n"), uid=ua.pw_uid)
    os.mkdir(os.path.join(spool, "jobs", "6"))
    os.chown(os.path.join(spool, "jobs", "6"), ua.pw_uid, ua.pw_gid)
    with pytest.raises(RunDirError, match="owned by uid"):
        create_run_dir(os.path.join(spool, "jobs", "6", "n"), uid=ua.pw_uid)


def test_reused_job_id_of_another_user_is_moved_aside(spool, slurm_users):
    a, b = slurm_users
    ua, ub = pwd.getpwnam(a), pwd.getpwnam(b)
    old = _job_files(spool, ua.pw_uid)
    new = create_run_dir(old, uid=ub.pw_uid)
    assert new == old and acl_users(new) == [ub.pw_uid]
    assert not os.path.exists(os.path.join(new, "report.json"))
    stale = [n for n in os.listdir(os.path.join(spool, "jobs")) if n.startswith(".42.stale-")]
    assert len(stale) == 1
    assert as_user(b, "ls", os.path.join(spool, "jobs", stale[0])).returncode != 0


def test_unprivileged_and_root_own_runs_are_plain_dirs(tmp_path):
    d = create_run_dir(str(tmp_path / "a" / "b"))
    assert os.path.isdir(d) and acl_users(d) == []
