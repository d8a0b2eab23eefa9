"""The Slurm hooks without a Slurm: configuration errors, the never-drain budget, the SPANK
build, metadata parsing.  Hooks run as real subprocesses (``python -m reveal_plugins.cli``),
exactly as the Prolog/Epilog wrapper runs them."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from reveal_plugins.slurm import jobinfo
from reveal_plugins.slurm.config import ConfigError, load_config, parse_mode
from reveal_plugins.slurm.spank_build import plugstack_line


@pytest.fixture(autouse=True)
def _no_leftover_agents(tmp_path):
    """A hook that started an agent for a test spool: stop it (by its PID) after the test."""
    yield
    for starter in tmp_path.glob("**/.agent-starter"):
        try:
            pid = int(starter.read_text())
            if b"reveal_plugins.agent.daemon" in open(f"/proc/{pid}/cmdline", "rb").read():
                os.kill(pid, 15)
        except (OSError, ValueError):
            pass


def run_hook(hook, tmp_path, config_text=None, env_extra=None, timeout=10):
    cfg = tmp_path / "slurm.toml"
    if config_text is not None:
        cfg.write_text(config_text)
    log = tmp_path / "hooks.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "REVEAL_"))}
    env.update(REVEAL_SLURM_CONFIG=str(cfg), REVEAL_SLURM_LOG=str(log), SLURM_JOB_ID="77",
               SLURM_JOB_UID=str(os.getuid()), SLURM_JOB_USER="root", SLURMD_NODENAME="n1")
    env.update(env_extra or {})
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "slurm", hook],
                       capture_output=True, text=True, env=env, timeout=timeout)
    return r, time.monotonic() - t0, (log.read_text() if log.exists() else r.stderr)


# -- configuration ---------------------------------------------------------------------------

def test_config_errors_name_file_key_and_value(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('spool = "/s"\nprolog_budget_s = "fast"\n')
    with pytest.raises(ConfigError, match=r"c.toml: \[slurm\] key 'prolog_budget_s' = 'fast': "
                                          r"expected float"):
        load_config(str(p))
    p.write_text("spool_dir = '/x'\n")
    with pytest.raises(ConfigError, match=r"unknown key 'spool_dir'"):
        load_config(str(p))
    p.write_text("spool = \"/s\"\nepilog_budget_s = = 2\n")
    with pytest.raises(ConfigError, match=r"c.toml: invalid TOML: .*line"):
        load_config(str(p))
    p.write_text("default_mode = 'loud'\n")
    with pytest.raises(ConfigError, match=r"'default_mode' = 'loud': is not one of off, on, live"):
        load_config(str(p))
    p.write_text("epilog_budget_s = 0\n")
    with pytest.raises(ConfigError, match=r"'epilog_budget_s' = 0: out of range"):
        load_config(str(p))
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path))
    p.write_text("[slurm]\nspool = '/srv/reveal'\nepilog_budget_s = 2\nanalysis = 'off'\n")
    cfg = load_config(str(p))
    assert (cfg.spool_dir(), cfg.epilog_budget_s, cfg.analysis) == ("/srv/reveal", 2.0, "off")


def test_reveal_option_values():
    assert parse_mode(None) == "on" and parse_mode("") == "on" and parse_mode("OFF") == "off"
    assert parse_mode("live") == "live"
    with pytest.raises(ValueError, match=r"--reveal=bogus: unknown value \(expected one of "
                                         r"off, on, live\)"):
        parse_mode("bogus")


# -- never drain: every failure is logged and the hook exits 0 in its budget ----------------------

@pytest.mark.parametrize("hook", ["prolog", "epilog", "task-prolog", "task-epilog"])
def test_hooks_exit_zero_on_invalid_config(tmp_path, hook):
    r, dt, log = run_hook(hook, tmp_path, "spool = \"/s\"\nepilog_budget_s = = 2\n")
    assert r.returncode == 0
    assert "configuration error" in log and "slurm.toml: invalid TOML" in log and "line" in log


def test_hook_outside_slurm_logs_cause(tmp_path):
    r, _, log = run_hook("prolog", tmp_path, f'spool = "{tmp_path}/spool"\n',
                         env_extra={"SLURM_JOB_ID": "not-a-job"})
    assert r.returncode == 0 and "SLURM_JOB_ID='not-a-job'" in log


@pytest.fixture
def hanging_agent(tmp_path):
    """A socket that accepts and never answers (an agent stuck in a syscall)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(spool / "agent.sock"))
    srv.listen(16)
    conns = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    yield str(spool)
    stop.set()
    th.join()
    for c in conns:
        c.close()
    srv.close()


@pytest.mark.parametrize("hook,budget", [("prolog", 0.5), ("epilog", 1.0)])
def test_hook_gives_up_within_budget_when_agent_hangs(tmp_path, hanging_agent, hook, budget):
    r, dt, log = run_hook(hook, tmp_path, f'spool = "{hanging_agent}"\n')
    assert r.returncode == 0
    # budget + interpreter start-up (~0.1-0.3 s on a loaded 2-core CI machine)
    assert dt < budget + 0.8, dt
    assert "no reply within" in log or "budget" in log


def test_task_prolog_exports_run_id_even_without_agent(tmp_path):
    r, _, log = run_hook("task-prolog", tmp_path, f'spool = "{tmp_path}/nospool"\n',
                         env_extra={"SLURM_STEP_ID": "3", "SLURM_LOCALID": "0"})
    assert r.returncode == 0
    assert r.stdout.strip() == "export REVEAL_RUN_ID=slurm-77"
    assert "agent socket" in log


def test_disabled_hooks_do_nothing(tmp_path):
    r, _, log = run_hook("prolog", tmp_path, f'enabled = false\nspool = "{tmp_path}/s"\n')
    assert r.returncode == 0 and not (tmp_path / "s").exists()


# -- SPANK build ----------------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/usr/include/slurm/spank.h"),
                    reason="libslurm-dev (slurm/spank.h) not installed")
def test_build_spank_compiles_plugin(tmp_path):
    out = str(tmp_path / "lib" / "reveal_spank.so")
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "slurm", "build-spank",
                        "--out", out, "--spool", "/srv/reveal"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"optional {out} spool=/srv/reveal" in r.stdout
    data = open(out, "rb").read()
    assert data[:4] == b"\x7fELF"
    for sym in (b"slurm_spank_init", b"slurm_spank_init_post_opt", b"slurm_spank_exit",
                b"slurm_spank_task_exit", b"spank_option_register", b"plugin_version"):
        assert sym in data
    assert plugstack_line("/x.so") == "optional /x.so"


def test_build_spank_reports_missing_header(tmp_path, monkeypatch):
    from reveal_plugins.slurm import spank_build
    monkeypatch.setattr(spank_build, "INCLUDE_DIRS", ())
    with pytest.raises(FileNotFoundError, match=r"slurm/spank.h not found in .*libslurm-dev"):
        spank_build.build(str(tmp_path / "x.so"), include_dir=str(tmp_path))


# -- job metadata (the CLI fallback path) -----------------------------------------------------------

SCONTROL_LINE = (
    "JobId=12 JobName=train job UserId=alice(1001) GroupId=users(100) MCS_label=N/A "
    "Priority=1 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None "
    "Dependency=(null) ExitCode=3:0 RunTime=00:00:02 TimeLimit=UNLIMITED "
    "StartTime=2026-12-02T11:40:08 EndTime=2026-12-02T11:40:10 Partition=debug "
    "NodeList=vm NumNodes=1 NumCPUs=1 WorkDir=/home/alice/my runs TresPerNode=gres:gpu:2")


def test_scontrol_parsing_keeps_values_with_spaces():
    kv = jobinfo.parse_scontrol_line(SCONTROL_LINE)
    assert kv["JobName"] == "train job" and kv["WorkDir"] == "/home/alice/my runs"
    info = jobinfo.from_scontrol(kv, "12")
    assert (info["user"], info["uid"], info["gid"], info["exit_code"]) == ("alice", 1001, 100, 3)
    assert (info["state"], info["nodes"], info["num_nodes"]) == ("COMPLETED", "vm", 1)
    assert info["account"] is None and info["gres"] == "gres:gpu:2"


def test_squeue_json_parsing_both_number_styles():
    doc = {"jobs": [{"job_id": 5, "name": "x", "user_name": "bob", "user_id": 7,
                     "group_id": {"set": True, "number": 8}, "partition": "p",
                     "job_state": ["RUNNING"], "nodes": "n[1-2]", "node_count": 2,
                     "exit_code": {"return_code": {"set": True, "number": 0}},
                     "start_time": {"set": True, "number": 100}, "end_time": 0}]}
    info = jobinfo.from_squeue_json(doc, "5")
    assert (info["uid"], info["gid"], info["state"], info["num_nodes"], info["exit_code"],
            info["start"]) == (7, 8, "RUNNING", 2, 0, 100)
    with pytest.raises(jobinfo.JobInfoError):
        jobinfo.from_squeue_json(doc, "6")


def test_job_info_rejects_bad_ids():
    with pytest.raises(ValueError, match="invalid Slurm job id"):
        jobinfo.job_info("1; rm -rf /")


def test_install_hooks_writes_runnable_wrappers(tmp_path):
    d = tmp_path / "hooks"
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "slurm", "install-hooks",
                        "--dir", str(d), "--config", str(tmp_path / "c.toml"),
                        "--log", str(tmp_path / "h.log")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"Prolog={d}/prolog" in r.stdout and f"Epilog={d}/epilog" in r.stdout
    for hook in ("prolog", "epilog", "task-prolog", "task-epilog"):
        assert os.access(d / hook, os.X_OK)
    (tmp_path / "c.toml").write_text(f'spool = "{tmp_path}/spool"\n')
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "5", "SLURM_LOCALID": "0"}
    # Slurm runs the script with its own minimal environment: the wrapper must be enough.
    r = subprocess.run([str(d / "task-prolog")], capture_output=True, text=True, env=env,
                       timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "export REVEAL_RUN_ID=slurm-5"
    r = subprocess.run([str(d / "prolog")], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert r.returncode == 0
    assert "SLURM_JOB_ID=''" in (tmp_path / "h.log").read_text()


def test_prolog_environment_to_run_identity():
    from reveal_plugins.slurm.config import SlurmConfig
    from reveal_plugins.slurm.hooks import run_info
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
           "SLURMD_NODENAME": "gpu07", "SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1",
           "SLURM_JOB_PARTITION": "a100"}
    run = run_info(env, SlurmConfig(spool="/srv/reveal"))
    assert run["run_id"] == "slurm-42" and run["run_dir"] == "/srv/reveal/jobs/42/gpu07"
    assert run["gpus"] == [2, 3]  # host numbering from SLURM_JOB_GPUS, not the job's view
    assert run["gid"] == 0 and run["extra"]["partition"] == "a100"
    env.pop("SLURM_JOB_GPUS")
    assert run_info(env, SlurmConfig())["gpus"] == [0, 1]
    env["CUDA_VISIBLE_DEVICES"] = "GPU-5f3a"  # UUIDs: unknown indices, not a wrong filter
    assert run_info(env, SlurmConfig())["gpus"] is None
    with pytest.raises(ValueError, match="SLURMD_NODENAME"):
        run_info(dict(env, SLURMD_NODENAME="../x"), SlurmConfig())


@pytest.mark.parametrize("python", ["missing", "failing", "hanging"])
def test_wrapper_exits_0_whatever_python_does(tmp_path, python):
    """A broken interpreter (gone, crashing on import, hanging) must not drain the node: the
    wrapper slurm.conf runs exits 0 and says why on stderr (slurmd's log)."""
    from reveal_plugins.slurm import install
    fake = tmp_path / "python3"
    if python == "failing":
        fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named tomllib' >&2\n"
                        "exit 1\n")
        fake.chmod(0o755)
    elif python == "hanging":
        fake.write_text("#!/bin/sh\nsleep 60\n")
        fake.chmod(0o755)
    old = install.WRAPPER_TIMEOUT_S
    install.WRAPPER_TIMEOUT_S = 2
    try:
        text = install.script("prolog", {"REVEAL_SLURM_LOG": str(tmp_path / "h.log")},
                              python=str(fake))
    finally:
        install.WRAPPER_TIMEOUT_S = old
    w = tmp_path / "prolog"
    w.write_text(text)
    w.chmod(0o755)
    t0 = time.monotonic()
    r = subprocess.run([str(w)], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "9"})
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 6
    assert "reveal-slurm prolog: job=9 the hook exited" in r.stderr
    if python == "hanging":
        assert "exited 124" in r.stderr


def test_epilog_sees_the_registration_the_prolog_queued(tmp_path, monkeypatch):
    """A short job during an agent cold start: the Prolog queues its registration, the agent
    answers 'not registered' at the Epilog; the Epilog must find the queued registration (it
    looked for `"run_id": "..."` with a space, the Prolog's writer writes compact JSON:
    issue 23) and queue the unregister behind it, or the run stays open forever."""
    import time as _time

    from reveal_plugins.slurm import hooks
    from reveal_plugins.slurm.config import SlurmConfig
    spool = str(tmp_path / "spool")
    os.makedirs(spool)
    monkeypatch.setenv("REVEAL_SLURM_LOG", str(tmp_path / "hooks.log"))
    monkeypatch.setattr(hooks, "start_agent_detached", lambda *a: None)   # no agent at all
    env = {"SLURM_JOB_ID": "4711", "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
           "SLURMD_NODENAME": "n1"}
    cfg = SlurmConfig(spool=spool, analysis="off")
    hooks.prolog(cfg, env, _time.monotonic() + 5)            # queues through its own writer
    assert len(os.listdir(os.path.join(spool, "pending"))) == 1
    assert hooks._registration_pending(spool, "slurm-4711")
    assert not hooks._registration_pending(spool, "slurm-471")     # the whole id, no prefix
    # the SPANK plugin's spelling (spaces after ':' and ',') is found by the same parser
    spank = os.path.join(spool, "pending", "0.000001-spank.json")
    with open(spank, "w") as f:
        f.write('{"op": "register", "run": {"run_id": "slurm-4712", "source": "slurm"}}\n')
    assert hooks._registration_pending(spool, "slurm-4712")
    os.unlink(spank)
    # the agent came up but has not read the queue yet: the unregister is queued behind it
    monkeypatch.setattr(hooks, "agent_request",
                        lambda *a: {"ok": False, "error": "run_id is not registered"})
    hooks.epilog(cfg, env, _time.monotonic() + 5)
    from reveal_plugins.agent import pending
    ops = [r["op"] for _, r in pending.take(os.path.join(spool, "pending"), (0,))]
    assert ops == ["register", "unregister"]
