"""Issue 26, item 1: a run that was not analysed is never reported healthy.  Too short, no
samples, every segment unreadable -> ``status: not_analysed`` with the reason, its own
headline (never a ✓), and ``reveal analyze`` exits 1; a site detector that raises when it is
the only one -> ``failed``."""
import glob
import json
import os
import subprocess
import sys

import pytest

from reveal_plugins.detect.synth import SynthHost

CLI = [sys.executable, "-m", "reveal_plugins.cli"]


def _analyze(run, *extra):
    return subprocess.run(CLI + ["analyze", str(run), "--no-publish", *extra],
                          capture_output=True, text=True, timeout=120)


def test_a_run_too_short_to_judge_is_not_analysed(tmp_path, report_schema_validate):
    r = subprocess.run(CLI + ["record", "--out", str(tmp_path / "r"), "--", "sleep", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "✓" not in out and "No anomalies" not in out, out
    assert "Not analysed" in out and "too short" in out, out
    rep = report_schema_validate(json.load(open(tmp_path / "r" / "report.json")))
    assert rep["status"] == "not_analysed" and "too short" in rep["status_reason"]
    a = _analyze(tmp_path / "r")
    assert a.returncode == 1, (a.stdout, a.stderr)
    assert "NOT ANALYSED" in a.stderr and "checked" not in a.stdout, a.stdout


def test_unreadable_telemetry_says_unreadable_and_names_the_file(tmp_path,
                                                               report_schema_validate):
    run = SynthHost(2, seed=1).write_run(str(tmp_path / "r"), 40)
    segs = sorted(glob.glob(os.path.join(run, "segments", "*")))
    assert segs
    for p in segs:
        with open(p, "wb") as f:
            f.write(b"not parquet at all")
    a = _analyze(run)
    assert a.returncode == 1, (a.stdout, a.stderr)
    rep = report_schema_validate(json.load(open(os.path.join(run, "report.json"))))
    assert rep["status"] == "not_analysed", rep["status_reason"]
    assert "unreadable" in rep["status_reason"] and os.path.basename(segs[0]) in \
        rep["status_reason"], rep["status_reason"]
    assert "No telemetry was recorded" not in a.stdout and "Telemetry unreadable" in a.stdout


class _Broken:
    name = "broken"

    def fit(self, X):
        raise RuntimeError("site detector broke")

    def score_samples(self, X):
        raise RuntimeError("site detector broke")


@pytest.mark.parametrize("builtins", [True, False])
def test_a_failing_site_detector_is_never_a_healthy_verdict(tmp_path, report_schema_validate,
                                                           capsys, monkeypatch, builtins):
    """Next to the built-in detectors: ``partial``, and the headline says only the part that
    ran found nothing.  As the only detector (no built-in one): nothing
    was judged, ``failed``, exit 1."""
    from reveal_plugins.commands.detect import analyze_main
    from reveal_plugins.hooks import hookimpl
    from reveal_plugins.hooks.manager import get_plugin_manager, reset_plugin_manager

    run = SynthHost(2, seed=2).write_run(str(tmp_path / "r"), 60)
    if not builtins:     # the site's detector is the only one
        monkeypatch.setattr("reveal_plugins.detect.batch.detectors.builtin_detectors",
                            lambda config: [])

    class Site:
        @hookimpl
        def reveal_detectors(self, config):
            return [_Broken()]
    reset_plugin_manager()
    get_plugin_manager().register(Site(), name="site-broken")
    try:
        rc = analyze_main([run, "--no-publish"])
    finally:
        reset_plugin_manager()
    out = capsys.readouterr().out
    rep = report_schema_validate(json.load(open(os.path.join(run, "report.json"))))
    assert any("'broken' failed" in n for n in rep["notes"]), rep["notes"]
    assert "behaved consistently" not in out and "✓" not in out, out
    if builtins:
        assert rep["status"] == "partial" and rc == 0, rep["status"]
        assert "part of the analysis that ran" in out, out
    else:
        assert rep["status"] == "failed" and "no detector ran" in rep["status_reason"], rep
        assert rc == 1
