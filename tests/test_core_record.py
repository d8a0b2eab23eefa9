"""``reveal record`` end to end: real agent process, real command, real faults."""
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from reveal_plugins.store import store

REVEAL = [sys.executable, "-m", "reveal_plugins.cli"]
BUSY = "import time\nt=time.time()\nwhile time.time()-t<{s}: pass\n"


def record(args, timeout=120, env=None, **kw):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(REVEAL + ["record", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, **kw)


def test_busy_loop_is_recorded(tmp_path):
    out = tmp_path / "run"
    p = record(["--out", str(out), "--no-analyze", "--", sys.executable, "-c",
                BUSY.format(s=3)])
    assert p.returncode == 0, p.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["schema"] == "reveal.run/1" and meta["exit_code"] == 0
    assert meta["run"]["source"] == "local" and meta["run"]["command"][0] == sys.executable
    assert len(meta["channels"]) >= 200
    assert all({"name", "unit", "kind", "subsystem", "probe"} <= set(c) for c in meta["channels"])
    r = store.load_run(str(out))
    assert len(r.frame.t) >= 25  # 3 s at 10 Hz, minus start-up slack
    gaps = r.frame.t[1:] - r.frame.t[:-1]
    assert abs(float(gaps.mean()) - 0.1) < 0.02, "schedule drifted"
    for seg in store.segment_paths(str(out)):
        pq.read_table(seg)  # plain pyarrow reads every segment
    events = [e["event"] for e in r.events]
    assert events[0] == "run_start" and events[-1] == "run_end"
    # slow-moving sources are read once a second and interpolated back to every sample
    slow = {c["name"]: c for c in meta["channels"]}["network.tcp.InSegs"]
    assert slow["sample_every_s"] == pytest.approx(1.0)
    col = r.frame.column("network.tcp.InSegs")
    assert not (col != col).any() and (col[1:] >= col[:-1]).all()
    raw = store.read_segment(store.segment_paths(str(out))[0], ["network.tcp.InSegs"])[1][:, 0]
    assert 0.05 < (raw == raw).mean() < 0.3  # stored: one read in ten ticks


def test_exit_code_and_missing_command(tmp_path):
    p = record(["--out", str(tmp_path / "a"), "--no-analyze", "--", sys.executable, "-c",
                "import sys; sys.exit(7)"])
    assert p.returncode == 7
    assert json.loads((tmp_path / "a" / "meta.json").read_text())["exit_code"] == 7
    p = record(["--out", str(tmp_path / "b"), "--no-analyze", "--", "/nonexistent/cmd"])
    assert p.returncode == 127 and "cannot run '/nonexistent/cmd'" in p.stderr


@pytest.mark.parametrize("args,msg", [
    (["--interval", "0", "--", "true"], "--interval: interval '0': must be between"),
    (["--interval", "abc", "--", "true"], "not a number of seconds"),
    (["--bogus", "--", "true"], "unrecognized arguments: --bogus"),
    ([], "no command given"),
])
def test_bad_options_are_named(args, msg):
    p = record(args)
    assert p.returncode == 2 and msg in p.stderr, p.stderr


def test_signals_are_forwarded_and_run_finalized(tmp_path):
    out = tmp_path / "sig"
    child = ("import signal,sys,time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
             "time.sleep(60)\n")
    p = subprocess.Popen(REVEAL + ["record", "--out", str(out), "--no-analyze", "--",
                                   sys.executable, "-c", child],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while not (out / "meta.json").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 42
    meta = json.loads((out / "meta.json").read_text())
    assert meta["exit_code"] == 42 and meta["end"] is not None


def test_unwritable_out_still_runs_the_command(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "file").write_text("x")
    # a regular file where the run directory should go: unwritable even for root
    p = record(["--out", str(ro / "file" / "run"), "--", sys.executable, "-c",
                "print('user command ran'); import sys; sys.exit(3)"])
    assert p.returncode == 3
    assert "user command ran" in p.stdout
    assert "cannot write run directory" in p.stderr and str(ro / "file" / "run") in p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_disk_full_keeps_the_command_and_says_what_failed(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mnt)], check=True)
    try:
        p = record(["--out", str(mnt / "run"), "--no-analyze", "--", sys.executable, "-c",
                    BUSY.format(s=4) + "print('done')"], env={"REVEAL_SEGMENT_S": "1"})
        assert p.returncode == 0
        assert "done" in p.stdout
        assert "No space left on device" in p.stderr, p.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_agent_sigkill_loses_at_most_the_open_segment(tmp_path):
    out = tmp_path / "killed"
    p = subprocess.Popen(REVEAL + ["record", "--out", str(out), "--no-analyze", "--",
                                   sys.executable, "-c", BUSY.format(s=6)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, REVEAL_SEGMENT_S="1"))
    deadline = time.time() + 20
    while len(store.segment_paths(str(out))) < 3 and time.time() < deadline:
        time.sleep(0.1)
    agent_pid = json.loads((out / "meta.json").read_text())["agent"]["pid"]
    time.sleep(0.5)
    os.kill(agent_pid, signal.SIGKILL)
    killed_at = time.time()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0
    assert "agent lost" in err
    r = store.load_run(str(out))
    assert r.segments >= 3
    assert r.frame.t[-1] > killed_at - 2.5  # at most the open (1 s) segment is lost
    meta = json.loads((out / "meta.json").read_text())
    assert meta["end"] is not None and meta["exit_code"] == 0
