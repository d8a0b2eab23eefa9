"""Bad input never gives a traceback: a valid report with a note, or a clear error."""
import json
import os

import numpy as np
import pytest

from reveal_plugins.detect import analyze
from reveal_plugins.detect.synth import SynthHost
from reveal_plugins.store.store import SegmentWriter, StoreError, write_meta
from reveal_plugins.types import ChannelMeta


def _meta(channels, **kw):
    m = {"schema": "reveal.run/1", "host": "h1", "interval_s": 0.1,
         "run": {"run_id": "r", "run_dir": "x", "source": "local"},
         "channels": [c.to_dict() for c in channels], "probes": [], "steps": []}
    m.update(kw)
    return m


def _write(d, channels, t, values):
    os.makedirs(d, exist_ok=True)
    w = SegmentWriter(d, channels)
    for ti, row in zip(t, values):
        w.add(float(ti), np.asarray(row, float))
    w.flush()
    write_meta(d, _meta(channels))
    return d


CH = [ChannelMeta("cpu.all.user", "ticks", "counter", "t"),
      ChannelMeta("cpu.procs_running", "tasks", "gauge", "t")]


def test_empty_run(tmp_path, report_schema_validate):
    d = str(tmp_path / "empty")
    os.makedirs(d)
    write_meta(d, _meta(CH))
    rep = report_schema_validate(analyze(d))
    assert rep["anomalies"] == [] and any("no telemetry samples" in n for n in rep["notes"])
    assert rep["telemetry"]["samples"] == 0


def test_one_sample(tmp_path, report_schema_validate):
    d = _write(str(tmp_path / "one"), CH, [1.7e9], [[5, 2]])
    rep = report_schema_validate(analyze(d))
    assert any("only 1 sample" in n for n in rep["notes"])


def test_all_constant(tmp_path, report_schema_validate):
    t = 1.7e9 + np.arange(600) * 0.1
    d = _write(str(tmp_path / "const"), CH, t, np.tile([[100, 3]], (600, 1)))
    rep = report_schema_validate(analyze(d))
    assert rep["anomalies"] == []
    assert any("constant" in n for n in rep["notes"])


def test_nans_and_missing_segment_and_corrupt_segment(tmp_path, report_schema_validate):
    h = SynthHost(2, seed=0, anomalies=[("cpu", 60, 80)])
    d = str(tmp_path / "r")
    h.write_run(d, 120, 0.1)
    segs = sorted(os.listdir(os.path.join(d, "segments")))
    os.unlink(os.path.join(d, "segments", segs[3]))             # a lost segment (gap)
    with open(os.path.join(d, "segments", segs[9]), "wb") as f:   # a corrupt one
        f.write(b"PAR1 garbage")
    with open(os.path.join(d, "segments", ".seg-999999.parquet.tmp"), "wb") as f:
        f.write(b"half")
    rep = report_schema_validate(analyze(d))
    notes = " ".join(rep["notes"])
    assert "unreadable segment" in notes and "gap" in notes and "unfinished" in notes
    assert [a["subsystem"] for a in rep["anomalies"]] == ["cpu"]


def test_clock_jump(tmp_path, report_schema_validate):
    h = SynthHost(2, seed=0)
    t, v, ch = h.frame(120, 0.1)
    t = t.copy()
    t[600:] += 3600.0          # the wall clock jumped an hour forward mid-run
    t[900:905] = t[899]        # and a few repeated timestamps
    d = _write(str(tmp_path / "jump"), ch, t, v)
    rep = report_schema_validate(analyze(d))
    notes = " ".join(rep["notes"])
    assert "gap" in notes and "repeated timestamp" in notes
    assert rep["anomalies"] == []


def test_not_a_run_directory(tmp_path):
    with pytest.raises(StoreError, match="meta.json missing"):
        analyze(str(tmp_path))
    (tmp_path / "meta.json").write_text("{bad json")
    with pytest.raises(StoreError, match="line 1"):
        analyze(str(tmp_path))


def test_events_file_with_garbage(synth_run, report_schema_validate):
    d = synth_run("ev", 60)
    with open(os.path.join(d, "events.jsonl"), "w") as f:
        f.write('{"t": 1700000001, "event": "step_start", "step_id": "0"}\nnot json\n')
    rep = report_schema_validate(analyze(d))
    assert any("events.jsonl:2" in n for n in rep["notes"])


def test_huge_clock_jump_costs_nothing(tmp_path, report_schema_validate):
    h = SynthHost(2, seed=0)
    t, v, ch = h.frame(60, 0.1)
    t = t.copy()
    t[300:] += 10 * 365 * 86400.0   # ten years
    d = _write(str(tmp_path / "jump10y"), ch, t, v)
    rep = report_schema_validate(analyze(d))
    assert rep["analysis"]["windows"] < 100
