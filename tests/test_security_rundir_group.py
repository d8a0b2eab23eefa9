"""Run directories on a file system without POSIX ACLs (some NFS exports) fall back to
group ownership only for a group proven private; under sssd/LDAP with ``enumerate = false``
``pwd.getpwall()`` lists local accounts only, so a shared primary group ("users") whose
members it does not list must never be taken for a private one (issue 22).

Two real users share a primary group; the LDAP-like view is simulated by a ``getpwall``
that does not list them and an nsswitch.conf that names ``sss``.  ACLs are made unsupported
by an ``setxattr`` that fails with EOPNOTSUPP, as on such an export."""
import errno
import os
import pwd
import shutil
import stat
import subprocess
import tempfile

import pytest

from reveal_plugins.store import rundir
from reveal_plugins.store.rundir import create_run_dir, write_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the permission model needs root")


def as_user(user, *argv):
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True,
                          timeout=30)


@pytest.fixture
def spool():
    base = tempfile.mkdtemp(prefix="reveal-ldap-")
    os.chmod(base, 0o755)
    yield os.path.join(base, "spool")
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def no_acls(monkeypatch):
    def setxattr(*a, **k):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")
    monkeypatch.setattr(rundir.os, "setxattr", setxattr)


@pytest.fixture
def ldap_view(monkeypatch, tmp_path, slurm_users):
    """What an sssd client with enumerate=false sees: getpwall() = the local system accounts,
    none of the (directory-served) job users; nsswitch.conf names sss."""
    hidden = {pwd.getpwnam(u).pw_uid for u in slurm_users}
    local = [p for p in pwd.getpwall() if p.pw_uid not in hidden]
    monkeypatch.setattr(rundir.pwd, "getpwall", lambda: list(local))
    ns = tmp_path / "nsswitch.conf"
    ns.write_text("passwd: files sss\ngroup: files sss\n")
    monkeypatch.setattr(rundir, "NSSWITCH_CONF", str(ns), raising=False)


def test_shared_group_unlisted_by_getpwall_is_not_used_without_acls(spool, no_acls,
                                                                      ldap_view, slurm_users):
    a, b = slurm_users
    ua, ub = pwd.getpwnam(a), pwd.getpwnam(b)
    assert ua.pw_gid == ub.pw_gid
    run_dir = create_run_dir(os.path.join(spool, "jobs", "42", "node1"), uid=ua.pw_uid)
    write_file(run_dir, "report.json", b'{"summary": "report of A"}')
    for d in (run_dir, os.path.dirname(run_dir)):
        st = os.stat(d)
        assert (st.st_uid, st.st_gid) == (0, 0), d
        assert stat.S_IMODE(st.st_mode) == 0o700, (d, oct(st.st_mode))
    r = as_user(b, "cat", os.path.join(run_dir, "report.json"))
    assert r.returncode != 0 and "Permission denied" in r.stderr


def test_getpwall_listing_nobody_else_is_no_proof_under_ldap(spool, no_acls, monkeypatch,
                                                             tmp_path, slurm_users):
    """Even when getpwall lists the job user (a local account) but not the other member of
    the group, an nsswitch that also asks a directory service proves nothing."""
    a, b = slurm_users
    ua = pwd.getpwnam(a)
    others = pwd.getpwnam(b).pw_uid
    local = [p for p in pwd.getpwall() if p.pw_uid != others]
    monkeypatch.setattr(rundir.pwd, "getpwall", lambda: list(local))
    ns = tmp_path / "nsswitch.conf"
    ns.write_text("passwd:  files [SUCCESS=return] ldap\ngroup: files ldap\n")
    monkeypatch.setattr(rundir, "NSSWITCH_CONF", str(ns), raising=False)
    run_dir = create_run_dir(os.path.join(spool, "jobs", "43", "node1"), uid=ua.pw_uid)
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    assert os.stat(run_dir).st_gid == 0


def test_shared_group_is_not_private_even_with_local_accounts(spool, no_acls, slurm_users):
    """Local files only (getpwall complete): the shared group has another account -> root-only."""
    a, _ = slurm_users
    run_dir = create_run_dir(os.path.join(spool, "jobs", "44", "node1"),
                             uid=pwd.getpwnam(a).pw_uid)
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700 and os.stat(run_dir).st_gid == 0


@pytest.fixture
def upg_user():
    """A local account with its own user-private group (useradd -U)."""
    name = "reveal-tp"
    try:
        pwd.getpwnam(name)
        made = False
    except KeyError:
        subprocess.run(["useradd", "-M", "-U", "-d", "/nonexistent", "-s", "/bin/sh", name],
                       check=True, capture_output=True)
        made = True
    yield name
    if made:
        subprocess.run(["userdel", name], capture_output=True)


def test_proven_private_group_still_lets_its_user_read(spool, no_acls, upg_user, monkeypatch,
                                                      tmp_path):
    ns = tmp_path / "nsswitch.conf"
    ns.write_text("passwd: files systemd\ngroup: files systemd\n")
    monkeypatch.setattr(rundir, "NSSWITCH_CONF", str(ns), raising=False)
    pw = pwd.getpwnam(upg_user)
    run_dir = create_run_dir(os.path.join(spool, "jobs", "45", "node1"), uid=pw.pw_uid)
    write_file(run_dir, "report.json", b'{"summary": "mine"}')
    st = os.stat(run_dir)
    assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (pw.pw_gid, 0o2750)
    r = as_user(upg_user, "cat", os.path.join(run_dir, "report.json"))
    assert r.returncode == 0 and "mine" in r.stdout
