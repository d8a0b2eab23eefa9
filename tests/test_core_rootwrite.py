"""Root never writes through a symlink another user planted (issue 13).

A root ``reveal analyze`` / ``reveal report`` on a run directory owned by an ordinary user who
planted symlinks at every name reveal writes there (report.json, otel.json, their temporary
names, summary.txt, report.html) must leave the symlinks' target -- a root file in /etc --
unchanged: content, mode and owner.
"""
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from fixtures_report import make_run
from reveal_plugins.store import rundir, store

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root-only behaviour")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANTED = ("report.json", ".report.json.tmp", "otel.json", ".otel.json.tmp", "summary.txt",
           ".summary.txt.tmp", "report.html", ".report.html.tmp", "meta.json.tmp")


@pytest.fixture
def victim():
    path = f"/etc/reveal-victim-{secrets.token_hex(4)}"
    with open(path, "wb") as f:
        f.write(b"precious root data\n")
    os.chmod(path, 0o600)
    yield path
    os.unlink(path)


def _state(path):
    st = os.stat(path)
    return open(path, "rb").read(), st.st_mode, st.st_uid, st.st_gid


@pytest.fixture
def user_run(victim):
    """A finished run directory owned by ``nobody``, with symlinks to the victim planted."""
    base = tempfile.mkdtemp(prefix="reveal-rootwrite-")
    run = os.path.join(base, "run")
    os.mkdir(run)
    make_run(run, seconds=20, job_id="77")
    nobody = pwd.getpwnam("nobody")
    for dirpath, dirs, files in os.walk(run):
        for n in dirs + files:
            os.lchown(os.path.join(dirpath, n), nobody.pw_uid, nobody.pw_gid)
    os.chown(run, nobody.pw_uid, nobody.pw_gid)
    os.chmod(run, 0o755)
    for name in PLANTED:
        p = os.path.join(run, name)
        if os.path.lexists(p):
            os.unlink(p)
        os.symlink(victim, p)
        os.lchown(p, nobody.pw_uid, nobody.pw_gid)
    yield run
    shutil.rmtree(base, ignore_errors=True)


def _reveal(*args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
               REVEAL_OTEL_BUDGET_S="0.3", NO_COLOR="1")
    env.pop("REVEAL_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "reveal_plugins.cli", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=180)


def test_root_analyze_refuses_a_users_directory(user_run, victim, tmp_path):
    before = _state(victim)
    r = _reveal("analyze", user_run, cwd=str(tmp_path))
    assert _state(victim) == before
    assert r.returncode == 1, r.stdout + r.stderr
    assert user_run in r.stderr and "nobody" in r.stderr, r.stderr
    for name in PLANTED:   # nothing replaced either: the user's directory is left as it was
        assert os.path.islink(os.path.join(user_run, name))


def test_root_report_analyses_without_writing_there(user_run, victim, tmp_path):
    before = _state(victim)
    r = _reveal("report", user_run, "--format", "html", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert _state(victim) == before
    assert os.path.isfile(tmp_path / "report.html")      # written where root may write
    assert "nobody" in r.stderr, r.stderr                  # and why not into the run directory
    r = _reveal("report", user_run, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert _state(victim) == before
    assert "Reveal" in r.stdout or "anomal" in r.stdout.lower(), r.stdout


def test_root_writers_refuse_foreign_directories(user_run, victim):
    """The store's own writers (what the agent and the analysis use) refuse, as root, a
    directory root does not own, and replace a symlink in one root owns."""
    before = _state(victim)
    for call in (lambda: store.write_meta(user_run, {"channels": []}),
                 lambda: store.append_event(user_run, "x"),
                 lambda: rundir.write_file(user_run, "report.json", b"{}")):
        with pytest.raises(rundir.RunDirError, match="nobody"):
            call()
    w = store.SegmentWriter(user_run, [])
    w.add(0.0, np.zeros(0))
    with pytest.raises(rundir.RunDirError, match="nobody"):
        w.flush()
    assert _state(victim) == before


def test_atomic_file_sets_mode_through_the_descriptor(tmp_path):
    old = os.umask(0o077)
    try:
        rundir.write_file(str(tmp_path), "x.json", b"{}", 0o640)
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "x.json").st_mode & 0o777) == oct(0o640)
    os.symlink("/etc/passwd", tmp_path / "y.json")
    rundir.write_file(str(tmp_path), "y.json", b"{}")
    assert not os.path.islink(tmp_path / "y.json")
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []
