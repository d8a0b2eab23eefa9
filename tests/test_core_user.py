"""``reveal probes`` and ``reveal record`` work as an ordinary user."""
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import pytest

from reveal_plugins.store import store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _as_nobody(args, cwd):
    nobody = pwd.getpwnam("nobody")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT, "HOME": cwd}
    return subprocess.run([sys.executable, "-m", "reveal_plugins.cli", *args], cwd=cwd,
                          user=nobody.pw_uid, group=nobody.pw_gid, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def user_dir():
    if os.geteuid() != 0:
        pytest.skip("needs root to run a command as another user")
    nobody = pwd.getpwnam("nobody")
    probe = subprocess.run([sys.executable, "-c", "import numpy, pyarrow, pluggy"],
                           user=nobody.pw_uid, group=nobody.pw_gid, capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{sys.executable} and its packages are not usable by other users "
                    "(.ci/run makes them so)")
    d = tempfile.mkdtemp(prefix="reveal-user-")
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_probes_and_record_as_ordinary_user(user_dir):
    p = _as_nobody(["probes", "--json"], user_dir)
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)}
    assert rows["procfs.stat"]["available"] and rows["psi.cpu"]["available"]
    for r in rows.values():
        assert r["available"] or r["reason"]
    p = _as_nobody(["record", "--out", "run", "--no-analyze", "--", "sleep", "1.5"], user_dir)
    assert p.returncode == 0, p.stderr
    r = store.load_run(os.path.join(user_dir, "run"))
    assert len(r.frame.t) >= 10
    assert os.stat(os.path.join(user_dir, "run", "meta.json")).st_uid == \
        pwd.getpwnam("nobody").pw_uid
