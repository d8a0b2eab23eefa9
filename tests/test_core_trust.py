"""Root loads configuration and plugin code only when root owns it and no one else can write it
(issue 13): another user's file, or a group/other-writable directory above it, would let that
user choose the code root runs."""
import json
import os
import pwd
import subprocess
import sys

import pytest

from reveal_plugins.otel.config import OtelConfigError, read_file_section
from reveal_plugins.slurm.config import ConfigError, load_config
from reveal_plugins.trust import UntrustedPath, require_trusted_module, untrusted_reason

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule applies to root")
NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def root_dir(tmp_path):
    d = tmp_path / "etc"
    d.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    return d


def test_root_owned_files_pass_and_the_sticky_tmp_above_them_is_accepted(root_dir):
    f = root_dir / "reveal.toml"
    f.write_text("")
    os.chmod(f, 0o644)
    assert untrusted_reason(str(f)) is None  # /tmp (1777, sticky) is above it


def test_a_config_file_owned_by_another_user_is_refused_naming_the_owner(root_dir):
    f = root_dir / "slurm.toml"
    f.write_text('analyzer = "evil:run"\n')
    os.chown(f, NOBODY, -1)
    with pytest.raises(ConfigError, match=r"slurm.toml.*owned by uid \d+ \(nobody\), not root"):
        load_config(str(f))


def test_a_group_writable_directory_above_the_config_is_refused(root_dir):
    f = root_dir / "reveal.toml"
    f.write_text('[otel]\nendpoint = "http://c:4318"\n')
    os.chmod(f, 0o644)
    os.chmod(root_dir, 0o775)
    with pytest.raises(OtelConfigError, match=r"etc is writable by group or others \(mode 0775\)"):
        read_file_section(str(f))
    os.chmod(root_dir, 0o755)
    assert read_file_section(str(f)) == {"endpoint": "http://c:4318"}


def test_a_symlink_to_a_user_file_is_judged_by_its_target(root_dir, tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    os.chown(user, NOBODY, -1)
    target = user / "slurm.toml"
    target.write_text("")
    os.symlink(target, root_dir / "slurm.toml")
    with pytest.raises(ConfigError, match="owned by uid"):
        load_config(str(root_dir / "slurm.toml"))


def test_an_analyzer_in_a_user_directory_is_never_imported(root_dir, tmp_path, monkeypatch):
    user = tmp_path / "userpkg"
    user.mkdir()
    marker = tmp_path / "imported"
    (user / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef run(*a): pass\n")
    os.chown(user, NOBODY, -1)
    monkeypatch.syspath_prepend(str(user))
    with pytest.raises(UntrustedPath, match="analyzer .*evilmod.py.*owned by uid"):
        require_trusted_module("evilmod", "analyzer")
    assert not marker.exists()
    os.chown(user, 0, -1)
    os.chown(user / "evilmod.py", 0, -1)
    require_trusted_module("evilmod", "analyzer")  # root-owned now: accepted


def test_a_third_party_plugin_not_owned_by_root_is_skipped_with_a_warning(tmp_path):
    """An entry point installed into a directory another user controls: root's plugin manager
    logs it and goes on with the built-ins."""
    site = tmp_path / "site"
    (site / "badplug-1.0.dist-info").mkdir(parents=True)
    (site / "badplug-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: badplug\nVersion: 1.0\n")
    (site / "badplug-1.0.dist-info" / "entry_points.txt").write_text(
        "[reveal_plugins]\nbadplug = badplug_mod\n")
    (site / "badplug_mod.py").write_text("import sys\nsys.exit('imported as root')\n")
    os.chown(site / "badplug_mod.py", NOBODY, -1)
    script = ("import logging, json; logging.basicConfig(level=logging.WARNING);"
              "from reveal_plugins.hooks import get_plugin_manager as g;"
              "pm = g(); print(json.dumps([n for n, _ in pm.list_name_plugin()]))")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(site)), timeout=60)
    assert p.returncode == 0, p.stderr
    names = json.loads(p.stdout)
    assert "badplug" not in names and "reveal_plugins.detect.plugin" in names
    assert "plugin 'badplug'" in p.stderr and "owned by uid" in p.stderr
