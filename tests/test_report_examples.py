"""The example scenarios run as written (shortened), and refuse to clobber a run."""
import json
import os
import pathlib
import shutil
import subprocess

import jsonschema
import numpy as np
import pytest
from conftest import SCHEMA_PATH

from reveal_plugins.report import load, views

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = ["demo.sh", "cpu_contention.sh", "io_pressure.sh", "slow_network_ddp.sh"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_parse_and_document_themselves(name):
    path = ROOT / "examples" / name
    assert os.access(path, os.X_OK), f"{path} is not executable"
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    head = path.read_text().split("set -euo pipefail")[0]
    assert f"examples/{name}" in head and "Environment" in head or "Needs" in head


def test_scenario_refuses_an_existing_run_directory(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    r = subprocess.run([str(ROOT / "examples" / "cpu_contention.sh")], capture_output=True,
                       text=True, env={**os.environ, "OUT": str(out)}, timeout=30)
    assert r.returncode == 1 and f"{out} exists" in r.stderr
    r = subprocess.run([str(ROOT / "examples" / "io_pressure.sh")], capture_output=True,
                       text=True, env={**os.environ, "MODE": "disk"}, timeout=30)
    assert r.returncode == 2 and "MODE must be io or memory" in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("stress-ng") is None, reason="needs stress-ng")
def test_cpu_contention_scenario_end_to_end(tmp_path):
    """Training recorded, hogs injected mid-run, summary printed, report.json + HTML written,
    and the hogs really show in the run's telemetry (the run queue goes up)."""
    out = tmp_path / "cpu"
    env = {**os.environ, "OUT": str(out), "SECONDS_TOTAL": "24", "STRESS_AT": "8",
           "STRESS_FOR": "8", "MODEL": "mlp"}
    r = subprocess.run([str(ROOT / "examples" / "cpu_contention.sh")], capture_output=True,
                       text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # reveal record prints the summary on stderr (stdout is the training's)
    assert "train.py: done" in r.stdout
    assert "Reveal report" in r.stderr and "Utilization" in r.stderr
    assert "examples/train.py --model mlp --threads 1 --seconds 24" in r.stderr
    with open(SCHEMA_PATH) as f:
        jsonschema.validate(json.loads((out / "report.json").read_text()), json.load(f))
    html = (out / "report.html").read_text()
    assert "<svg" in html and "CPU busy" in html
    # the injected window is marked in the run's events (the HTML draws it as dotted lines)
    v = load.load_view(str(out))
    notes = [e for e in v.events if e["event"] == "note"]
    assert [n["message"].split(":")[0] for n in notes] == ["injected", "injected"]
    assert "injected: stress-ng --cpu" in html
    start, stop = notes[0]["t"], notes[1]["t"]
    runq = next(s for s in views.key_series(v.frame) if s.key == "cpu.runq")
    before = np.nanmean(runq.y[(runq.t > start - 6) & (runq.t < start)])
    during = np.nanmean(runq.y[(runq.t > start + 1) & (runq.t < stop)])
    assert during > before + 1.0, (before, during)
