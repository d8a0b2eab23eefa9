"""The SPANK plugin under bad arguments and hostile paths (issue 13).

* its GPU list always becomes valid JSON (the plugin's own C function, compiled into a small
  program with the real libslurm -- no Slurm daemon needed);
* a bad plugstack.conf argument never blocks srun, even on a ``required`` line (real Slurm);
* ``timing=`` is written as root only in a root-owned, not group/other-writable directory, and
  never through a symlink (real Slurm).
"""
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from reveal_plugins.slurm.spank_build import find_include, source_path

HARNESS = r"""
#include SOURCE
int main(int argc, char **argv)
{
	char out[300];
	for (int i = 2; i < argc; i++) {
		if (argv[1][0] == 'e') {      /* e SPOOL JOB STEP EVENT: the plugin's own client */
			snprintf(spool, sizeof(spool), "%s", argv[2]);
			job_id = (uint32_t) strtoul(argv[3], NULL, 10);
			snprintf(step_name, sizeof(step_name), "%s", argv[4]);
			send_event(argv[5], "");
			return 0;
		}
		if (argv[1][0] == 'g') {
			gpu_list_json(out, sizeof(out), argv[i]);
			printf("%s\n", out);
		} else {
			printf("%d\n", path_ok(argv[i], 256));
		}
	}
	return 0;
}
"""


@pytest.fixture(scope="module")
def plugin_functions(tmp_path_factory):
    """Run the plugin's static helpers: ``call("gpus"|"path", *inputs) -> [outputs]``."""
    try:
        inc = find_include()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    d = tmp_path_factory.mktemp("spank-unit")
    (d / "h.c").write_text(HARNESS.replace("SOURCE", json.dumps(source_path())))
    # The spank_* callbacks live in slurmstepd; the helpers under test never call them.
    subprocess.run(["gcc", "-Wall", "-Werror", "-O2", "-no-pie", f"-I{inc}", "-o",
                    str(d / "h"), str(d / "h.c"), "-lslurm",
                    "-Wl,--unresolved-symbols=ignore-in-object-files"],
                   check=True, capture_output=True, text=True)

    def call(kind, *inputs):
        r = subprocess.run([str(d / "h"), kind, *inputs], capture_output=True, text=True,
                           check=True, timeout=10)
        return r.stdout.splitlines()
    return call


def test_gpu_list_is_always_valid_json(plugin_functions):
    cases = {"0,1": [0, 1], "0,,1": [0, 1], ",": None, "1,a": [1], "": None, "007,3": [7, 3],
             "GPU-5f3a,2": [2], ",,,5,": [5], "1234567": None, "3": [3]}
    out = plugin_functions("gpus", *cases)
    assert [json.loads(o) for o in out] == list(cases.values())


def test_timing_path_syntax(plugin_functions):
    cases = {"/var/log/reveal/t.log": 1, "t.log": 0, "/var/log/../etc/x": 0, "/a/./b": 0,
             "/a/..": 0, "/a/b/": 0, "/a/.hidden": 1, "/a/..b": 1}
    assert plugin_functions("path", *cases) == [str(v) for v in cases.values()]


def test_the_c_client_speaks_the_protocol_spec_to_a_real_agent(plugin_functions, tmp_path):
    """docs/protocol.md from the C side: the plugin's event reaches a real agent and is stored;
    with no agent listening the plugin queues it in pending/, and the agent's queue reader
    (the same decoder as the socket) accepts and applies the file."""
    from reveal_plugins.store import store
    from reveal_plugins.agent.daemon import Agent
    from reveal_plugins.types import RunInfo
    spool = str(tmp_path / "spool")
    run_dir = os.path.join(spool, "jobs", "5", "n")
    a = Agent(spool, interval_s=0.05, segment_s=0.5)
    a.start()
    try:
        a.register(RunInfo(run_id="slurm-5", source="slurm", job_id="5", run_dir=run_dir))
        plugin_functions("event", spool, "5", "0", "step_start")
        ev = [e for e in store.read_events(run_dir) if e.get("event") == "step_start"]
        assert ev and ev[-1]["step_id"] == "0" and ev[-1]["source"] == "spank"
    finally:
        a.stop()
    plugin_functions("event", spool, "5", "1", "step_start")   # agent gone: queued
    queued = os.listdir(os.path.join(spool, "pending"))
    assert len(queued) == 1 and "-spank" in queued[0] and queued[0].endswith(".json")
    b = Agent(spool, interval_s=0.05, segment_s=0.5)
    b.register(RunInfo(run_id="slurm-5", source="slurm", job_id="5", run_dir=run_dir))
    b.take_pending(os.path.join(spool, "pending"))
    ev = [e for e in store.read_events(run_dir) if e.get("event") == "step_start"]
    assert [e["step_id"] for e in ev][-1] == "1"
    assert os.listdir(os.path.join(spool, "pending")) == []
    b.unregister("slurm-5", 0)


# -- real Slurm ----------------------------------------------------------------------------

def _slurmd_log_since(cluster, offset):
    with open(os.path.join(cluster.base, "log", "slurmd.log"), "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _slurmd_log_size(cluster):
    return os.path.getsize(os.path.join(cluster.base, "log", "slurmd.log"))


@pytest.mark.slurm
@pytest.mark.slow
def test_bad_argument_on_a_required_line_never_blocks_jobs(slurm_cluster, slurm_users):
    user = slurm_users[0]
    conf = os.path.join(slurm_cluster.base, "etc", "plugstack.conf")
    try:
        with open(conf, "w") as f:
            f.write(f"required {slurm_cluster.spank_so} spool={slurm_cluster.spool} "
                    "timeout_ms=5 bogus=1\n")
        r = slurm_cluster.srun(["true"], user=user)
        assert r.returncode == 0, r.stderr
        assert "unknown plugstack.conf argument 'bogus=1'" in r.stderr, r.stderr
        assert "'timeout_ms=5': timeout_ms must be between 10 and 10000" in r.stderr  # every one
        assert "plugin disabled" in r.stderr
        job = slurm_cluster.run_batch("#!/bin/sh\nsrun --reveal=off true\n", user=user)
        assert job.state == "COMPLETED", job.info
    finally:
        slurm_cluster._write_mode_files(slurm_cluster.mode)
    assert slurm_cluster.node_state() == "idle"


@pytest.mark.slurm
@pytest.mark.slow
def test_timing_file_only_where_root_owns_and_never_through_a_symlink(slurm_cluster,
                                                                      slurm_users):
    user = slurm_users[0]
    b = slurm_cluster.base
    base = tempfile.mkdtemp(prefix="reveal-timing-")
    try:
        open_dir = os.path.join(base, "open")          # a directory anybody can write
        os.mkdir(open_dir)
        os.chmod(open_dir, 0o1777)
        safe_dir = os.path.join(base, "safe")
        os.mkdir(safe_dir, 0o755)
        victim = os.path.join(base, "victim")
        with open(victim, "w") as f:
            f.write("untouched\n")
        os.chmod(victim, 0o644)
        os.symlink(victim, os.path.join(safe_dir, "link.log"))
        args = f"spool={slurm_cluster.spool} hooks={b}/hooks timing="
        for path, cause in ((os.path.join(open_dir, "t.log"), "refused: its directory"),
                            (os.path.join(safe_dir, "link.log"), "symlinks are not followed")):
            off = _slurmd_log_size(slurm_cluster)
            with slurm_cluster.spank_args(args + path):
                job = slurm_cluster.run_batch("#!/bin/sh\nsrun true\n", user=user)
            assert job.state == "COMPLETED", job.info
            assert slurm_cluster.node_state() == "idle"
            log = _slurmd_log_since(slurm_cluster, off)
            assert f"timing={path}" in log and cause in log, log[-3000:]
            # a cold-started agent takes the queued registration once it is up (seconds)
            mpath = os.path.join(slurm_cluster.run_dir(job.job_id), "meta.json")
            deadline = time.monotonic() + 60
            while not os.path.exists(mpath) and time.monotonic() < deadline:
                time.sleep(0.2)
            meta = json.load(open(mpath))
            assert meta["run"]["extra"].get("registered_by") == "spank"   # still recorded
        assert not os.path.exists(os.path.join(open_dir, "t.log"))
        assert open(victim).read() == "untouched\n"
        good = os.path.join(safe_dir, "t.log")
        with slurm_cluster.spank_args(args + good):
            job = slurm_cluster.run_batch("#!/bin/sh\ntrue\n", user=user)
        assert job.state == "COMPLETED"
        st = os.stat(good)
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == 0
        assert any(line.split()[:2] == ["prolog", job.job_id] for line in open(good))
    finally:
        shutil.rmtree(base, ignore_errors=True)
