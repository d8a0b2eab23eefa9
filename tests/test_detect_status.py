"""A failed analysis never reads as a healthy run: ``status`` in report.json, the CLI's exit
code, the text report, the Slurm summary and the OTel root span all say so."""
import json
import os
import subprocess
import sys

import pytest

from reveal_plugins.analysis import analyze_and_publish
from reveal_plugins.detect import analyze
from reveal_plugins.detect.synth import SynthHost
from reveal_plugins.report.text import render_text
from reveal_plugins.slurm.sink import render_summary


def _run(d, seconds=90, anomalies=()):
    return SynthHost(2, seed=1, anomalies=list(anomalies)).write_run(d, seconds)


@pytest.fixture
def crashing(monkeypatch):
    import reveal_plugins.detect.pipeline as pl

    def boom(*a, **k):
        raise MemoryError("cannot allocate 70 GB")
    monkeypatch.setattr(pl, "detect", boom)


def test_healthy_run_is_ok(tmp_path, report_schema_validate):
    rep = report_schema_validate(analyze(_run(str(tmp_path / "r"))))
    assert rep["status"] == "ok" and rep["status_reason"] is None


def test_crashed_pipeline_is_failed_not_clean(tmp_path, crashing, report_schema_validate):
    d = _run(str(tmp_path / "r"))
    rep = report_schema_validate(analyze_and_publish(d, publish=False))
    assert rep["status"] == "failed"
    assert "MemoryError" in rep["status_reason"]
    on_disk = json.load(open(os.path.join(d, "report.json")))
    assert on_disk["status"] == "failed"
    text = render_text(rep, color=False)
    assert "Analysis failed" in text and "No anomalies" not in text
    assert "FAILED" in render_summary(rep)
    assert "No anomalies found" not in rep["summary"]


def test_crashing_plugin_gives_failed_report(tmp_path, monkeypatch, report_schema_validate):
    """A site's analysis plugin that raises: still a report, marked failed."""
    from reveal_plugins.hooks import manager

    d = _run(str(tmp_path / "r"))
    pm = manager.get_plugin_manager()

    class Broken:
        @staticmethod
        def reveal_analyze(run_dir, config):
            raise RuntimeError("site analyzer broke")
    from reveal_plugins.hooks import hookimpl
    Broken.reveal_analyze = hookimpl(tryfirst=True)(Broken.reveal_analyze)
    pm.register(Broken, name="broken-analyzer")
    try:
        rep = report_schema_validate(analyze_and_publish(d, publish=False))
    finally:
        pm.unregister(name="broken-analyzer")
    assert rep["status"] == "failed" and "site analyzer broke" in rep["status_reason"]


def test_unreadable_segment_is_partial(tmp_path, report_schema_validate):
    d = _run(str(tmp_path / "r"))
    segs = sorted(os.listdir(os.path.join(d, "segments")))
    with open(os.path.join(d, "segments", segs[len(segs) // 2]), "wb") as f:
        f.write(b"not parquet")
    rep = report_schema_validate(analyze(d))
    assert rep["status"] == "partial" and "unreadable" in rep["status_reason"]


def test_cli_exits_nonzero_on_failed_analysis(tmp_path):
    d = _run(str(tmp_path / "r"))
    code = ("import sys, reveal_plugins.detect.pipeline as pl\n"
            "def boom(*a, **k): raise RuntimeError('injected crash')\n"
            "pl.detect = boom\n"
            "from reveal_plugins.cli import main\n"
            f"sys.exit(main(['analyze', {d!r}, '--no-publish']))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert "FAILED" in p.stderr and "injected crash" in p.stderr
    assert "No anomalies" not in p.stdout
    ok = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "analyze", d,
                         "--no-publish"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_otel_root_span_error_on_failed_analysis(tmp_path, crashing):
    from opentelemetry.trace import StatusCode
    from reveal_plugins.otel.trace import build_spans

    d = _run(str(tmp_path / "r"))
    rep = analyze_and_publish(d, publish=False)
    spans = build_spans(rep, json.load(open(os.path.join(d, "meta.json"))))
    root = [s for s in spans if s.parent is None][0]
    assert root.status.status_code == StatusCode.ERROR
    assert "analysis failed" in root.status.description
