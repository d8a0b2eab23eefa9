"""Issue 26, item 4: every REVEAL_* variable the code reads is documented in
docs/environment.md (they were documented nowhere)."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_variable_in_the_code_is_in_the_doc():
    names = set()
    for top in ("reveal_plugins", "examples", ".ci"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".py", ".sh", ".c")) or f in ("run", "venv.sh"):
                    with open(os.path.join(d, f), errors="replace") as fh:
                        names |= set(re.findall(r"REVEAL_[A-Z0-9_]+", fh.read()))
    names -= {"REVEAL_OPTIONS"}                  # a Python constant, not a variable
    doc = open(os.path.join(ROOT, "docs", "environment.md")).read()
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"not in docs/environment.md: {missing}"


def test_the_configuration_reference_is_the_one_the_code_generates():
    """docs/config.md is made by tools/gen_config_doc.py from the dataclasses and key sets
    that validate the files; a key added, renamed or re-defaulted without regenerating fails."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_config_doc.py"),
                        "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = open(os.path.join(ROOT, "docs", "config.md")).read()
    from reveal_plugins.otel.config import FILE_KEYS
    from reveal_plugins.agent.settings import AgentConfig
    from reveal_plugins.detect.config import DetectConfig, LiveConfig, PeersConfig
    from reveal_plugins.slurm.config import SlurmConfig
    import dataclasses
    keys = [k for m in (AgentConfig, DetectConfig, LiveConfig, PeersConfig)
            for k, f in m.model_fields.items() if not f.exclude and k not in ("live", "peers")]
    keys += [f.name for f in dataclasses.fields(SlurmConfig)
             if f.name not in SlurmConfig.NOT_KEYS]
    for key in keys + sorted(FILE_KEYS):
        assert f"| `{key}` |" in doc, key
