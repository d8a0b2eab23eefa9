"""The SPANK plugin starts the detached Prolog/Epilog helpers from inside slurmstepd: the helper
must not inherit slurmstepd's descriptors (slurmstepd may hold fds past 1024, and a held socket
or pipe keeps a job's I/O open), and gets its REVEAL_SPANK_* variables from an environment built
before fork(), replacing any inherited value."""
import json
import os
import shutil
import subprocess
import time

import pytest

HARNESS = r"""
#include SOURCE
int main(int argc, char **argv)
{
	(void) argc;
	snprintf(hooks_dir, sizeof(hooks_dir), "%s", argv[1]);
	int fd = open("/dev/null", O_RDONLY);          /* a descriptor the helper must not see */
	if (fd < 0 || dup2(fd, 1500) != 1500 || dup2(fd, 7) != 7)
		return 2;
	spawn_hook(argv[2], argv[3][0] ? argv[3] : NULL);
	return 0;
}
"""


@pytest.fixture(scope="module")
def spawn(tmp_path_factory):
    from reveal_plugins.slurm.spank_build import find_include, source_path
    try:
        inc = find_include()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    d = tmp_path_factory.mktemp("spank-spawn")
    (d / "h.c").write_text(HARNESS.replace("SOURCE", json.dumps(source_path())))
    subprocess.run(["gcc", "-Wall", "-Werror", "-O2", "-no-pie", f"-I{inc}", "-o",
                    str(d / "h"), str(d / "h.c"), "-lslurm",
                    "-Wl,--unresolved-symbols=ignore-in-object-files"],
                   check=True, capture_output=True, text=True)
    return str(d / "h")


def _hook(tmp_path, name):
    out = tmp_path / "seen"
    hook = tmp_path / name
    hook.write_text(f"#!/bin/sh\nls /proc/$$/fd > {out}.tmp\nenv >> {out}.tmp\n"
                    f"mv {out}.tmp {out}\n")
    hook.chmod(0o755)
    return out


def _wait(path):
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, "the hook never ran"
        time.sleep(0.05)
    fds, env = [], {}
    for line in path.read_text().splitlines():
        if line.isdigit():
            fds.append(int(line))
        elif "=" in line:
            k, v = line.split("=", 1)
            env[k] = v
    return fds, env


@pytest.mark.parametrize("hook,state,var", [("epilog", "queued", "REVEAL_SPANK_UNREGISTERED"),
                                            ("prolog", "busy", "REVEAL_SPANK_QUEUED")])
def test_helper_gets_no_inherited_fds_and_its_own_variables(spawn, tmp_path, hook, state, var):
    out = _hook(tmp_path, hook)
    env = dict(os.environ, REVEAL_SPANK_DETACHED="stale", KEEP_ME="yes")
    env.pop("REVEAL_SPANK_QUEUED", None)
    env.pop("REVEAL_SPANK_UNREGISTERED", None)
    subprocess.run([spawn, str(tmp_path), hook, state], check=True, env=env, timeout=10)
    fds, seen = _wait(out)
    # 0-2 on /dev/null, plus the shell's own for `ls` (at most one more, below 10)
    assert 1500 not in fds and 7 not in fds, fds
    assert seen[var] == state
    assert seen["REVEAL_SPANK_DETACHED"] == "1"          # replaced, not duplicated
    assert seen["KEEP_ME"] == "yes"


def test_no_state_sets_only_detached(spawn, tmp_path):
    out = _hook(tmp_path, "epilog")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REVEAL_SPANK_")}
    subprocess.run([spawn, str(tmp_path), "epilog", ""], check=True, env=env, timeout=10)
    _, seen = _wait(out)
    assert seen["REVEAL_SPANK_DETACHED"] == "1"
    assert "REVEAL_SPANK_UNREGISTERED" not in seen and "REVEAL_SPANK_QUEUED" not in seen
