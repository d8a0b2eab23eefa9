"""A root agent under attack by an ordinary local user (docs/protocol.md, limits).

The attacker (tests/hostile_client.py, run as ``nobody``) sends an oversized line, holds 2,000
idle connections and 50 slow-drip ones, and floods events on its own run, while a FIFO and junk
wait in the queue directory.  Meanwhile root's ping and a new job's registration must answer
within 1 s, the agent's memory stays bounded, and nothing past the per-run limits is written.
"""
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from reveal_plugins.agent import protocol
from reveal_plugins.agent.daemon import RunLimits
from reveal_plugins.agent.client import AgentClient, AgentError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _rss_hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture
def root_agent():
    if os.geteuid() != 0:
        pytest.skip("needs root: a root agent attacked by another user")
    d = tempfile.mkdtemp(prefix="reveal-hostile-")
    os.chmod(d, 0o755)
    spool = os.path.join(d, "spool")
    os.makedirs(os.path.join(spool, "pending"), mode=0o700)
    # Left over in the queue: a FIFO named like a request (would block a plain open) and junk.
    os.mkfifo(os.path.join(spool, "pending", "x.json"))
    for i in range(200):
        with open(os.path.join(spool, "pending", f"junk{i}.json"), "w") as f:
            f.write("not json" * 10)
    log = os.path.join(spool, "agent.log")
    p = subprocess.Popen([sys.executable, "-m", "reveal_plugins.agent.daemon", "--spool",
                          spool, "--log-file", log], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT))
    client = AgentClient(os.path.join(spool, "agent.sock"), timeout=2.0)
    for _ in range(200):
        if client.alive(0.2):
            break
        time.sleep(0.05)
    else:
        p.kill()
        pytest.fail(f"agent did not start: {p.stderr.read().decode()[-2000:]}")
    yield p, client, spool
    p.terminate()
    p.wait(10)
    shutil.rmtree(d, ignore_errors=True)


def test_root_agent_survives_a_hostile_user(root_agent):
    proc, client, spool = root_agent
    nobody = pwd.getpwnam("nobody")
    jobs = os.path.join(spool, "jobs")
    run = {"run_id": "victim", "source": "test", "run_dir": os.path.join(jobs, "1", "n"),
           "uid": nobody.pw_uid, "gid": nobody.pw_gid}
    run_dir = client.register(run)
    fifo = os.path.join(spool, "pending", "x.json")
    for _ in range(50):   # the agent's first queue scan runs beside its first requests
        if not os.path.exists(fifo):
            break
        time.sleep(0.1)
    assert not os.path.exists(fifo), \
        "the FIFO in pending/ was not removed (the queue scan would block on it)"
    attacker = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "hostile_client.py"), client.socket_path,
         "--seconds", "8", "--run-id", "victim"],
        user=nobody.pw_uid, group=nobody.pw_gid, stdout=subprocess.PIPE, text=True,
        env={"PATH": "/usr/bin:/bin"})
    time.sleep(1.5)  # let the attack build up
    worst, worst_reg, k, conns = 0.0, 0.0, 0, 0
    t_end = time.monotonic() + 5.0
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        client.ping(timeout=2.0)
        worst = max(worst, time.monotonic() - t0)
        if k % 10 == 0:
            conns = max(conns, client.status()["server"]["connections"])
            t0 = time.monotonic()
            client.register({"run_id": f"job{k}", "source": "test",
                             "run_dir": os.path.join(jobs, f"job{k}", "n")})
            worst_reg = max(worst_reg, time.monotonic() - t0)
            client.unregister(f"job{k}", 0)
        k += 1
        time.sleep(0.05)
    out, _ = attacker.communicate(timeout=30)
    got = json.loads(out.strip().splitlines()[-1])
    assert worst < 1.0, f"root ping took {worst:.2f} s under attack ({got})"
    assert worst_reg < 1.0, f"a registration took {worst_reg:.2f} s under attack ({got})"
    # bounded: the oversized line was cut near the request limit, connections capped per uid,
    # slow drips closed at the request deadline
    assert got.get("oversized_bytes_accepted", 0) < 64 * protocol.MAX_REQUEST, got
    assert conns <= 64 + 2, f"the agent held {conns} connections (per-uid cap 64)"
    assert got.get("drip_held_s_max", 0) < protocol.REQUEST_DEADLINE_S + 3, got
    assert got.get("events_sent", 0) > 1000, f"the flood did not run: {got}"
    assert _rss_hwm_mb(proc.pid) < 300, f"agent peak RSS {_rss_hwm_mb(proc.pid):.0f} MB"
    # The flood's oversized events may be cut at the transport (the request limits) rather
    # than reach the per-run limit, depending on timing: one more, sent now, must be counted.
    try:
        client.event("victim", "note", pad="z" * (RunLimits().event_bytes + 1))
    except AgentError:
        pass
    client.unregister("victim", 0)
    limits = RunLimits()
    with open(os.path.join(run_dir, "events.jsonl"), "rb") as f:
        lines = f.read().splitlines()
    assert max(len(x) for x in lines) <= limits.event_bytes
    steps = {json.loads(x).get("step_id") for x in lines} - {None}
    assert len(steps) <= limits.steps
    with open(os.path.join(run_dir, "meta.json")) as f:
        meta = json.load(f)
    assert meta["events_dropped"] > 0 and len(meta["steps"]) <= limits.steps, (got, {k: meta[k] for k in meta if k.startswith("events")}, len(lines))
    log_size = os.path.getsize(os.path.join(spool, "agent.log"))
    assert log_size < 64 * 1024, f"agent.log grew to {log_size} bytes during the attack"
    assert proc.poll() is None


def test_event_limits_are_per_run_and_counted(tmp_path):
    from reveal_plugins.agent.daemon import Agent
    from reveal_plugins.types import RunInfo
    a = Agent(str(tmp_path / "spool"), interval_s=0.5)
    a.limits = RunLimits(event_bytes=1024, events=20, events_total_bytes=1 << 20, steps=3)
    d = a.register(RunInfo(run_id="r", source="test", run_dir=str(tmp_path / "r")))
    a.register(RunInfo(run_id="other", source="test", run_dir=str(tmp_path / "o")))
    ok = [a.event("r", "step_start", step_id=f"s{i}") for i in range(5)]
    assert ok == [True, True, True, False, False]  # a 4th step id is over the limit
    assert not a.event("r", "note", pad="z" * 2000)  # one event over 1 KiB
    assert sum(a.event("r", "note", i=i) for i in range(30)) == 20 - 3
    assert a.event("other", "note")  # the limits are the run's, not the agent's
    a.unregister("r", 0)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    assert meta["events_dropped"] == 2 + 1 + 13 and len(meta["steps"]) == 3
    a.stop()


def test_pending_queue_skips_fifos_links_and_oversized_files(tmp_path):
    from reveal_plugins.agent import pending
    d = tmp_path / "pending"
    pending.prepare_dir(str(d), os.geteuid())
    os.mkfifo(d / "a.json")
    os.symlink("/etc/passwd", d / "b.json")
    (d / "c.json").write_bytes(b"{" + b" " * (protocol.MAX_REQUEST + 10) + b"}")
    (d / "d.json").write_bytes(protocol.encode({"op": "unregister", "run_id": "x"}))
    t0 = time.monotonic()
    got = pending.take(str(d), (os.geteuid(),))
    assert time.monotonic() - t0 < 1.0
    assert [r for _, r in got] == [{"op": "unregister", "run_id": "x"}]
    assert os.listdir(d) == []
    os.chmod(d, 0o1733)  # an old world-writable queue is tightened
    pending.prepare_dir(str(d), os.geteuid())
    assert os.stat(d).st_mode & 0o7777 == 0o700


def test_client_reports_a_full_backlog_as_busy_not_absent(tmp_path):
    """EAGAIN on connect is an agent that cannot take us now: hooks must not start another."""
    import socket
    path = str(tmp_path / "s.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(0)
    held = []
    try:
        while True:  # fill the backlog (nobody accepts) until connect says EAGAIN
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(path)
            except BlockingIOError:
                s.close()
                break
            held.append(s)
            assert len(held) < 10000
        with pytest.raises(AgentError) as e:
            AgentClient(path, timeout=0.5).ping()
        assert type(e.value).__name__ == "AgentBusy", e.value
    finally:
        for s in held:
            s.close()
        srv.close()


def test_killed_record_leaves_no_agent_sampling(tmp_path):
    """``reveal record`` killed with SIGKILL: its private agent closes the run and exits."""
    import signal
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "reveal_plugins.cli", "record", "--out", str(out),
                          "--no-analyze", "--", "sleep", "60"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    meta_path = out / "meta.json"
    deadline = time.monotonic() + 30
    while not meta_path.exists():
        assert time.monotonic() < deadline and p.poll() is None, "record never started"
        time.sleep(0.1)
    agent_pid = json.loads(meta_path.read_text())["agent"]["pid"]
    time.sleep(1.0)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    try:
        deadline = time.monotonic() + 20
        while True:
            meta = json.loads(meta_path.read_text())
            gone = not os.path.exists(f"/proc/{agent_pid}") or \
                open(f"/proc/{agent_pid}/stat").read().split()[2] == "Z"
            if meta["end"] is not None and gone:
                break
            assert time.monotonic() < deadline, \
                f"after SIGKILL of record: end={meta['end']}, agent alive={not gone}"
            time.sleep(0.2)
        with open(out / "events.jsonl") as f:
            assert any(json.loads(x)["event"] == "owner_gone" for x in f)
    finally:
        os.killpg(p.pid, signal.SIGKILL)


def test_concurrent_registrations_of_one_run_make_one_run(tmp_path):
    """The socket registration racing the SPANK plugin's queued copy: one RunState, one dir."""
    import threading
    from reveal_plugins.agent.daemon import Agent
    from reveal_plugins.types import RunInfo
    a = Agent(str(tmp_path / "spool"), interval_s=0.5)
    dirs = []
    ths = [threading.Thread(target=lambda: dirs.append(a.register(RunInfo(
        run_id="slurm-1", source="slurm", run_dir=str(tmp_path / "run"))))) for _ in range(8)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert len(set(dirs)) == 1 and len(a._runs) == 1
    with open(tmp_path / "run" / "events.jsonl") as f:
        assert sum(json.loads(x)["event"] == "run_start" for x in f) == 1
    a.stop()


def test_shutdown_request_finishes_the_runs_before_exit(tmp_path):
    from reveal_plugins.agent.client import ensure_agent
    spool = str(tmp_path / "spool")
    client = ensure_agent(spool, 0.1)
    run_dir = client.register({"run_id": "r", "source": "test", "run_dir": str(tmp_path / "r")})
    time.sleep(1.5)
    client.shutdown()
    assert client.proc.wait(15) == 0
    with open(os.path.join(run_dir, "meta.json")) as f:
        meta = json.load(f)
    assert meta["end"] is not None and meta["samples"] > 5
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        assert json.loads(f.read().splitlines()[-1])["event"] == "run_end"
