"""Long runs: incremental features beside the segments, job-end analysis from them (plus the
raw tail) and ``--full`` from the raw segments give the same report; both find what the
in-memory pipeline finds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from reveal_plugins.detect import analyze
from reveal_plugins.detect.longrun.featstore import FeatureStore, read
from reveal_plugins.detect.longrun.featstore import FeatureWriter
from reveal_plugins.detect.synth import SynthHost
from reveal_plugins.store import store
from reveal_plugins.types import ChannelMeta

ANOMALIES = [("cpu", 150.0, 180.0), ("storage", 330.0, 350.0)]
STREAM = {"stream_after_s": 0}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("long") / "run")
    h = SynthHost(4, seed=3, extra_gauges=12, anomalies=ANOMALIES)
    h.write_run(d, 480.0, 0.1)
    return d, h.t0


def _metas(d):
    return [ChannelMeta.from_dict(c) for c in store.read_meta(d)["channels"]]


def _agent_features(d, upto_last=True):
    """What the agent leaves: every segment but the last featurized, as it was written."""
    fs = FeatureStore.for_run(d)
    fs.clear()
    fw = FeatureWriter(d, _metas(d), 0.1)
    paths = store.segment_paths(d)
    for p in paths[:-1] if upto_last else paths:
        fw(p)
    fw.close(timeout=60)
    assert fw.failed is None
    return fs


def _same_features(got: dict, want: dict) -> None:
    """Two sets of feature files (by name) hold the same windows and numbers, NaNs included."""
    assert got.keys() == want.keys()
    for k in want:
        assert np.array_equal(got[k].start, want[k].start)
        for s in want[k].stats:
            assert np.array_equal(got[k].stats[s], want[k].stats[s], equal_nan=True), (k, s)
        assert np.array_equal(got[k].colstats, want[k].colstats)


def _comparable(rep):
    rep = json.loads(json.dumps(rep, default=float))
    for k in ("seconds", "full"):
        rep["analysis"].pop(k, None)
    return rep


def _events(rep):
    return [(a["start"], a["end"], a["subsystem"]) for a in rep["anomalies"]]


def test_job_end_from_features_matches_full_recomputation(run):
    d, t0 = run
    fs = _agent_features(d)
    n = len(store.segment_paths(d))
    assert len(fs.files()) == n - 1          # the last segment is the raw tail
    job_end = analyze(d, STREAM)
    assert job_end["analysis"]["streamed"] and not job_end["analysis"]["full"]
    full = analyze(d, {**STREAM, "full": True})
    assert full["analysis"]["full"]
    assert _comparable(job_end) == _comparable(full)
    found = {(a["subsystem"], round(a["start"] - t0)) for a in job_end["anomalies"]}
    assert {s for s, _ in found} == {"cpu", "storage"}
    for kind, a, b in ANOMALIES:
        assert any(s == kind and a - 3 <= st <= a + 3 for s, st in found), found


def test_resumed_featurization_writes_the_same_features(run):
    """An agent restart (a fresh featurizer resuming from the files) changes no number."""
    d, _ = run
    paths = store.segment_paths(d)
    ref = FeatureStore.for_run(d, create=True)
    ref.clear()
    ref.update(d, _metas(d), 0.1, 3.0, 1.0)
    want = {os.path.basename(p): read(p) for _, _, p in ref.files()}
    ref.clear()
    first = FeatureStore.for_run(d)
    first.update(d, _metas(d), 0.1, 3.0, 1.0, upto=os.path.basename(paths[20]))
    FeatureStore.for_run(d).update(d, _metas(d), 0.1, 3.0, 1.0)   # the restarted agent
    got = {os.path.basename(p): read(p) for _, _, p in ref.files()}
    _same_features(got, want)


def test_streamed_analysis_finds_what_the_in_memory_one_finds(run):
    """On a run short enough to be fitted on all its windows the streamed path reports the
    same anomalies (times, subsystems) with scores within 1 % (float32 statistics); fitted on a
    sample of a third of the windows, the same events within a window's length."""
    d, _ = run
    _agent_features(d)
    mem = analyze(d)
    assert not mem["analysis"].get("streamed")
    st = analyze(d, STREAM)
    assert _events(st) == _events(mem) and len(_events(mem)) == 2
    for a, b in zip(st["anomalies"], mem["anomalies"]):
        assert a["score"] == pytest.approx(b["score"], rel=0.01)
        assert [e["channel"] for e in a["evidence"][:3]] == \
            [e["channel"] for e in b["evidence"][:3]]
    sub = analyze(d, {**STREAM, "fit_windows": 150})
    assert sub["analysis"]["fit_windows"] <= 160
    assert len(sub["anomalies"]) == 2
    for (a0, a1, s), (b0, b1, t) in zip(_events(sub), _events(mem)):
        assert s == t and abs(a0 - b0) <= 3 and abs(a1 - b1) <= 3


def test_cli_full_rebuilds_the_feature_store(run):
    d, _ = run
    fs = _agent_features(d)
    victim = fs.files()[3][2]
    with open(victim, "wb") as f:            # a damaged feature file: --full does not read it
        f.write(b"garbage")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "analyze", d, "--full",
                        "--json", "--no-publish"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["status"] == "ok"
    assert len(rep["anomalies"]) == 2
    assert read(victim).start.size >= 0      # rewritten, readable again


def test_short_run_and_bad_input_give_a_note_not_a_traceback(tmp_path):
    d = str(tmp_path / "short")
    SynthHost(2, seed=1).write_run(d, 5.0, 0.1)
    rep = analyze(d, STREAM)
    assert rep["status"] == "not_analysed", rep["status"]      # never a healthy verdict
    assert any("too short" in n or "nothing to analyse" in n for n in rep["notes"])
    seg = store.segment_paths(d)[0]
    with open(seg, "wb") as f:
        f.write(b"not parquet")
    rep = analyze(d, {**STREAM, "full": True})
    # its only segment unreadable: nothing was analysed, and the reason names the file
    assert rep["status"] == "not_analysed" and seg in rep["status_reason"], rep["status_reason"]
    assert any(seg in n for n in rep["notes"])


def test_agent_featurizes_segments_while_the_run_goes_on(tmp_path):
    """A real agent (reveal record): feature files appear beside the segments during the run,
    and the job-end analysis from them equals --full."""
    d = str(tmp_path / "rec")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    p = subprocess.Popen([sys.executable, "-m", "reveal_plugins.cli", "record", "--out", d,
                          "--", "sleep", "24"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    seen_during = 0
    while p.poll() is None:
        if os.path.isdir(os.path.join(d, "features")) and not os.path.exists(
                os.path.join(d, "report.json")):
            seen_during = max(seen_during, len(FeatureStore.for_run(d).files()))
        time.sleep(0.5)
    assert p.returncode == 0, p.stderr.read()
    assert seen_during >= 1                  # written by the agent, not by the analysis
    job_end = analyze(d, STREAM)
    full = analyze(d, {**STREAM, "full": True})
    assert _comparable(job_end) == _comparable(full)


def test_gpu_link_below_max_is_found_when_streamed(tmp_path):
    """The invariant findings (judged on window means when streamed) still see a busy GPU
    whose PCIe link runs below its maximum generation."""
    from reveal_plugins.store.store import SegmentWriter, write_meta
    h = SynthHost(2, seed=2)
    gpu = [ChannelMeta("gpu.0.util_sm", "%", "gauge", "nvml"),
           ChannelMeta("gpu.0.pcie_link_gen", "gen", "gauge", "nvml"),
           ChannelMeta("gpu.0.pcie_link_gen_max", "gen", "gauge", "nvml")]
    d = str(tmp_path / "gpu")
    os.makedirs(d)
    w = SegmentWriter(d, h.channels + gpu, sync=False)
    t = h.t0 + np.arange(1200) * 0.1
    V = h.chunk(t)
    rng = np.random.default_rng(0)
    for i in range(len(t)):
        w.add(float(t[i]), np.concatenate([V[i], [90 + rng.random(), 3.0, 4.0]]))
    w.flush()
    write_meta(d, {"schema": "reveal.run/1", "host": "synth", "interval_s": 0.1,
                   "run": {"run_id": "gpu", "run_dir": d, "source": "local", "host": "synth"},
                   "channels": [c.to_dict() for c in h.channels + gpu], "probes": [],
                   "start": float(t[0]), "end": float(t[-1]), "steps": []})
    for cfg in ({}, STREAM):
        rep = analyze(d, cfg)
        inv = [a for a in rep["anomalies"] if a.get("invariant")]
        assert inv and inv[0]["subsystem"] == "gpu", (cfg, rep["anomalies"])
        assert "PCIe link gen 3 < max 4" in inv[0]["invariant"]


def test_incremental_features_can_be_turned_off(tmp_path, monkeypatch):
    from reveal_plugins.detect.longrun.featstore import feature_writer
    monkeypatch.setenv("REVEAL_FEATURES", "0")
    assert feature_writer(str(tmp_path), [], 0.1) is None
    monkeypatch.delenv("REVEAL_FEATURES")
    assert feature_writer(str(tmp_path), [], 0.1, {"features": False}) is None
    fw = feature_writer(str(tmp_path), [], 0.1)
    assert fw is not None
    fw.close()


def test_feature_files_are_compact_exact_and_the_old_format_still_reads(run, tmp_path):
    """Issue 21, cost of watching: a 10-s feature file carried its names and per-channel sums
    twice (in the Arrow schema copy too) -- four fifths of its bytes.  The sums are now written
    once, deflated, the names once a run beside the files; the numbers read back bit for bit,
    and a run featurized by the previous release (``reveal.features/1``) is still read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reveal_plugins.detect.longrun import featstore
    d, _ = run
    fs = FeatureStore.for_run(d, create=True)
    fs.clear()
    fs.update(d, _metas(d), 0.1, 3.0, 1.0)
    _, _, path = fs.files()[3]                       # one single-segment (10 s) file
    meta = pq.read_metadata(path)
    ch, names = read(path), featstore.read_names(path)
    assert meta.metadata[b"reveal"] == b"reveal.features/2"
    assert b"ARROW:schema" not in meta.metadata and b"names" not in meta.metadata
    sidecars = [n for n in os.listdir(fs.path) if n.startswith("names-")]
    assert sidecars == [f"names-{meta.metadata[b'names_sha'].decode()}.json.z"]  # once a run

    # the same chunk as the previous release wrote it: metadata plain, in the schema
    c, cf = len(names), ch.stats["std"].shape[1]
    cols = [pa.array(ch.start), pa.array(ch.count.astype(np.int32)), pa.array(ch.valid)]
    cols += [pa.FixedSizeListArray.from_arrays(
        pa.array(np.ascontiguousarray(ch.stats[s], np.float32).reshape(-1)),
        c if s == "mean" else cf) for s in featstore.STATS]
    old_md = dict(meta.metadata)
    old_md.update({b"reveal": b"reveal.features/1", b"names": json.dumps(names).encode(),
                   b"colstats": ch.colstats.tobytes()})
    old = str(tmp_path / os.path.basename(path))
    pq.write_table(pa.Table.from_arrays(
        cols, names=["start", "count", "valid", *featstore.STATS]).replace_schema_metadata(
        old_md), old, compression="zstd", compression_level=1, write_statistics=False)
    assert os.path.getsize(path) < 0.6 * os.path.getsize(old), (os.path.getsize(path),
                                                                os.path.getsize(old))
    back = read(old)
    assert featstore.read_names(old) == names
    assert featstore.read_info(old) == featstore.read_info(path)
    for s in ch.stats:
        assert np.array_equal(back.stats[s], ch.stats[s], equal_nan=True), s
    assert np.array_equal(back.colstats, ch.colstats) and np.array_equal(back.start, ch.start)

    # the names file gone (or swapped for a symlink): the file is unreadable, not misread
    side = os.path.join(fs.path, sidecars[0])
    os.rename(side, side + ".away")
    os.symlink(side + ".away", side)
    with pytest.raises(featstore.FeatureFileError, match="names"):
        read(path)
    os.unlink(side)
    with pytest.raises(featstore.FeatureFileError, match="missing"):
        read(path)
    os.rename(side + ".away", side)

    fs.clear()            # --full through the same store: the names file is written again
    fs.update(d, _metas(d), 0.1, 3.0, 1.0)
    assert featstore.read_names(fs.files()[0][2]) == names


def test_the_agent_featurizes_the_rows_it_wrote_without_reading_them_back(tmp_path,
                                                                           monkeypatch):
    """The segment writer hands each segment's rows to the featurizer with its path: the
    feature files are those of the segments read back from disk (NaNs and held values
    included), and no segment is read to make them."""
    from reveal_plugins.detect.longrun import featstore

    h = SynthHost(2, seed=6, anomalies=[("cpu", 40, 60)])
    t, v, ch = h.frame(95, 0.1)
    v[100:130, 3] = np.nan                  # a probe that failed for 3 s
    v[::10, 5] = np.nan                     # a slow channel read once a second
    d = str(tmp_path / "run")
    os.makedirs(d)
    w = store.SegmentWriter(d, ch, 10.0)
    fw = FeatureWriter(d, ch, 0.1)
    w.on_segment = fw
    real_read = featstore.store.read_segment
    reads = []
    monkeypatch.setattr(featstore.store, "read_segment",
                        lambda *a: reads.append(a[0]) or real_read(*a))
    for i in range(len(t)):
        w.add(float(t[i]), v[i])
    w.flush()
    fw.close(timeout=60)                    # (SegmentWriter.close waits 2 s at most)
    assert fw.failed is None and reads == []
    got = {os.path.basename(p): read(p) for _, _, p in FeatureStore.for_run(d).files()}
    assert len(got) == len(store.segment_paths(d)) == 10

    monkeypatch.undo()
    ref = FeatureStore.for_run(d)
    ref.clear()
    ref.update(d, ch, 0.1, 3.0, 1.0)        # the same segments, read from disk
    want = {os.path.basename(p): read(p) for _, _, p in ref.files()}
    _same_features(got, want)
