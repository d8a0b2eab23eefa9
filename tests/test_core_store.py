"""The run-directory store: change-log segments round-trip, crash leftovers are tolerated."""
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from reveal_plugins.store import store
from reveal_plugins.types import ChannelMeta

CH = [ChannelMeta("cpu.all.user", "ticks", "counter", "t"),
      ChannelMeta("memory.MemFree", "kB", "gauge", "t"),
      ChannelMeta("network.eth0.rx_bytes", "bytes", "counter", "t")]


def _write(d, n=35, segment_s=1.0, seed=0):
    rng = np.random.default_rng(seed)
    w = store.SegmentWriter(str(d), CH, segment_s=segment_s)
    rows = []
    for i in range(n):
        row = np.array([i * 7, 1000 + (rng.integers(3) if i % 4 else 0), 5.0])
        if i == 12:
            row[1] = np.nan
        rows.append(row)
        w.add(1_700_000_000 + i * 0.1, row)
    w.flush()
    store.write_meta(str(d), {"channels": [c.to_dict() for c in CH],
                              "run": {"run_id": "x", "run_dir": str(d)}})
    return np.vstack(rows), w


def test_roundtrip_is_exact_including_missing_values(tmp_path):
    rows, w = _write(tmp_path)
    r = store.load_run(str(tmp_path))
    assert r.frame.values.shape == (35, 3)
    assert np.allclose(r.frame.values, rows, equal_nan=True)
    assert np.allclose(r.frame.t, 1_700_000_000 + np.arange(35) * 0.1)
    assert r.segments == 4 and r.warnings == []


def test_segments_reach_parquet_in_memory_that_arrow_owns(tmp_path, monkeypatch):
    """CI saw `reveal analyze` abort at exit ("terminate called without an active exception",
    rc -6) after a correct report: an Arrow worker thread dropped the last reference to a
    segment's pages while the interpreter finalized, and the pages wrapped a Python file
    object's bytes, whose release needs the GIL (apache/arrow#34314).  Segments are read
    into Arrow's own memory, with the open file never handed to Arrow; the rows are the
    same."""
    import pyarrow as pa
    from reveal_plugins.store import finalize
    rows, _ = _write(tmp_path)
    sources, buffers = [], []
    real_pf, real_br, real_rt = pq.ParquetFile, pa.BufferReader, pq.read_table
    monkeypatch.setattr(store.pq, "ParquetFile",
                        lambda src, *a, **k: sources.append(src) or real_pf(src, *a, **k))
    monkeypatch.setattr(finalize.pq, "read_table",
                        lambda src, *a, **k: sources.append(src) or real_rt(src, *a, **k))
    monkeypatch.setattr(store.pa, "BufferReader",
                        lambda buf: buffers.append(buf) or real_br(buf))
    r = store.load_run(str(tmp_path))
    assert np.allclose(r.frame.values, rows, equal_nan=True)
    assert finalize.last_sample_time(str(tmp_path)) == pytest.approx(1_700_000_003.4)
    assert len(sources) == r.segments + 1 and len(buffers) == len(sources)
    assert all(isinstance(s, pa.NativeFile) and not isinstance(s, pa.PythonFile)
               for s in sources), sources
    # allocated by Arrow (a bytes object would be wrapped read-only)
    assert all(b.is_mutable and b.size > 0 for b in buffers)


def test_segments_are_plain_parquet_with_channel_names(tmp_path):
    _write(tmp_path)
    t = pq.read_table(store.segment_paths(str(tmp_path))[0]).to_pydict()
    assert set(t) == {"channel", "t_ms", "value"}
    assert {"__sample__", "cpu.all.user", "memory.MemFree"} <= set(t["channel"])


def test_unchanged_values_cost_nothing(tmp_path):
    """A constant channel is stored once per segment, not once per sample."""
    _, w = _write(tmp_path, n=100, segment_s=100)
    t = pq.read_table(store.segment_paths(str(tmp_path))[0]).to_pydict()
    assert t["channel"].count("network.eth0.rx_bytes") == 1
    assert t["channel"].count("cpu.all.user") == 100


def test_crash_leftovers_are_skipped_with_a_warning(tmp_path):
    _write(tmp_path)
    seg = os.path.join(tmp_path, "segments")
    with open(os.path.join(seg, ".seg-000009.parquet.tmp"), "wb") as f:
        f.write(b"PAR1 truncated")
    paths = store.segment_paths(str(tmp_path))
    lost = len(store.read_segment(paths[1], ["cpu.all.user"])[0])
    with open(paths[1], "r+b") as f:  # corrupt one finished segment
        f.truncate(40)
    r = store.load_run(str(tmp_path))
    assert r.segments == 3
    assert len(r.frame.t) == 35 - lost
    assert any("unfinished segment" in w for w in r.warnings)
    assert any("seg-000002.parquet: skipped unreadable segment" in w for w in r.warnings)


def test_missing_or_invalid_meta_names_the_file(tmp_path):
    with pytest.raises(store.StoreError, match="meta.json missing"):
        store.load_run(str(tmp_path))
    (tmp_path / "meta.json").write_text("{\n  bad")
    with pytest.raises(store.StoreError, match=r"meta.json: invalid JSON at line 2"):
        store.load_run(str(tmp_path))


def test_invalid_event_lines_are_reported_and_others_kept(tmp_path):
    _write(tmp_path)
    store.append_event(str(tmp_path), "step_start", 1.0, step_id="0")
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write("{not json\n")
    store.append_event(str(tmp_path), "step_end", 2.0, step_id="0")
    r = store.load_run(str(tmp_path))
    assert [e["event"] for e in r.events] == ["step_start", "step_end"]
    assert any("events.jsonl:2" in w for w in r.warnings)


def _fill_one_column_at_a_time(t, values, chans, interval_s, tail=True):
    """The oracle: one ``np.interp`` per slow column (what fill_slow_channels did before it
    shared the search between a probe's columns)."""
    for j, c in enumerate(chans):
        every = c.sample_every_s
        if not every or every <= interval_s * 1.5:
            continue
        col = values[:, j]
        ok = ~np.isnan(col)
        if not ok.any() or ok.all():
            continue
        tk, vk = t[ok], col[ok]
        filled = np.interp(t, tk, vk)
        pos = np.searchsorted(tk, t, side="right")
        prev_t = tk[np.clip(pos - 1, 0, len(tk) - 1)]
        next_t = tk[np.clip(pos, 0, len(tk) - 1)]
        interior = (pos > 0) & (pos < len(tk)) & (next_t - prev_t <= 2.5 * every)
        after = (pos == len(tk)) & (t - tk[-1] <= 1.5 * every) if tail else False
        col[~ok & (interior | after)] = filled[~ok & (interior | after)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("tail", [True, False])
def test_slow_channels_are_filled_exactly_like_np_interp(seed, tail):
    """Probes read every 1 s and 0.5 s among 10 Hz ones, with lost reads (a probe error, a
    gap of several seconds), a column never read and one read every time: the grouped
    interpolation gives np.interp's values to the bit, and leaves the same NaN."""
    rng = np.random.default_rng(seed)
    n = 400
    t = 1.7e9 + np.cumsum(rng.uniform(0.09, 0.11, n))
    t[rng.integers(50, n - 50):] += 4.0  # the agent was suspended: a real gap
    chans, cols = [], []
    for name, every, width in (("fast", None, 3), ("slow1", 1.0, 5), ("slow05", 0.5, 4),
                               ("slow1b", 1.0, 2)):
        read = np.ones(n, bool) if every is None else (np.arange(n) % round(every / 0.1) == 0)
        if name == "slow1b":
            read &= rng.random(n) > 0.3  # the same period, other reads: its own group
        for k in range(width):
            chans.append(ChannelMeta(f"cpu.{name}.{k}", "", "counter", "test", sample_every_s=every))
            col = np.cumsum(rng.exponential(5.0, n)) * (k + 1)
            col[~read] = np.nan
            cols.append(col)
    cols[5][:] = np.nan                      # never read
    cols[6] = np.where(np.isnan(cols[6]), 3.0, cols[6])   # read every tick although slow
    v = np.column_stack(cols)
    v[rng.integers(0, n, 8), 3:8] = np.nan  # lost reads of the 1 s probe
    want, got = v.copy(), v.copy()
    _fill_one_column_at_a_time(t, want, chans, 0.1, tail)
    store.fill_slow_channels(t, got, chans, 0.1, tail)
    assert np.array_equal(want, got, equal_nan=True)
    assert np.isnan(got[:, 5]).all()
    assert np.isnan(got).sum() < np.isnan(v).sum()  # something was filled
