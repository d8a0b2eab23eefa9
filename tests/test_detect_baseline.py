"""Baselines: a run abnormal from start to end is flagged against healthy runs of its kind."""
import json
import os
import subprocess
import sys

from reveal_plugins.detect import analyze
from reveal_plugins.detect.batch.baseline import BaselineError, fit_baseline, load, save

import pytest


def test_persistent_misconfiguration_needs_a_baseline(synth_run, tmp_path,
                                                      report_schema_validate):
    healthy = [synth_run(f"h{i}", 90, seed=i) for i in range(2)]
    bad = synth_run("bad", 90, [("cpu", 0, 1000)], seed=5)   # contended from start to end
    ok = synth_run("ok", 90, seed=9)
    assert analyze(bad)["anomalies"] == []                    # self-reference cannot see it
    path = str(tmp_path / "b.json")
    save(fit_baseline(healthy, name="mlp"), path)
    rep = report_schema_validate(analyze(bad, baseline=path))
    assert len(rep["anomalies"]) == 1
    a = rep["anomalies"][0]
    assert a["subsystem"] == "cpu" and a.get("baseline") is True
    assert a["end"] - a["start"] > 60
    assert any("CPU contention" in h["title"] for h in a["hints"])
    assert analyze(ok, baseline=path)["anomalies"] == []


def test_baseline_cli_and_errors(synth_run, tmp_path):
    runs = [synth_run(f"c{i}", 60, seed=i) for i in range(2)]
    out = str(tmp_path / "base.json")
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "baseline", "fit", *runs,
                        "--out", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "baseline written" in r.stdout
    b = load(out)
    assert len(b["runs"]) == 2 and b["channels"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "reveal.baseline/1",
                               "channels": [{"name": "cpu.x", "center": 1, "scale": 0}]}))
    with pytest.raises(BaselineError, match=r"channels\[0\].*scale"):
        load(str(bad))
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "analyze", runs[0],
                        "--baseline", str(bad), "--no-publish"], capture_output=True, text=True)
    assert r.returncode == 1 and "scale" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "baseline", "fit",
                        str(tmp_path / "nope"), "--out", out], capture_output=True, text=True)
    assert r.returncode == 1 and "meta.json" in r.stderr
