"""Third-party plugins join through the ``reveal_plugins`` entry-point group."""
import json
import os
import subprocess
import sys

import pytest

from reveal_plugins.hooks import get_plugin_manager
from reveal_plugins.store import store

HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def site_plugin(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target),
                    os.path.join(HERE, "data", "site_plugin")], check=True,
                   capture_output=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(target), os.environ.get("PYTHONPATH", "")]))
    return env


def test_builtins_are_registered_as_plugins():
    pm = get_plugin_manager()
    assert pm.get_plugin("reveal_plugins.probes.builtin_probes") is not None
    impls = [i.plugin_name for i in pm.hook.reveal_register_probes.get_hookimpls()]
    assert "reveal_plugins.probes.builtin_probes" in impls


def test_installed_site_probe_is_listed_and_sampled(site_plugin, tmp_path):
    out = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "probes", "--json"],
                         env=site_plugin, capture_output=True, text=True, check=True).stdout
    assert any(r["name"] == "site.heartbeat" and r["available"] for r in json.loads(out))
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "record", "--out", str(run),
                    "--no-analyze", "--", "sleep", "1.5"], env=site_plugin, check=True,
                   capture_output=True)
    r = store.load_run(str(run))
    hb = r.frame.column("system.site.heartbeat")
    assert len(hb) >= 10 and (hb[1:] - hb[:-1] == 1).all()


def test_disabling_a_plugin_by_name(site_plugin):
    env = dict(site_plugin, REVEAL_DISABLE_PLUGINS="site_probe")
    out = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "probes", "--json"],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert not any(r["name"] == "site.heartbeat" for r in json.loads(out))
