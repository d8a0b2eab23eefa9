"""``sudo reveal record`` in a user's directory: the private agent it starts (as root) imports
nothing from that directory (issue 22).  ``python -m`` puts the working directory first on
``sys.path``; a planted ``numpy.py`` there ran as root and the run lost its telemetry."""
import json
import os
import subprocess
import sys

from reveal_plugins.store import store

PLANT = "import os\nopen({marker!r}, 'w').write(str(os.getuid()))\n"


def test_private_agent_imports_nothing_from_the_callers_directory(tmp_path):
    cwd, out, marker = tmp_path / "home", tmp_path / "run", tmp_path / "planted-code-ran"
    cwd.mkdir()
    for mod in ("numpy.py", "pyarrow.py", "reveal_plugins.py"):
        (cwd / mod).write_text(PLANT.format(marker=str(marker)))
    # -P: the CLI itself must not import from cwd either (the `reveal` script does not); the
    # agent it starts is what is tested.
    p = subprocess.run([sys.executable, "-P", "-m", "reveal_plugins.cli", "record", "--out",
                        str(out), "--no-analyze", "--", "sleep", "1"], cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert not marker.exists(), f"code planted in the caller's directory ran as uid " \
        f"{marker.read_text()}"
    assert "telemetry disabled" not in p.stderr, p.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert len(meta["channels"]) >= 200
    assert len(store.load_run(str(out)).frame.t) >= 5     # the run has its telemetry
