"""``reveal slurm check`` before a rollout: green on the real test cluster as it is configured,
red (exit 1, the path and the reason named) on each fault an operator can make."""
import json
import os
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "reveal_plugins.cli", "slurm", "check"]


def check(*args, env=None):
    r = subprocess.run([*CLI, *args, "-f", "json"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert (r.returncode == 1) == (doc["failed"] > 0)
    return r.returncode, {c["name"]: c for c in doc["checks"]}


@pytest.mark.slurm
def test_the_test_cluster_passes_the_check(slurm_cluster):
    c = slurm_cluster
    env = dict(os.environ, SLURM_CONF=c.conf, REVEAL_SLURM_CONFIG=c.hook_config_path,
               REVEAL_SPOOL=c.spool)
    c.run_batch("#!/bin/sh\ntrue\n")          # an agent is running
    rc, checks = check(env=env)
    assert rc == 0, checks
    assert checks["SPANK plugin"]["state"] == "ok" and c.spank_so in checks["SPANK plugin"][
        "detail"]
    assert checks["node agent"]["state"] == "ok" and "answers" in checks["node agent"]["detail"]
    assert checks["PrologFlags"]["state"] == "ok"
    assert checks["hook configuration"]["detail"] == c.hook_config_path


@pytest.fixture
def node(tmp_path):
    """A slurm.conf with Prolog/Epilog scripts that call reveal, as install-hooks writes them."""
    os.chmod(tmp_path, 0o755)
    hooks = tmp_path / "hooks"
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "slurm", "install-hooks",
                        "--dir", str(hooks)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"PrologFlags=Alloc\nProlog={hooks}/prolog\nEpilog={hooks}/epilog\n"
                    f"PlugStackConfig={tmp_path}/plugstack.conf\n")
    (tmp_path / "plugstack.conf").write_text("")
    env = dict(os.environ, REVEAL_SPOOL=str(tmp_path / "spool"),
               REVEAL_SLURM_CONFIG="", REVEAL_CONFIG="")
    return tmp_path, str(conf), env


def test_hook_scripts_as_installed_pass(node):
    base, conf, env = node
    rc, checks = check("--slurm-conf", conf, env=env)
    assert rc == 0, checks
    assert checks["slurm.conf Prolog"]["state"] == "ok"
    assert checks["SPANK plugin"]["state"] == "warn"      # steps only from TaskProlog then


@pytest.mark.skipif(os.geteuid() != 0, reason="the ownership rule is root's")
def test_a_hook_a_user_can_change_fails(node):
    base, conf, env = node
    os.chmod(base / "hooks" / "epilog", 0o777)
    rc, checks = check("--slurm-conf", conf, env=env)
    assert rc == 1
    c = checks["slurm.conf Epilog"]
    assert c["state"] == "FAIL" and "writable by group or others" in c["detail"]
    assert str(base / "hooks" / "epilog") in c["detail"]


def test_a_missing_hook_and_no_plugin_fail(node):
    base, conf, env = node
    os.unlink(base / "hooks" / "prolog")
    os.unlink(base / "hooks" / "epilog")
    rc, checks = check("--slurm-conf", conf, env=env)
    assert rc == 1
    assert checks["slurm.conf Prolog"]["state"] == "FAIL" and "not found" in \
        checks["slurm.conf Prolog"]["detail"]
    assert checks["Slurm calls Reveal"]["state"] == "FAIL"


def test_a_required_plugin_is_a_warning_and_a_missing_one_a_failure(node):
    base, conf, env = node
    so = base / "reveal_spank.so"
    so.write_bytes(b"\x7fELF")
    (base / "plugstack.conf").write_text(f"required {so} spool=/var/spool/reveal\n")
    rc, checks = check("--slurm-conf", conf, env=env)
    assert checks["SPANK plugin"]["state"] == "warn" and "optional" in \
        checks["SPANK plugin"]["detail"]
    (base / "plugstack.conf").write_text(f"optional {base}/reveal_spank_gone.so\n")
    rc, checks = check("--slurm-conf", conf, env=env)
    assert rc == 1 and checks["SPANK plugin"]["state"] == "FAIL"
    assert "build-spank" in checks["SPANK plugin"]["detail"]


def test_a_bad_configuration_fails_with_its_own_message(node):
    base, conf, env = node
    bad = base / "slurm.toml"
    bad.write_text("interval_s = 'fast'\n")
    site = base / "reveal.toml"
    site.write_text("[otle]\nendpoint = 'http://x'\n")
    env = dict(env, REVEAL_SLURM_CONFIG=str(bad), REVEAL_CONFIG=str(site))
    rc, checks = check("--slurm-conf", conf, env=env)
    assert rc == 1
    assert checks["hook configuration"]["state"] == "FAIL" and "interval_s" in \
        checks["hook configuration"]["detail"]
    assert checks["site configuration"]["state"] == "FAIL" and "[otle]" in \
        checks["site configuration"]["detail"]


def test_no_prolog_alloc_is_a_warning(node):
    base, conf, env = node
    with open(conf) as f:
        text = f.read().replace("PrologFlags=Alloc\n", "")
    with open(conf, "w") as f:
        f.write(text)
    rc, checks = check("--slurm-conf", conf, env=env)
    assert rc == 0 and checks["PrologFlags"]["state"] == "warn"
