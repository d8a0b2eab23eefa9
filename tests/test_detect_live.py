"""Live mode: new findings only, within 10 s of onset, cheap per call, never raises."""
import time

import numpy as np

from reveal_plugins.detect.live.analyzer import LiveAnalyzer
from reveal_plugins.detect.synth import SynthHost


def _feed(h, duration, step_s=2.0, interval=0.1):
    t, v, ch = h.frame(duration, interval)
    la = LiveAnalyzer(ch, interval, {})
    found, worst = [], 0.0
    k = int(step_s / interval)
    for a in range(0, len(t), k):
        t0 = time.perf_counter()
        found += la.update(t[a:a + k], v[a:a + k])
        worst = max(worst, time.perf_counter() - t0)
    return found, worst


def test_onset_to_finding_within_10s_and_reported_once(report_schema_validate):
    for kind, sub in (("cpu", "cpu"), ("storage", "storage"), ("memory", "memory"),
                      ("network", "network")):
        h = SynthHost(2, seed=7, anomalies=[(kind, 80, 110)])
        found, worst = _feed(h, 150)
        assert len(found) == 1, (kind, found)
        a = found[0]
        assert a["subsystem"] == sub and a["live"] is True
        assert 0 <= a["detected_at"] - (h.t0 + 80) <= 10
        assert a["hints"] and a["evidence"]
        report_schema_validate({"schema": "reveal.report/1", "status": "ok",
                                "run": {"source": "local", "start": h.t0, "end": h.t0 + 150,
                                        "nodes": ["x"]},
                                "telemetry": {"interval_s": 0.1, "samples": 1, "channels": 1,
                                              "probes": []},
                                "anomalies": [a], "summary": ""})
        assert worst < 0.5


def test_clean_run_no_live_findings():
    for seed in range(2):
        assert _feed(SynthHost(2, seed=seed), 200)[0] == []


def test_second_anomaly_after_recovery_is_new():
    h = SynthHost(2, seed=8, anomalies=[("cpu", 60, 80), ("storage", 120, 140)])
    found, _ = _feed(h, 170)
    assert [a["subsystem"] for a in found] == ["cpu", "storage"]
    assert found[0]["id"] != found[1]["id"]


def test_bad_rows_do_not_raise():
    h = SynthHost(2)
    t, v, ch = h.frame(5, 0.1)
    la = LiveAnalyzer(ch, 0.1, None)
    assert la.update(t, v[:, :3]) == []          # wrong width: logged, no exception
    assert la.update(np.zeros(0), np.zeros((0, len(ch)))) == []
    v2 = v.copy()
    v2[:, 5] = np.nan
    assert la.update(t + 10, v2) == []


def test_another_subsystem_taking_over_is_a_new_finding():
    h = SynthHost(2, seed=9, anomalies=[("storage", 60, 80), ("network", 80, 100)])
    found, _ = _feed(h, 130)
    assert [a["subsystem"] for a in found] == ["storage", "network"]
    assert 0 <= found[1]["detected_at"] - (h.t0 + 80) <= 10


def test_the_runs_own_checkpoint_io_raises_no_live_finding():
    """The job-end rule live: the run's own writes queueing its device are its own phase;
    the same symptoms without them are a storage finding (the test above)."""
    assert _feed(SynthHost(2, seed=7, anomalies=[("ownio", 80, 110)]), 150)[0] == []


def test_a_shaped_link_is_a_live_network_finding():
    """The qdisc's floors are the live analyzer's too: a tbf holding packets back is found
    within 10 s as `network`, with the shaper's hint."""
    h = SynthHost(2, seed=7, anomalies=[("shaped", 80, 110)])
    found, _ = _feed(h, 150)
    assert [a["subsystem"] for a in found] == ["network"], found
    assert 0 <= found[0]["detected_at"] - (h.t0 + 80) <= 10
    assert found[0]["hints"][0]["rule"] == "network_shaped"
