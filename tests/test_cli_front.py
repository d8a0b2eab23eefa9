"""Issue 26, item 4 (part): hook subcommands answer --help without running the hook;
reveal-torchrun shows reveal's version."""
import os
import subprocess
import sys

import pytest

from reveal_plugins import __version__


@pytest.mark.parametrize("hook", ["prolog", "epilog", "task-prolog", "task-epilog"])
def test_hook_help_does_not_run_the_hook(hook, tmp_path):
    log = tmp_path / "hooks.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(REVEAL_SLURM_LOG=str(log), SLURM_JOB_ID="77", SLURM_JOB_UID="0")
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "slurm", hook, "--help"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and f"usage: reveal slurm {hook}" in r.stdout, r
    assert not log.exists(), log.read_text()            # nothing ran, nothing logged
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "slurm", hook, "bogus"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "takes no arguments" in r.stderr
    assert not log.exists()


def test_reveal_torchrun_reports_its_version():
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.torch_ext.launcher",
                        "--reveal-version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and __version__ in r.stdout, r


def test_a_misspelled_table_in_the_site_config_is_an_error(tmp_path):
    cfg = tmp_path / "reveal.toml"
    cfg.write_text('[otle]\nendpoint = "http://127.0.0.1:4318"\n')
    os.chmod(cfg, 0o644)
    env = dict(os.environ, REVEAL_CONFIG=str(cfg))
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "otel", "config"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0, r.stdout
    assert str(cfg) in r.stderr and "unknown table [otle]" in r.stderr and "[otel]" in \
        r.stderr, r.stderr
    from reveal_plugins.fleet.dask_runtime import FleetRuntimeError, _config_tls
    with pytest.raises(FleetRuntimeError, match=r"unknown table \[otle\]"):
        _config_tls(str(cfg))
