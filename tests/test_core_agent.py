"""One agent serves several runs; peer credentials decide who may do what."""
import os
import pathlib
import shutil
import tempfile
import pwd
import subprocess
import sys
import time

import pytest

from reveal_plugins.store import store
from reveal_plugins.agent.client import AgentClient, AgentError, ensure_agent
from reveal_plugins.types import RunInfo


@pytest.fixture
def agent():
    # Under /tmp (not pytest's 0700 tmp_path) so that other local users can reach the socket,
    # as they can reach /var/spool/reveal/agent.sock on a node.
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="reveal-agent-test-"))
    os.chmod(tmp, 0o755)
    client = ensure_agent(str(tmp / "spool"), 0.1)
    yield client, tmp
    try:
        client.shutdown()
    except AgentError:
        pass
    client.proc.wait(timeout=20)
    shutil.rmtree(tmp, ignore_errors=True)


def test_two_runs_share_one_agent_and_get_their_own_slices(agent):
    client, tmp = agent
    a = client.register(RunInfo(run_id="a", run_dir=str(tmp / "a"), job_id="1"))
    time.sleep(1.0)
    b = client.register(RunInfo(run_id="b", run_dir=str(tmp / "b"), job_id="2"))
    client.event("b", "step_start", step_id="0")
    time.sleep(1.0)
    client.event("b", "step_end", step_id="0", exit_code=0)
    assert {r["run_id"] for r in client.status()["runs"]} == {"a", "b"}
    client.unregister("b", 0)
    time.sleep(0.5)
    client.unregister("a", 1)
    ra, rb = store.load_run(a), store.load_run(b)
    assert rb.frame.t[0] > ra.frame.t[0] + 0.8 and ra.frame.t[-1] > rb.frame.t[-1]
    assert len(ra.frame.t) > len(rb.frame.t) >= 8
    common = set(ra.frame.t) & set(rb.frame.t)
    assert len(common) >= 8, "both runs receive the same host samples (sampled once)"
    assert rb.meta["steps"][0]["step_id"] == "0" and rb.meta["steps"][0]["exit_code"] == 0
    assert ra.meta["exit_code"] == 1


def test_errors_name_the_problem(agent):
    client, tmp = agent
    with pytest.raises(AgentError, match="run_id 'nope' is not registered"):
        client.event("nope", "step_start", step_id="1")
    with pytest.raises(AgentError, match="unknown op 'bogus'"):
        client.request({"op": "bogus"})
    with pytest.raises(AgentError, match=r"unknown run field\(s\): \['colour'\]"):
        client.request({"op": "register", "run": {"run_id": "x", "run_dir": "/tmp/x",
                                                  "colour": 1}})
    with pytest.raises(AgentError, match="must be a non-empty name without '/'"):
        client.register(RunInfo(run_id="../x", run_dir=str(tmp / "x")))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_other_users_cannot_register_or_touch_foreign_runs(agent):
    client, tmp = agent
    nobody = pwd.getpwnam("nobody")
    client.register(RunInfo(run_id="rootrun", run_dir=str(tmp / "r"), uid=0))
    # Plain sockets, so that any python the other user may execute will do.
    script = (
        "import json, socket\n"
        f"path = {client.socket_path!r}\n"
        "def req(r):\n"
        "    s = socket.socket(socket.AF_UNIX); s.connect(path)\n"
        "    s.sendall((json.dumps(r) + '\\n').encode()); rep = json.loads(s.makefile().readline())\n"
        "    return 'allowed' if rep['ok'] else rep['error']\n"
        "print(req({'op': 'register', 'run': {'run_id': 'evil', 'run_dir': '/tmp/evil'}}))\n"
        "print(req({'op': 'event', 'run_id': 'rootrun', 'event': 'step_start', 'step_id': '9'}))\n"
        "print(req({'op': 'shutdown'}))\n")
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    p = subprocess.run([py, "-c", script], user=nobody.pw_uid, group=nobody.pw_gid,
                       capture_output=True, text=True, timeout=30, cwd="/")
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 3, p.stderr
    assert "may not register runs" in lines[0]
    assert "may not act on run 'rootrun'" in lines[1]
    assert "only root or the agent's user may shut it down" in lines[2]
    assert client.alive()
    assert not os.path.exists("/tmp/evil")


def test_a_second_agent_on_the_same_spool_refuses_to_start(agent):
    client, tmp = agent
    p = subprocess.run([sys.executable, "-m", "reveal_plugins.agent.daemon", "--spool",
                        str(tmp / "spool")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1     # EXIT_PROBLEM (docs/cli.md): not a usage error
    assert "already serves" in p.stderr and "not starting a second one" in p.stderr
    assert client.alive()


def test_agent_threads_carry_their_names_in_the_kernel(agent):
    """`top -H` / `ps -L` show which of the agent's threads spends its CPU."""
    client, tmp = agent
    client.register(RunInfo(run_id="n", run_dir=str(tmp / "n"), job_id="3"))
    want = {"reveal-sampler", "reveal-socket", "reveal-pending", "reveal-features"}
    names: set[str] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not want <= names:
        time.sleep(0.5)
        names = set()
        for t in pathlib.Path(f"/proc/{client.proc.pid}/task").iterdir():
            try:
                names.add((t / "comm").read_text().strip())
            except OSError:
                pass
    client.unregister("n", 0)
    assert want <= names, names


def test_the_agent_does_not_load_pandas_for_pyarrow(agent):
    """pyarrow pulls in pandas (55 MB of RSS) on its first array unless told it is absent;
    the agent writes segments and features without it, and the run's data is whole."""
    pytest.importorskip("pandas", reason="pandas is what would be loaded: the fleet extra")
    client, tmp = agent
    run_dir = client.register(RunInfo(run_id="p", run_dir=str(tmp / "p"), job_id="4"))
    time.sleep(1.5)
    client.unregister("p", 0)
    maps = pathlib.Path(f"/proc/{client.proc.pid}/maps").read_text()
    assert "/pandas/" not in maps
    run = store.load_run(run_dir)
    assert len(run.frame.t) >= 10 and run.frame.values.shape[1] > 100


@pytest.mark.parametrize("allow", ["0", "1"])
def test_pandas_is_withheld_from_the_agent_unless_allowed(allow):
    """What an agent-side plugin that imports pandas meets: an error that says why and how to
    allow it, or pandas with REVEAL_AGENT_PANDAS=1."""
    pytest.importorskip("pandas", reason="pandas is what would be withheld: the fleet extra")
    code = ("from reveal_plugins.agent.daemon import withhold_pandas\n"
            "withhold_pandas()\n"
            "import pandas\n"
            "print('loaded', pandas.__name__)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, REVEAL_AGENT_PANDAS=allow), timeout=60)
    if allow == "1":
        assert p.returncode == 0 and "loaded pandas" in p.stdout, p.stderr
    else:
        assert p.returncode == 1
        assert "ModuleNotFoundError" in p.stderr and "REVEAL_AGENT_PANDAS=1" in p.stderr
