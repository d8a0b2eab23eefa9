"""``reveal analyze``: writes report.json, prints the one-screen summary, clear errors."""
import json
import os
import subprocess
import sys


def reveal(*args):
    return subprocess.run([sys.executable, "-m", "reveal_plugins.cli", *args],
                          capture_output=True, text=True, timeout=120)


def test_analyze_writes_report_and_prints_summary(synth_run, report_schema_validate):
    d = synth_run("cli", 90, [("storage", 40, 60)])
    r = reveal("analyze", d)
    assert r.returncode == 0, r.stderr
    rep = report_schema_validate(json.load(open(os.path.join(d, "report.json"))))
    assert [a["subsystem"] for a in rep["anomalies"]] == ["storage"]
    out = r.stdout.lower()
    assert "storage" in out and "iostat" in out   # finding -> what to do


def test_analyze_json_and_window_options(synth_run):
    d = synth_run("cli2", 90, [("cpu", 40, 60)])
    r = reveal("analyze", d, "--json", "--window", "4", "--stride", "2", "--no-publish")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["analysis"]["window_s"] == 4 and rep["analysis"]["stride_s"] == 2
    assert [a["subsystem"] for a in rep["anomalies"]] == ["cpu"]


def test_analyze_errors_are_clear(tmp_path):
    r = reveal("analyze", str(tmp_path))
    assert r.returncode == 1 and "meta.json" in r.stderr and "Traceback" not in r.stderr
    r = reveal("analyze", str(tmp_path), "--stride", "0")
    assert r.returncode == 2 and "must be > 0" in r.stderr
    r = reveal("analyze", str(tmp_path), "--baseline", str(tmp_path / "missing.json"))
    assert r.returncode == 1 and "baseline file not found" in r.stderr
