"""GPU peers inside a node and GPU findings with hints, on synthetic 8-GPU nodes
(:mod:`fixtures_gpu`, the NVML probe's channel names, counters cumulative): a throttled,
downtrained or foreign-loaded GPU among eight is named with its index, UUID and rank; a phase
every GPU shows is the job's own; lost GPUs, XID, ECC, row remapping and NVLink errors are
invariants with critical hints; an input-bound job names the CPU as the cause."""
import json

import numpy as np
import pytest

from fixtures_gpu import T0, gpu_node, write_gpu_run
from reveal_plugins.detect.evidence import gpu as gpu_mod
from reveal_plugins.detect.pipeline import analyze, detect, hints_for


def run(n_gpus=8, **kw):
    t, V, ch, meta, ev = gpu_node(n_gpus, **kw)
    return detect(t, V, ch, meta, ev), meta


def gpu_anomalies(det):
    return [a for a in det.anomalies if isinstance(a.get("gpu"), dict)]


def hints(det):
    return [h for a in det.anomalies for h in a["hints"]]


def named(det, g, meta, n_gpus=8):
    """The anomalies about GPU ``g``: subsystem gpu, its identity and its rank (7 - g)."""
    out = [a for a in gpu_anomalies(det) if a["gpu"]["index"] == g]
    for a in out:
        assert a["subsystem"] == "gpu"
        assert a["gpu"]["uuid"] == meta["gpus"][g]["uuid"]
        assert a["gpu"]["rank"] == n_gpus - 1 - g
        assert a["evidence"] and all(e["channel"].startswith(f"gpu.{g}.")
                                     for e in a["evidence"][:3])
    return out


# -- step 5: GPU peers --------------------------------------------------------------------------

KINDS = ["throttle", "downtrain", "narrow", "foreign", "thermal"]
SEEDS = [3, 11, 17, 29, 41, 58]


@pytest.mark.parametrize("seed", SEEDS)
def test_one_faulty_gpu_among_eight_is_named(seed):
    """Which GPU and which fault are drawn from a fixed seed list: the faulty GPU is named
    (index, UUID, rank), and no other GPU is."""
    rng = np.random.default_rng(seed)
    g = int(rng.integers(0, 8))
    kind = KINDS[seed % len(KINDS)]
    a0 = float(rng.uniform(25, 45))
    det, meta = run(faults=[(g, kind, a0, a0 + 35)], seed=seed)
    mine = named(det, g, meta)
    assert mine, (g, kind, [(a.get("title"), a["subsystem"]) for a in det.anomalies])
    assert {a["gpu"]["index"] for a in gpu_anomalies(det)} == {g}
    assert not [a for a in det.anomalies if a["subsystem"] == "gpu" and a not in mine]
    sus = det.analysis["gpu_peers"]["suspects"]
    assert sus and {s["gpu"] for s in sus} == {g}
    a = mine[0]
    assert a["start"] - T0 <= a0 + 3 and a["end"] - T0 >= a0 + 35 - 5
    want = {"throttle": "GPU clocks throttled (power cap)", "thermal":
            "GPU clocks throttled (thermal)", "downtrain": "PCIe link", "narrow": "PCIe link",
            "foreign": "Foreign GPU work"}[kind]
    assert any(want in h["title"] for h in a["hints"]), [h["title"] for h in a["hints"]]


def test_three_faulty_gpus_each_named_with_its_fault():
    det, meta = run(faults=[(2, "throttle", 30, 60), (5, "downtrain", 40, 70),
                            (6, "foreign", 50, 85)])
    by = {g: named(det, g, meta) for g in (2, 5, 6)}
    assert all(by.values()), det.anomalies
    assert {a["gpu"]["index"] for a in gpu_anomalies(det)} == {2, 5, 6}
    titles = {g: [h["title"] for a in by[g] for h in a["hints"]] for g in by}
    assert any("power cap" in x for x in titles[2])
    assert any("PCIe link below" in x for x in titles[5])
    assert any("Foreign GPU work" in x for x in titles[6])
    thr = next(h for a in by[2] for h in a["hints"] if "throttled" in h["title"])
    # the reason and the time spent, the command, the drain
    assert "power cap" in thr["why"] and "% of the time" in thr["why"]
    assert "nvidia-smi -q -d PERFORMANCE,CLOCK" in thr["action"]
    assert "scontrol update nodename=gpunode01 state=drain" in thr["action"]
    peers = [a for a in by[2] if "peers" in a]
    assert peers and peers[0]["peers"]["compared"] == 7
    # the detector's own anomaly over the same span is no second finding
    assert not [a for a in det.anomalies if "gpu" not in a and a["subsystem"] == "gpu"]


def test_every_gpu_idle_at_once_is_the_jobs_phase():
    det, _ = run(phases=[(40, 47), (80, 87)])
    assert not det.anomalies, det.anomalies
    gp = det.analysis["gpu_peers"]
    assert gp["gpus"] == 8 and not gp["suspects"]
    assert gp["shared"] and all(s["gpus"] == list(range(8)) for s in gp["shared"])
    assert any("job's own phase" in o["why_not_anomaly"] for o in det.observations)


def test_phase_on_every_gpu_plus_one_throttled_gpu():
    det, meta = run(faults=[(4, "throttle", 30, 65)], phases=[(45, 52)])
    assert named(det, 4, meta)
    assert {a["gpu"]["index"] for a in gpu_anomalies(det)} == {4}


@pytest.mark.parametrize("n", [2, 3])
def test_few_gpus(n):
    """3 GPUs: the median of two siblings; 2 GPUs: the one whose own signals changed, with a
    note on what two cannot tell."""
    det, meta = run(n, faults=[(1, "throttle", 30, 65)])
    assert named(det, 1, meta, n)
    assert {a["gpu"]["index"] for a in gpu_anomalies(det)} == {1}
    if n == 2:
        assert any(x.startswith("2 GPUs") for x in det.notes)


def test_single_gpu_has_no_peers_but_keeps_its_invariants():
    det, meta = run(1, faults=[(0, "foreign", 0, 200)])
    assert det.analysis["gpu_peers"]["gpus"] == 1 and "no sibling" in \
        det.analysis["gpu_peers"]["notes"][0]
    a = named(det, 0, meta, 1)
    assert a and any("Foreign GPU work" in h["title"] for h in a[0]["hints"])


def test_identities_from_meta_and_rank_events():
    meta = {"gpus": [{"index": 0, "uuid": "GPU-a", "pci_bus_id": "00000000:18:00.0"},
                     {"index": 1, "uuid": "GPU-b", "name": "NVIDIA H200"}]}
    events = [{"event": "rank", "rank": 4, "gpu": 1}, {"event": "rank", "rank": 5, "gpu": 1},
              {"event": "rank", "rank": 2, "gpu": 0, "gpu_uuid": "GPU-x"}]
    ids = gpu_mod.identities(meta, events, [0, 1, 2])
    assert ids[0] == {"index": 0, "uuid": "GPU-a", "pci_bus_id": "00000000:18:00.0",
                      "rank": 2}
    assert ids[1]["rank"] is None and ids[1]["ranks"] == [4, 5]
    assert ids[2] == {"index": 2, "rank": None}
    assert gpu_mod.label(ids[0]) == "GPU 0 (rank 2)"
    assert gpu_mod.label(ids[0], full=True) == "GPU 0 (rank 2, GPU-a, 00000000:18:00.0)"


# -- step 6: GPU findings with hints -----------------------------------------------------------

def only(det, g, meta, n_gpus=8):
    a = named(det, g, meta, n_gpus)
    assert len(a) == 1, [(x.get("title"), x["start"]) for x in a]
    return a[0]


def test_lost_gpu_is_critical_fell_off_the_bus():
    det, meta = run(faults=[(3, "lost", 70, 999)])
    a = only(det, 3, meta)
    assert a.get("invariant") and a["start"] == pytest.approx(T0 + 70, abs=0.2)
    h = a["hints"][0]
    assert h["title"] == "GPU fell off the bus (lost)" and h["severity"] == "critical"
    assert "XID 79" in h["action"] and "nvidia-smi -q" in h["action"]
    assert "state=drain" in h["action"] and "reboot" in h["action"]


@pytest.mark.parametrize("kind,title,word", [
    ("xid", "XID events", "fallen off the bus"),
    ("ecc", "ECC", "uncorrected ECC"),
    ("remap_pending", "row remap pending", "nvidia-smi -r"),
    ("remap_failure", "row remapping failed", "RMA"),
    ("nvlink", "NVLink errors", "nvidia-smi nvlink -e"),
])
def test_invariants_any_change_is_a_finding(kind, title, word):
    """A single XID, an uncorrected ECC error, a remap flag, NVLink errors: a finding however
    short, whatever the anomaly detector makes of it, with a concrete hint."""
    det, meta = run(faults=[(5, kind, 60, 62 if kind == "nvlink" else 61)])
    a = only(det, 5, meta)
    assert a.get("invariant")
    h = next(h for h in a["hints"] if title in h["title"])
    assert word in h["why"] + h["action"], h
    if kind != "nvlink":
        assert h["severity"] == "critical"
    assert "scontrol update nodename=gpunode01 state=drain" in h["action"]


def test_application_xid_is_a_warning_that_points_at_the_job():
    ctx = {"channels": {}, "gpu": {"index": 0, "counts": {"xid_events": 1.0}, "xid_last": 13}}
    an = {"subsystem": "gpu", "node": "n1", "evidence": [
        {"channel": "gpu.0.xid_events", "deviation": 5.0}]}
    h = next(h for h in hints_for(an, ctx) if "XID" in h["title"])
    assert h["severity"] == "warning" and "application" in h["why"]


def test_thermal_cap_for_the_whole_run_is_an_invariant():
    """One GPU held down by its thermal limit from start to end: no change to detect within
    the run, no sibling moved -- still a finding, with the share of the time."""
    det, meta = run(faults=[(6, "thermal", 0, 200)])
    a = only(det, 6, meta)
    assert a.get("invariant") and "thermal" in a["invariant"]
    h = next(h for h in a["hints"] if h["rule"] == "gpu_throttling")
    assert h["title"] == "GPU clocks throttled (thermal)"
    assert "the thermal limit" in h["why"] and "violation counters" in h["why"]
    assert "nvidia-smi -q -d TEMPERATURE" in h["action"]


def test_foreign_gpu_work_counts_and_memory_no_pids():
    det, meta = run(faults=[(1, "foreign", 40, 80)])
    a = only(det, 1, meta)
    h = next(h for h in a["hints"] if h["rule"] == "gpu_foreign")
    assert "1 process(es)" in h["why"] and "8.0 GiB" in h["why"] and "40%" in h["why"]
    assert "--query-compute-apps=pid,used_memory --format=csv" in h["action"]
    assert "ConstrainDevices=yes" in h["action"] and "EXCLUSIVE_PROCESS" in h["action"]
    text = json.dumps(a)
    assert "pid " not in text.replace("pid,", "") and "cmdline" not in text


def test_input_bound_names_the_cpu():
    det, _ = run(faults=[(0, "starve", 50, 80)])
    hs = [h for h in hints(det) if h["rule"] == "gpu_input_bound"]
    assert hs, [(a["subsystem"], [h["title"] for h in a["hints"]]) for a in det.anomalies]
    h = hs[0]
    assert h["cause"] == "cpu" and h["subsystem"] == "cpu" and "input-bound" in h["title"]
    assert "cores" in h["why"] and "--cpus-per-gpu" in h["action"]
    assert "num_workers" in h["action"]
    assert not det.analysis["gpu_peers"]["suspects"]     # every GPU waited alike


def test_input_bound_with_foreign_cpu_load():
    ctx = {"channels": {
        "gpu.0.util_sm": {"baseline": 95, "observed": 30, "deviation": -20, "unit": "%"},
        "cpu.foreign.cores": {"baseline": 0.1, "observed": 3.5, "deviation": 25,
                              "unit": "cores"}}}
    h = next(h for h in hints_for({"subsystem": "cpu", "evidence": []}, ctx)
             if h["rule"] == "gpu_input_bound")
    assert "other processes took 3.50 cores" in h["why"] and h["cause"] == "cpu"
    assert "ConstrainCores=yes" in h["action"]


@pytest.mark.parametrize("chans,title", [
    ({"gpu.2.nvlink_replay_errors": (0, 4, 6, "errors/s")}, "GPU NVLink errors"),
    ({"gpu.2.nvml_status": (0, 1, 2, "state")}, "GPU fell off the bus"),
    ({"gpu.2.foreign_procs": (0, 2, 2, "processes"),
      "gpu.2.foreign_mem": (0, 4 * 2 ** 30, 60, "bytes")}, "Foreign GPU work"),
    ({"gpu.2.capped_power_s": (0, 0.7, 14, "s/s")}, "GPU clocks throttled (power cap)"),
    ({"gpu.2.pcie_replay": (0, 30, 9, "replays/s")}, "GPU PCIe replays"),
    ({"gpu.2.remap_failure": (0, 1, 2, "flag")}, "row remapping failed"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_rules_from_channels_alone(chans, title):
    """The detector's own anomalies carry channels only (no GPU facts): the rules read them."""
    ctx = {"channels": {n: {"baseline": b, "observed": o, "deviation": d, "unit": u}
                        for n, (b, o, d, u) in chans.items()}}
    hs = hints_for({"subsystem": "gpu", "node": "n7", "evidence": [
        {"channel": next(iter(chans)), "deviation": 5.0}]}, ctx)
    h = next((h for h in hs if title in h["title"]), None)
    assert h, [x["title"] for x in hs]
    assert "GPU 2" in h["why"] and h["action"] and not h.get("fallback")


# -- the streamed path, the report, the renderers, OTel -------------------------------------

@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("gpu") / "run")
    write_gpu_run(d, faults=[(2, "throttle", 30, 60), (6, "foreign", 50, 85),
                             (1, "lost", 100, 999)], phases=[(70, 77)])
    return d


@pytest.mark.parametrize("full", [False, True], ids=["batch", "streamed"])
def test_report_names_the_gpus(gpu_run, full, report_schema_validate):
    rep = report_schema_validate(analyze(gpu_run, {"full": full}))
    by = {a["gpu"]["index"]: a for a in rep["anomalies"] if a.get("gpu")}
    assert set(by) == {1, 2, 6}, [a.get("title") for a in rep["anomalies"]]
    assert by[2]["gpu"]["uuid"].startswith("GPU-00000002") and by[2]["gpu"]["rank"] == 5
    assert "sibling GPUs" in by[2]["title"]
    assert by[1]["hints"][0]["title"] == "GPU fell off the bus (lost)"
    assert rep["analysis"]["gpu_peers"]["gpus"] == 8


def test_text_html_and_otel_show_the_gpu(gpu_run):
    from reveal_plugins.otel.trace import build_spans
    from reveal_plugins.report.html import render_html
    from reveal_plugins.report.text import render_text

    rep = analyze(gpu_run)
    txt = render_text(rep, color=False, run_dir=gpu_run)
    assert "GPU peers" in txt and "=> GPU 2 (rank 5)" in txt
    assert "gpu      GPU 2 · rank 5 · GPU-00000002" in txt
    assert "ok: GPU 0 (rank 7)" in txt
    html = render_html(rep, None)
    assert "<h3>GPU peers</h3>" in html and "GPU 6 · rank 1 · GPU-00000006" in html
    spans = build_spans(rep)
    assert set(spans[0].attributes["reveal.gpu_peers.suspect_gpus"]) >= {2, 6}
    gpu_spans = {s.attributes.get("reveal.anomaly.gpu.index"): s for s in spans
                 if s.name == "anomaly gpu"}
    assert {1, 2, 6} <= set(gpu_spans)
    assert gpu_spans[2].attributes["reveal.anomaly.gpu.rank"] == 5
    assert gpu_spans[2].attributes["reveal.anomaly.gpu.uuid"].startswith("GPU-00000002")
