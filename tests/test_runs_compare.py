"""``reveal runs`` and ``reveal compare`` on real recordings: the same command run twice, once
with its work and once idle, must show the job's own CPU among what moved; another user must
not see root's runs."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

CLI = [sys.executable, "-m", "reveal_plugins.cli"]
# One command, two behaviours (a flag file decides), so the runs are "the same workload".
WORK = ("import os, time\nt = time.time()\nbusy = os.path.exists(os.environ['FLAG'])\n"
        "while time.time() - t < 6:\n    busy or time.sleep(0.05)\n")


def reveal(*args, **kw):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, **kw)


@pytest.fixture(scope="module")
def two_runs():
    # world-traversable, so another user reaches the run directories and only their own
    # permissions decide (pytest's tmp_path is 0700)
    from pathlib import Path
    base = Path(tempfile.mkdtemp(prefix="reveal-runs-test-", dir="/tmp"))
    base.chmod(0o755)
    flag = base / "flag"
    env = dict(os.environ, FLAG=str(flag))
    out = {}
    for name, busy in (("idle", False), ("busy", True)):
        if busy:
            flag.write_text("1")
        d = base / "reveal-runs" / name
        r = reveal("record", "-o", str(d), "--", sys.executable, "-c", WORK, env=env)
        assert r.returncode == 0, r.stderr
        out[name] = str(d)
        time.sleep(1.1)       # distinct start times, newest first below
    out["base"] = str(base)
    yield out
    shutil.rmtree(base, ignore_errors=True)


def test_runs_lists_what_the_caller_may_read_newest_first(two_runs):
    r = reveal("runs", "--dir", os.path.join(two_runs["base"], "reveal-runs"), "-f", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["run_dir"] for x in rows] == [two_runs["busy"], two_runs["idle"]]
    for x in rows:    # the verdict shown is the run's own (6 s runs are too short to judge)
        with open(os.path.join(x["run_dir"], "report.json")) as f:
            assert x["status"] == json.load(f)["status"] == "not_analysed"
        assert x["user"] == "root" and x["duration_s"] > 5, x
    text = reveal("runs", "--dir", os.path.join(two_runs["base"], "reveal-runs")).stdout
    assert two_runs["busy"] in text and "STARTED" in text
    # the default place is ./reveal-runs, where `reveal record` puts runs
    r = reveal("runs", "-f", "json", "--since", "1h", cwd=two_runs["base"])
    assert len(json.loads(r.stdout)) == 2
    r = reveal("runs", "-f", "json", "--since", str(time.time() + 60), cwd=two_runs["base"])
    assert json.loads(r.stdout) == []
    r = reveal("runs", "-f", "json", "--user", "nobody", cwd=two_runs["base"])
    assert json.loads(r.stdout) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
def test_another_user_does_not_see_roots_runs(two_runs):
    r = subprocess.run(["runuser", "-u", "nobody", "--", *CLI, "runs", "-f", "json", "--dir",
                        os.path.join(two_runs["base"], "reveal-runs")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


def test_compare_shows_the_jobs_own_cpu_moved(two_runs):
    r = reveal("compare", two_runs["idle"], two_runs["busy"], "-f", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["notes"] == []             # same command: no "different workload" warning
    assert doc["channels_compared"] > 50
    moved = {c["channel"]: c for c in doc["changed"]}
    run_cpu = [c for n, c in moved.items() if n.startswith("cpu.run.") and "user" in n]
    assert run_cpu and all(c["b"] > c["a"] for c in run_cpu), sorted(moved)
    text = reveal("compare", two_runs["idle"], two_runs["busy"]).stdout
    assert "channels that moved" in text and run_cpu[0]["channel"] in text
    same = json.loads(reveal("compare", two_runs["busy"], two_runs["busy"], "-f",
                             "json").stdout)
    assert same["changed"] == []
