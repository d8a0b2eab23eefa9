"""Issue 23: the SPANK C plugin builds its three requests by hand.  They are compared here with
what the Python builders (``agent/protocol.py``, through the Python Prolog, TaskProlog and
Epilog) send for the same job: the same fields with the same JSON types, so the C side cannot
drift again (it had left out nodelist, account, job_name, cluster and the GPU spec, and SPANK
jobs had workload ``unknown`` in the fleet).  The plugin's own functions run against a
listening socket in a harness (its ``spank_get_item`` is the harness's)."""
import json
import os
import shutil
import socket
import subprocess
import threading

import pytest

from reveal_plugins.slurm import hooks
from reveal_plugins.slurm.config import SlurmConfig

HARNESS = r"""
#include SOURCE
#include <stdarg.h>
spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	va_list ap;
	(void) sp;
	va_start(ap, item);
	if (item == S_JOB_ID)
		*va_arg(ap, uint32_t *) = 4242;
	else if (item == S_JOB_UID)
		*va_arg(ap, uid_t *) = 1000;
	else if (item == S_JOB_GID)
		*va_arg(ap, gid_t *) = 1000;
	else {
		va_end(ap);
		return ESPANK_BAD_ARG;
	}
	va_end(ap);
	return ESPANK_SUCCESS;
}
int main(int argc, char **argv)
{
	char *av[] = {argv[1], argv[2]};
	(void) argc;
	slurm_spank_job_prolog(NULL, 2, av);
	job_id = 4242;
	snprintf(step_name, sizeof(step_name), "0");
	send_event("step_start", "");
	slurm_spank_job_epilog(NULL, 2, av);
	return 0;
}
"""

ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "1000",
       "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "n7", "SLURM_JOB_PARTITION": "gpu",
       "SLURM_JOB_NODELIST": "n[7-8]", "SLURM_JOB_ACCOUNT": "proj1",
       "SLURM_JOB_NAME": 'train "big" \\ model', "SLURM_CLUSTER_NAME": "alps",
       "SLURM_CPUS_ON_NODE": "8",
       "SLURM_JOB_GPUS": "0,2", "CUDA_VISIBLE_DEVICES": "GPU-1234,GPU-5678",
       "SLURM_JOB_EXIT_CODE2": "3:0", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0",
       "PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    from reveal_plugins.slurm.spank_build import find_include, source_path
    try:
        inc = find_include()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    d = tmp_path_factory.mktemp("spank-json")
    (d / "h.c").write_text(HARNESS.replace("SOURCE", json.dumps(source_path())))
    subprocess.run(["gcc", "-Wall", "-Werror", "-O2", "-no-pie", f"-I{inc}", "-o",
                    str(d / "h"), str(d / "h.c"), "-lslurm",
                    "-Wl,--unresolved-symbols=ignore-in-object-files"],
                   check=True, capture_output=True, text=True)
    return str(d / "h")


def _capture(spool, run):
    """Answer ok to every request on ``spool``/agent.sock while ``run()`` runs; the requests."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(os.path.join(spool, "agent.sock"))
    srv.listen(8)
    srv.settimeout(0.2)
    got, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                c = srv.accept()[0]
            except OSError:
                continue
            with c:
                c.settimeout(2)
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = c.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                if buf:
                    got.append(json.loads(buf))
                    c.sendall(b'{"ok": true, "run_dir": "/x"}\n')
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        run()
    finally:
        stop.set()
        th.join(5)
        srv.close()
        os.unlink(os.path.join(spool, "agent.sock"))
    return got


def _shape(v):
    """A value's JSON type, recursively for objects (what must agree)."""
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in v.items()}
    return type(v).__name__


def test_the_c_plugin_sends_what_the_python_builders_send(harness, tmp_path, monkeypatch):
    spool = tmp_path / "spool"
    spool.mkdir()
    hooks_dir = tmp_path / "no-hooks"
    hooks_dir.mkdir()
    c_reqs = _capture(str(spool), lambda: subprocess.run(
        [harness, f"spool={spool}", f"hooks={hooks_dir}"], env=ENV, check=True, timeout=30,
        capture_output=True))
    assert [r["op"] for r in c_reqs] == ["register", "event", "unregister"], c_reqs

    cfg = SlurmConfig(spool=str(spool))
    monkeypatch.setattr(hooks, "find_cgroup", lambda job, uid: None)   # no Slurm cgroup here
    py_reqs = []

    def python_side():
        hooks.prolog(cfg, ENV, __import__("time").monotonic() + 5)
        hooks.task_hook("step_start", cfg, ENV, __import__("time").monotonic() + 5)
        hooks.epilog(cfg, ENV, __import__("time").monotonic() + 5)
    monkeypatch.setattr(hooks.subprocess, "Popen", lambda *a, **k: None)  # no analysis
    py_reqs = _capture(str(spool), python_side)
    py = {r["op"]: r for r in py_reqs}
    c = {r["op"]: r for r in c_reqs}
    assert set(py) == {"register", "event", "unregister"}, py_reqs

    # registration: same run fields, same values (the plugin marks itself in extra)
    c_run, py_run = c["register"]["run"], py["register"]["run"]
    c_extra = dict(c_run["extra"])
    assert c_extra.pop("registered_by") == "spank"
    assert c_extra == py_run["extra"], (c_extra, py_run["extra"])
    assert c_extra["job_name"] == 'train "big" \\ model'
    assert c_extra["gpu_spec"] == {"source": "SLURM_JOB_GPUS", "value": "0,2", "slurm": True}
    assert {k: v for k, v in c_run.items() if k != "extra"} == \
        {k: v for k, v in py_run.items() if k != "extra"}, (c_run, py_run)
    # the step marker and the close: same fields and JSON types (the source names the sender)
    c_ev, py_ev = dict(c["event"]), dict(py["event"])
    assert (c_ev.pop("source"), py_ev.pop("source")) == ("spank", "task-hook")
    py_ev.pop("v", None), py_ev.pop("exit_code", None)
    assert _shape(c_ev) == _shape({k: v for k, v in py_ev.items()}), (c_ev, py_ev)
    py_un = {k: v for k, v in py["unregister"].items() if k != "v"}
    assert c["unregister"] == py_un, (c["unregister"], py_un)


def test_a_job_name_in_another_encoding_or_with_control_characters_stays_valid_json(
        harness, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    env = dict(ENV, SLURM_JOB_NAME="t\x01\x7fé\u202ejob")
    reqs = _capture(str(spool), lambda: subprocess.run(
        [harness, f"spool={spool}", f"hooks={tmp_path}"], env=env, check=True, timeout=30,
        capture_output=True))
    assert reqs[0]["run"]["extra"]["job_name"] == "t??" + "??" + "???job"
