"""Detection on synthetic telemetry: each injected kind is found, attributed and given a hint;
a clean run yields nothing; the report validates against the shared schema."""
import numpy as np
import pytest

from reveal_plugins.detect import analyze
from reveal_plugins.detect.pipeline import detect
from reveal_plugins.detect.synth import SynthHost

EXPECT = {"cpu": ("cpu", "CPU contention"), "memory": ("memory", "Memory pressure"),
          "storage": ("storage", "Storage stall"), "network": ("network", "Network"),
          "steal": ("cpu", "CPU steal")}


@pytest.mark.parametrize("kind", sorted(EXPECT))
def test_injected_anomaly_found_attributed_and_hinted(kind):
    h = SynthHost(2, seed=3, anomalies=[(kind, 70, 95)])
    t, v, ch = h.frame(160, 0.1)
    det = detect(t, v, ch)
    assert len(det.anomalies) == 1, det.anomalies
    a = det.anomalies[0]
    sub, title = EXPECT[kind]
    assert a["subsystem"] == sub
    assert abs(a["start"] - (h.t0 + 70)) <= 3 and abs(a["end"] - (h.t0 + 95)) <= 3
    assert a["evidence"][0]["deviation"] != 0
    assert any(title in x["title"] for x in a["hints"]), [x["title"] for x in a["hints"]]
    assert all(x["action"] for x in a["hints"])


def test_clean_run_has_no_findings():
    for seed in range(3):
        t, v, ch = SynthHost(2, seed=seed).frame(300, 0.1)
        assert detect(t, v, ch).anomalies == []


def test_two_anomalies_are_separate_events():
    h = SynthHost(2, seed=1, anomalies=[("cpu", 40, 60), ("storage", 100, 120)])
    t, v, ch = h.frame(160, 0.1)
    subs = [a["subsystem"] for a in detect(t, v, ch).anomalies]
    assert subs == ["cpu", "storage"]


def test_report_from_run_dir_is_valid(synth_run, report_schema_validate):
    d = synth_run("r", 120, [("memory", 50, 70)],
                  meta_extra={"run": {"run_id": "r", "run_dir": "x", "source": "slurm",
                                      "job_id": "42", "step_id": "0", "user": "ann",
                                      "command": "python train.py"},
                              "steps": [{"step_id": "0", "start": 1.7e9, "end": None}]})
    rep = report_schema_validate(analyze(d))
    assert rep["run"]["job_id"] == "42" and rep["run"]["source"] == "slurm"
    assert rep["telemetry"]["samples"] == 1200 and rep["telemetry"]["bytes_stored"] > 0
    assert [a["subsystem"] for a in rep["anomalies"]] == ["memory"]
    assert rep["anomalies"][0]["step_id"] == "0"
    assert "Memory pressure" in rep["summary"] and "evidence" in rep["summary"]


def test_iteration_markers_give_impact():
    h = SynthHost(2, seed=4, anomalies=[("cpu", 60, 80)])
    t, v, ch = h.frame(120, 0.1)
    ev = [{"t": float(x), "event": "iteration", "rank": 0, "step": i,
           "dt": 0.26 if h.t0 + 60 <= x < h.t0 + 80 else 0.2}
          for i, x in enumerate(np.arange(h.t0 + 1, h.t0 + 119, 0.25))]
    a = detect(t, v, ch, events=ev).anomalies[0]
    # time spent / iterations done over the event's span (which starts and ends a little
    # outside the injected 20 s): between the diluted and the pure +30 %
    pct = a["impact"]["iteration_time_pct"]
    assert 20 <= pct <= 30.5
    assert f"iteration time +{pct:.0f}%" in a["impact"]["text"]


def test_custom_window_and_stride():
    h = SynthHost(2, seed=5, anomalies=[("cpu", 50, 70)])
    t, v, ch = h.frame(120, 0.1)
    det = detect(t, v, ch, config={"window_s": 5, "stride_s": 2.5})
    assert det.analysis["window_s"] == 5 and len(det.anomalies) == 1
    with pytest.raises(ValueError, match="stride_s"):
        detect(t, v, ch, config={"stride_s": 0})


def test_700_channels_prunes_and_finds():
    h = SynthHost(64, seed=6, anomalies=[("storage", 60, 80)], extra_gauges=160)
    t, v, ch = h.frame(120, 0.1)
    assert len(ch) > 600
    det = detect(t, v, ch)
    assert det.analysis["pruned"] > 0
    assert [a["subsystem"] for a in det.anomalies] == ["storage"]


def test_gpu_invariants_pcie_link_and_xid():
    from reveal_plugins.types import ChannelMeta

    n = 1200
    t = 1.7e9 + np.arange(n) * 0.1
    ch = [ChannelMeta("gpu.0.util_sm", "%", "gauge", "nvml"),
          ChannelMeta("gpu.0.pcie_link_gen", "gen", "gauge", "nvml"),
          ChannelMeta("gpu.0.pcie_link_gen_max", "gen", "gauge", "nvml"),
          ChannelMeta("gpu.0.xid_events", "events", "counter", "nvml"),
          ChannelMeta("cpu.procs_running", "tasks", "gauge", "procfs")]
    rng = np.random.default_rng(0)
    v = np.column_stack([90 + rng.standard_normal(n), np.full(n, 1.0), np.full(n, 4.0),
                         np.where(np.arange(n) >= 800, 1.0, 0.0),
                         2 + rng.integers(0, 2, n)])
    det = detect(t, v, ch)
    titles = [h["title"] for a in det.anomalies for h in a["hints"]]
    assert all(a["subsystem"] == "gpu" for a in det.anomalies)
    assert any("PCIe link below" in x for x in titles)
    assert any("XID" in x for x in titles)


def test_slowdown_soon_after_start_is_reported_when_markers_show_steady_training(synth_run):
    """An anomaly that begins right after the start-up grace is taken for slow start-up...
    unless iteration markers show training was already running steadily and then slowed."""
    from reveal_plugins.store.store import append_event
    plain = synth_run("plain", 180.0, anomalies=[("storage", 12.0, 30.0)], seed=3)
    rep = analyze(plain)
    assert not any(a["subsystem"] == "storage" for a in rep["anomalies"])
    assert any(o["subsystem"] == "storage" and "start-up" in o["why_not_anomaly"]
               for o in rep.get("observations", []))
    marked = synth_run("marked", 180.0, anomalies=[("storage", 12.0, 30.0)], seed=3)
    t0 = 1.7e9
    for k in range(170):
        t = t0 + 3.0 + k
        slow = 12.0 <= t - t0 < 30.0
        append_event(marked, "iteration", t, rank=0, step=k, dt=0.3 if slow else 0.1)
    rep = analyze(marked)
    sto = [a for a in rep["anomalies"] if a["subsystem"] == "storage"]
    assert sto and sto[0]["start"] - t0 < 16
    assert sto[0]["impact"]["iteration_time_pct"] > 100


def test_the_runs_own_checkpoint_io_is_an_observation_not_an_anomaly():
    """Issue 21: a job that writes and syncs its own checkpoint queues its own device (write
    time, I/O pressure, iowait).  With its own writes (storage.run.write_bytes) rising and no
    process outside the run, that is its own phase: an observation naming the run's bytes.
    The same device symptoms without the run's own writes stay a storage anomaly."""
    from reveal_plugins.detect.batch.stages import OWN_IO

    own = SynthHost(2, seed=5, anomalies=[("ownio", 70, 95)])
    t, v, ch = own.frame(160, 0.1)
    det = detect(t, v, ch)
    assert det.anomalies == []
    seen = [o for o in det.observations if o["why_not_anomaly"].startswith(OWN_IO)]
    assert len(seen) == 1 and "storage.run.write_bytes" in seen[0]["why_not_anomaly"]
    assert seen[0]["reason"] == "own_io"
    assert abs(seen[0]["start"] - (own.t0 + 70)) <= 4
    assert any("run's own I/O" in n for n in det.notes)

    stall = SynthHost(2, seed=5, anomalies=[("storage", 70, 95)])
    t, v, ch = stall.frame(160, 0.1)
    assert [a["subsystem"] for a in detect(t, v, ch).anomalies] == ["storage"]


def test_a_cpu_symptom_beside_the_runs_own_io_keeps_the_anomaly():
    """The run's own writes explain only what writes do to a device: CPU contention at the
    same time (run queue, CPU pressure) is still a finding."""
    h = SynthHost(2, seed=5, anomalies=[("ownio", 70, 95), ("cpu", 70, 95)])
    t, v, ch = h.frame(160, 0.1)
    det = detect(t, v, ch)
    assert len(det.anomalies) == 1, det.observations
    assert det.anomalies[0]["subsystem"] in ("cpu", "storage")


def test_a_shaped_link_is_a_network_anomaly_by_its_qdisc():
    """Issue 21 (the miss of the 51a66f5 test split): `tc qdisc ... tbf` on the link of a DDP
    job cuts its bytes and its CPU, with no loss and no retransmission.  What says it is the
    machine is the qdisc: a small standing queue (one or two 10-KiB segments) and packets held
    back for the rate (overlimits ~100/s) where there were none.  Their floors are those of a
    queue (4 KiB, 2.5 packets/s), not of a memory level (64 MiB) or a packet rate (200/s), so
    that finding is a network anomaly naming the qdisc, not an observation of the job
    slowing down by itself."""
    h = SynthHost(2, seed=7, anomalies=[("shaped", 70, 92)])
    t, v, ch = h.frame(160, 0.1)
    det = detect(t, v, ch)
    assert [a["subsystem"] for a in det.anomalies] == ["network"], det.observations
    a = det.anomalies[0]
    assert abs(a["start"] - (h.t0 + 70)) <= 4 and abs(a["end"] - (h.t0 + 92)) <= 6
    assert any(e["channel"] == "network.eth0.qdisc_overlimits" for e in a["evidence"])
    assert a["hints"][0]["rule"] == "network_shaped"
    assert "tc -s qdisc show dev eth0" in a["hints"][0]["action"]

    clean = SynthHost(2, seed=7)
    t, v, ch = clean.frame(160, 0.1)
    assert detect(t, v, ch).anomalies == []
