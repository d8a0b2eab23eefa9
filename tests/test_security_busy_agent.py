"""Issue 22 (medium): "busy" is not "delivered".  A connect that finds the agent's backlog full
sends nothing: the Prolog must queue the registration (or the job is never recorded) and the
Epilog the unregister (or nobody ever asks the agent to close the run); a request that was
written whole but got no reply reached the agent and is not queued again.  The hook log says
which."""
import json
import os
import socket
import threading
import time

import pytest

from reveal_plugins.slurm import hooks
from reveal_plugins.slurm.config import SlurmConfig
from reveal_plugins.agent import pending
from reveal_plugins.agent.client import AgentBusy, AgentClient

ENV = {"SLURM_JOB_ID": "5150", "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
       "SLURMD_NODENAME": "n1"}


def _fill_backlog(spool):
    """A listener on ``spool``/agent.sock that never accepts, its backlog filled: (server,
    the connections filling it)."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(spool / "agent.sock"))
    srv.listen(0)
    fillers = []
    for _ in range(64):
        c = socket.socket(socket.AF_UNIX)
        c.setblocking(False)
        try:
            c.connect(str(spool / "agent.sock"))
        except BlockingIOError:
            c.close()
            break
        fillers.append(c)
    else:
        srv.close()
        pytest.skip("the backlog never filled")
    return srv, fillers


@pytest.fixture
def full_backlog(tmp_path):
    """An agent socket whose listener never accepts, its backlog filled: connect() fails
    with EAGAIN."""
    spool = tmp_path / "spool"
    spool.mkdir()
    srv, fillers = _fill_backlog(spool)
    yield str(spool)
    for c in fillers:
        c.close()
    srv.close()


@pytest.fixture
def silent_agent(tmp_path):
    """Accepts and reads, never answers: the request reaches it."""
    spool = tmp_path / "spool-silent"
    spool.mkdir()
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(spool / "agent.sock"))
    srv.listen(16)
    srv.settimeout(0.1)
    got, conns, stop = [], [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                c = srv.accept()[0]
            except OSError:
                continue
            conns.append(c)
            c.settimeout(1)
            try:
                got.append(c.recv(65536))
            except OSError:
                pass
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    yield str(spool), got
    stop.set()
    th.join()
    for c in conns:
        c.close()
    srv.close()


@pytest.fixture
def hook_log(tmp_path, monkeypatch):
    path = tmp_path / "hooks.log"
    monkeypatch.setenv("REVEAL_SLURM_LOG", str(path))
    return path


def _queued(spool):
    return [r for _, r in pending.take(os.path.join(spool, "pending"), (0, os.geteuid()))]


def test_client_tells_busy_at_connect_from_sent_without_reply(full_backlog, silent_agent):
    with pytest.raises(AgentBusy) as e:
        AgentClient(os.path.join(full_backlog, "agent.sock")).request({"op": "ping"}, 0.3)
    assert e.value.sent is False and "nothing was sent" in str(e.value)
    spool, _ = silent_agent
    with pytest.raises(AgentBusy) as e:
        AgentClient(os.path.join(spool, "agent.sock")).request({"op": "ping"}, 0.3)
    assert e.value.sent is True and "the request was sent" in str(e.value)
    # accepted and closed unanswered: not taken
    closer = os.path.join(spool, "..", "closer.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(closer)
    srv.listen(4)
    th = threading.Thread(target=lambda: srv.accept()[0].close(), daemon=True)
    th.start()
    try:
        with pytest.raises(AgentBusy) as e:
            AgentClient(closer).request({"op": "ping"}, 1.0)
        assert e.value.sent is False, e.value
    finally:
        th.join(5)
        srv.close()


def test_prolog_queues_the_registration_when_the_agent_is_busy_at_connect(
        full_backlog, hook_log, monkeypatch):
    monkeypatch.setattr(hooks, "start_agent_detached",
                        lambda *a: pytest.fail("an agent is there: none must be started"))
    t0 = time.monotonic()
    hooks.prolog(SlurmConfig(spool=full_backlog), ENV, time.monotonic() + 0.5)
    assert time.monotonic() - t0 < 0.5
    reqs = _queued(full_backlog)
    assert [(r["op"], r["run"]["run_id"]) for r in reqs] == [("register", "slurm-5150")]
    log = hook_log.read_text()
    assert "nothing was sent" in log and "queued the registration" in log, log


def test_prolog_with_the_spank_plugins_queued_registration_does_not_queue_twice(
        full_backlog, hook_log):
    hooks.prolog(SlurmConfig(spool=full_backlog), {**ENV, "REVEAL_SPANK_QUEUED": "queued"},
                 time.monotonic() + 0.5)
    assert _queued(full_backlog) == []
    assert "queued the registration (by the SPANK plugin)" in hook_log.read_text()


def test_epilog_queues_the_unregister_when_the_agent_is_busy_at_connect(
        full_backlog, hook_log, monkeypatch):
    started = []
    monkeypatch.setattr(hooks.subprocess, "Popen", lambda argv, **kw: started.append(argv))
    t0 = time.monotonic()
    hooks.epilog(SlurmConfig(spool=full_backlog), {**ENV, "SLURM_JOB_EXIT_CODE2": "3:0"},
                 time.monotonic() + 1.0)
    assert time.monotonic() - t0 < 1.0          # the hook itself does not wait on the socket
    reqs = _queued(full_backlog)
    assert [(r["op"], r["run_id"], r["exit_code"]) for r in reqs] == \
        [("unregister", "slurm-5150", 3)]
    log = hook_log.read_text()
    assert "nothing was sent" in log and "queued the unregister" in log, log
    # the close is now requested (queued): the analysis waits for it, never finalizes an
    # orphan the agent still holds
    (argv,) = started
    assert "--wait-closed" in argv and "--finalize" not in argv


def test_delivered_without_reply_is_not_queued_again(silent_agent, hook_log, monkeypatch):
    spool, got = silent_agent
    monkeypatch.setattr(hooks, "start_agent_detached",
                        lambda *a: pytest.fail("an agent is there: none must be started"))
    hooks.prolog(SlurmConfig(spool=spool), ENV, time.monotonic() + 0.4)
    hooks.epilog(SlurmConfig(spool=spool, analysis="off"), ENV, time.monotonic() + 0.4)
    assert _queued(spool) == []
    assert any(b'"register"' in g for g in got) and any(b'"unregister"' in g for g in got)
    log = hook_log.read_text()
    assert "registration reached the agent (delivered" in log, log
    assert "unregister reached the agent (delivered" in log, log


@pytest.mark.parametrize("state,queued", [("busy", True), ("sent", False)])
def test_epilog_after_the_spank_plugins_unregister(tmp_path, hook_log, monkeypatch, state,
                                                  queued):
    """The SPANK plugin says 'sent' (written, no reply: delivered) or 'busy' (backlog full at
    connect: nothing sent); neither is an orphan to finalize."""
    spool = str(tmp_path / "spool")
    os.makedirs(spool)
    started = []
    monkeypatch.setattr(hooks.subprocess, "Popen", lambda argv, **kw: started.append(argv))
    hooks.epilog(SlurmConfig(spool=spool), {**ENV, "REVEAL_SPANK_UNREGISTERED": state},
                 time.monotonic() + 1.0)
    assert bool(_queued(spool)) is queued
    (argv,) = started
    assert "--wait-closed" in argv and "--finalize" not in argv


# -- the SPANK plugin's client: written is delivered ----------------------------------------

HARNESS = r"""
#include SOURCE
int main(int argc, char **argv)
{
	char reply[1024] = "";
	snprintf(spool, sizeof(spool), "%s", argv[1]);
	printf("%d\n", agent_send_t("{\"op\": \"ping\"}\n", reply, sizeof(reply),
				    argc > 2 ? atoi(argv[2]) : 300));
	return 0;
}
"""


@pytest.fixture(scope="module")
def c_send(tmp_path_factory):
    """The plugin's own ``agent_send_t`` against a spool: its return code."""
    import json
    import shutil
    import subprocess

    from reveal_plugins.slurm.spank_build import find_include, source_path
    try:
        inc = find_include()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    d = tmp_path_factory.mktemp("spank-send")
    (d / "h.c").write_text(HARNESS.replace("SOURCE", json.dumps(source_path())))
    subprocess.run(["gcc", "-Wall", "-Werror", "-O2", "-no-pie", f"-I{inc}", "-o",
                    str(d / "h"), str(d / "h.c"), "-lslurm",
                    "-Wl,--unresolved-symbols=ignore-in-object-files"],
                   check=True, capture_output=True, text=True)

    def call(spool, tmo_ms=300):
        return int(subprocess.run([str(d / "h"), spool, str(tmo_ms)], capture_output=True,
                                  text=True, check=True, timeout=10).stdout)
    return call


def test_spank_client_tells_written_from_busy_and_unreachable(c_send, full_backlog,
                                                              silent_agent, tmp_path):
    assert c_send(silent_agent[0]) == -2          # written, no reply: delivered ("sent")
    assert any(b'"ping"' in g for g in silent_agent[1])
    assert c_send(full_backlog) == -3             # backlog full at connect: nothing sent
    os.makedirs(tmp_path / "none")
    assert c_send(str(tmp_path / "none")) == -1   # no socket: unreachable
    # accepted and closed unanswered: not taken, queue it (busy)
    closer = tmp_path / "closer"
    closer.mkdir()
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(closer / "agent.sock"))
    srv.listen(4)
    th = threading.Thread(target=lambda: srv.accept()[0].close(), daemon=True)
    th.start()
    try:
        assert c_send(str(closer)) == -3
    finally:
        th.join(5)
        srv.close()


def test_spank_client_has_one_budget_not_one_per_phase(c_send, tmp_path):
    """Issue 22 (low): connect, send and read share the plugin's timeout.  The backlog is full
    and frees a slot after 0.7 s of a 1 s budget; the agent then never answers.  The hook
    gives up at 1 s in all (it used to wait 1 s more for the reply: 1.7 s, past the
    Epilog's budget)."""
    spool = tmp_path / "slow"
    spool.mkdir()
    srv, fillers = _fill_backlog(spool)
    held = []

    def free_a_slot_later():
        time.sleep(0.7)
        held.append(srv.accept()[0])        # one filler leaves the backlog: ours gets in
    th = threading.Thread(target=free_a_slot_later, daemon=True)
    th.start()
    try:
        t0 = time.monotonic()
        rc = c_send(str(spool), 1000)
        took = time.monotonic() - t0
    finally:
        th.join(5)
        for c in fillers + held:
            c.close()
        srv.close()
    assert rc == -2, rc                   # written, unanswered: delivered
    assert took < 1.4, took


def test_task_hook_retries_busy_within_its_budget_and_says_when_the_marker_is_lost(
        tmp_path, hook_log):
    """Issue 22 (medium): the TaskProlog runs as the job's user and cannot queue into root's
    pending/; a full backlog is tried again while its budget lasts, and the log says whether
    the step marker reached the agent."""
    spool = tmp_path / "spool"
    spool.mkdir()
    srv, fillers = _fill_backlog(spool)
    env = {**ENV, "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0"}
    got = []

    def agent_frees_up():
        time.sleep(0.15)
        srv.settimeout(2)
        while True:       # accept the fillers (silent) until ours arrives, and answer it
            try:
                c = srv.accept()[0]
            except OSError:
                return
            c.settimeout(0.05)
            try:
                line = c.recv(65536)
            except OSError:
                line = b""
            if line:
                got.append(json.loads(line))
                c.sendall(b'{"ok": true}\n')
                c.close()
                return
            c.close()
    th = threading.Thread(target=agent_frees_up, daemon=True)
    th.start()
    try:
        t0 = time.monotonic()
        hooks.task_hook("step_start", SlurmConfig(spool=str(spool)), env, t0 + 0.5)
        assert time.monotonic() - t0 < 0.6
    finally:
        th.join(5)
        for c in fillers:
            c.close()
        srv.close()
    assert [(r["event"], r["step_id"]) for r in got] == [("step_start", "0")], hook_log
    # the backlog never frees: the hook gives up within its budget and says so
    spool2 = tmp_path / "spool2"
    spool2.mkdir()
    srv, fillers = _fill_backlog(spool2)
    try:
        t0 = time.monotonic()
        hooks.task_hook("step_end", SlurmConfig(spool=str(spool2)), env, t0 + 0.4)
        assert time.monotonic() - t0 < 0.5
    finally:
        for c in fillers:
            c.close()
        srv.close()
    log = hook_log.read_text()
    assert "step_end of step 0 not recorded" in log and "nothing was sent" in log, log
