"""The agent's sampling tick, driven by hand: what a probe returns is what its run stores, at
the probe's own rate; a probe that misbehaves (a site plugin's bug) costs its own channels,
never the row, the run or the live snapshot."""
import time

import numpy as np
import pytest

from reveal_plugins.hooks import get_plugin_manager, hookimpl
from reveal_plugins.probes.probe import Probe
from reveal_plugins.probes.procfs import TokenFileProbe
from reveal_plugins.store import store
from reveal_plugins.types import ChannelMeta, RunInfo


def _ch(name):
    return ChannelMeta(name, "count", "gauge", "test")


class Slow(Probe):
    """Read once a second by a 10 Hz agent; returns 1, 2, 3 ... on its reads."""
    name = "t.slow"
    interval_s = 1.0

    def open(self):
        self.n = 0
        self._ready([_ch("system.t.slow")])

    def sample(self):
        self.n += 1
        return [float(self.n)]


class WrongLength(Probe):
    name = "t.wrong"

    def open(self):
        self._ready([_ch("system.t.wrong_a"), _ch("system.t.wrong_b")])

    def sample(self):
        return [1.0, 2.0, 3.0]


class NotANumber(Probe):
    name = "t.odd"

    def open(self):
        self._ready([_ch("system.t.odd_a"), _ch("system.t.odd_b")])

    def sample(self):
        return ["not a number", 2.0]


class FileValue(TokenFileProbe):
    """``value N`` in a file the test rewrites between ticks."""
    name = "t.file"
    path = ""          # set by the fixture (absolute: PROC is ignored)

    def layout(self, toks):
        return [(1, "system.t.file")]

    def meta(self, key):
        return _ch(key)


class _Site:
    def __init__(self, file_path):
        self.file_path = file_path

    @hookimpl
    def reveal_register_probes(self, config):
        f = FileValue()
        f.path = self.file_path
        return [Slow(), WrongLength(), NotANumber(), f]


@pytest.fixture
def site_probes(tmp_path):
    path = str(tmp_path / "value")
    with open(path, "w") as f:
        f.write("value 0\n")
    pm = get_plugin_manager()
    pm.register(_Site(path), name="test-agent-tick")
    yield path
    pm.unregister(name="test-agent-tick")


def test_each_probe_costs_only_its_own_channels(tmp_path, site_probes):
    from reveal_plugins.agent.daemon import Agent
    a = Agent(str(tmp_path / "spool"), interval_s=0.1, segment_s=10.0)
    run_dir = str(tmp_path / "run")
    a.register(RunInfo(run_id="r", source="test", run_dir=run_dir))
    for _ in range(25):          # no sampling thread: the test ticks, 0.1 s apart as the agent
        a.sample_once()          # would (segments label samples in milliseconds)
        time.sleep(0.1)
    t_latest, latest = a.latest()
    a.unregister("r")

    names = ["system.t.slow", "system.t.wrong_a", "system.t.wrong_b", "system.t.odd_a",
             "system.t.odd_b", "cpu.all.user"]
    rows = []
    for path in store.segment_paths(run_dir):
        rows.append(store.read_segment(path, names)[1])
    v = np.vstack(rows)
    assert len(v) == 25
    slow = v[:, 0]
    # read on the run's first tick and then every 10th: the stored row has NaN in between
    # (readers interpolate), and the values are the probe's own, in order
    assert np.flatnonzero(np.isfinite(slow)).tolist() == [0, 10, 20], slow
    assert slow[np.isfinite(slow)].tolist() == [1.0, 2.0, 3.0]
    # the live snapshot holds the slow probe's last reading between its reads
    assert latest["system.t.slow"] == 3.0
    # three values for two channels: that probe is NaN, and said once in the run's events
    assert np.isnan(v[:, 1:3]).all()
    errors = [e for e in store.read_events(run_dir) if e.get("event") == "probe_error"]
    assert [e["probe"] for e in errors] == ["t.wrong"], errors
    assert "3 values for 2 channels" in errors[0]["error"]
    # a value that is not a number is NaN; the probe's other channel and the row are kept
    assert np.isnan(v[:, 3]).all()
    assert (v[:, 4] == 2.0).all()
    assert np.isnan(latest["system.t.odd_a"]) and latest["system.t.odd_b"] == 2.0
    assert np.isfinite(v[:, 5]).all()        # the built-in probes beside them


def _set(path, v):
    with open(path, "w") as f:
        f.write(f"value {v}\n")


def test_each_tick_stores_what_was_read_on_it(tmp_path, site_probes):
    """Readings are parsed a second after they are taken (a 10 Hz wake-up only reads): the
    row of each tick still holds what the file said at that tick, and whoever asks for the
    latest values (the live loop, /metrics) gets the last tick's, not a second-old one."""
    from reveal_plugins.agent.daemon import Agent
    a = Agent(str(tmp_path / "spool"), interval_s=0.1, segment_s=10.0)
    run_dir = str(tmp_path / "run")
    a.register(RunInfo(run_id="r", source="test", run_dir=run_dir))
    for k in range(1, 16):
        _set(site_probes, k)
        a.sample_once()
        if k == 4:
            assert a.latest()[1]["system.t.file"] == 4.0
        time.sleep(0.1)
    _set(site_probes, 99)        # never read: the run ends before another tick
    a.unregister("r")
    v = np.vstack([store.read_segment(p, ["system.t.file"])[1]
                   for p in store.segment_paths(run_dir)])
    assert v[:, 0].tolist() == [float(k) for k in range(1, 16)]
