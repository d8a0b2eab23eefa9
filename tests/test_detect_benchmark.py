"""The labeled benchmark's smoke version runs end to end (real training under ``reveal record``,
a one-core hog from the benchmark's own injectors on the idle core next to a pinned
single-threaded victim, a clean run) and produces scored results.  Slow (~2.5 min)."""
import json
import os
import shutil
import subprocess
import sys

import pytest


# records real telemetry: not while a benchmark or another such test records
pytestmark = pytest.mark.usefixtures("quiet_machine")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not shutil.which("stress-ng"), reason="stress-ng not installed")
def test_benchmark_smoke(tmp_path, report_schema_validate):
    pytest.importorskip("torch")
    out = str(tmp_path / "bench")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "detection", "run.py"),
                        "--smoke", "--out", out], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.load(open(os.path.join(out, "results.json")))
    for who in ("reveal", "reference_iforest", "reference_pca", "reference_kmeans"):
        assert res["dev"][who]["injections"] == 1
        assert {"recall", "precision_alarm_s", "f1", "false_events_per_clean_hour",
                "false_events_per_clean_hour_95ub", "confusion"} <= set(res["dev"][who])
    # the hog on an idle core moves no pressure signal: found through foreign load
    assert res["dev"]["reveal"]["detected"] == 1, r.stdout[-3000:]
    for name in ("smoke-single-hog1", "smoke-clean"):
        report_schema_validate(json.load(open(os.path.join(out, name, "report.bench.json"))))
        report_schema_validate(json.load(open(os.path.join(out, name, "report.json"))))
    assert "F1" in r.stdout and "iforest" in r.stdout and "kmeans" in r.stdout
