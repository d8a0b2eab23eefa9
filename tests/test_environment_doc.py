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
