"""NVML probe against a fake *driver* under the real ``nvidia-ml-py`` binding
(tests/fixtures_nvml.py): the binding's own lookups, error classes and version fallbacks run,
so these tests see what a real node's first job would see."""
import math
import os
import subprocess
import sys
import time

import pytest

pynvml = pytest.importorskip("pynvml")

from fixtures_nvml import (  # noqa: E402
    ManualClock, FakeDriver, install_fake_nvml, fake_nvml_driver,  # noqa: F401
)
from reveal_plugins.probes import nvml as nvml_mod  # noqa: E402
from reveal_plugins.probes.nvml import RETRY_S, NvmlProbe  # noqa: E402


def _vals(p):
    return dict(zip([c.name for c in p.channels], p.sample()))


def _open(**kw):
    p = NvmlProbe(**kw)
    p.open()
    assert p.available, p.reason
    return p


def test_eight_gpus_channels_units_and_all_links_nvlink(fake_nvml_driver):
    drv = fake_nvml_driver
    for g in drv.gpus:
        g.busy(sm=90, nvlink_gbps=100.0)
    p = _open()
    names = {c.name: c for c in p.channels}
    for i in range(8):
        for m in ("util_sm", "mem_used", "clock_sm", "clock_sm_max", "throttle_power_cap",
                  "power", "energy", "pcie_tx", "capped_power_s", "nvlink_tx",
                  "pcie_link_gen", "nvml_status", "xid_events"):
            assert f"gpu.{i}.{m}" in names, (i, m)
    assert names["gpu.0.power"].unit == "W" and names["gpu.0.energy"].kind == "counter"
    assert names["gpu.0.capped_power_s"].unit == "s"
    v = _vals(p)
    assert v["gpu.3.util_sm"] == 90 and v["gpu.3.nvml_status"] == 0
    # NVLink data is the sum over all 18 links, not link 0 alone
    nv = pynvml
    h = nv.nvmlDeviceGetHandleByIndex(3)
    link0 = nv.nvmlDeviceGetFieldValues(h, [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)])[0]
    v = _vals(p)
    assert v["gpu.3.nvlink_tx"] > 10 * link0.value.ullVal
    # Hopper refuses the *_TOTAL NVLink error fields: per-link sums keep the coverage
    drv.gpus[2].nvlink_error(link=5, replay=3)
    for _ in range(p.slow_every):
        v = _vals(p)
    assert v["gpu.2.nvlink_replay_errors"] == 3 and v["gpu.1.nvlink_replay_errors"] == 0
    p.close()


def test_fast_path_cost_and_calls(fake_nvml_driver):
    drv = fake_nvml_driver
    for g in drv.gpus:
        g.busy()
    p = _open()
    for _ in range(10):
        p.sample()
    drv.reset_calls()
    n = 100
    for _ in range(n):
        p.sample()
    per_gpu = drv.calls_per_gpu()
    assert all(c / n <= 6.5 for c in per_gpu.values()), per_gpu
    assert drv.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0  # counters exist: no legacy
    p.close()


def test_refused_gpu_is_skipped_and_listed(fake_nvml_driver):
    drv = fake_nvml_driver
    drv.gpus[5].refuse("no_permission")
    p = _open()
    d = p.describe()
    assert "5" in d["skipped_gpus"] and "GPU 5 skipped" in d["note"]
    v = _vals(p)
    assert v["gpu.5.nvml_status"] == 2
    assert not any(k.startswith("gpu.5.") and k != "gpu.5.nvml_status" for k in v)
    assert v["gpu.4.nvml_status"] == 0 and not math.isnan(v["gpu.4.util_sm"])


def test_gpu_mid_reset_at_open_gets_channels_when_it_comes_back():
    clock = ManualClock()
    with install_fake_nvml(FakeDriver(gpus=2, clock=clock)) as drv:
        drv.gpus[1].refuse("reset_required")
        p = NvmlProbe(clock=clock)
        p.open()
        names = [c.name for c in p.channels]
        assert "gpu.1.util_sm" in names and "gpu.1.power" in names  # declared all the same
        v = _vals(p)
        assert v["gpu.1.nvml_status"] == 2 and math.isnan(v["gpu.1.util_sm"])
        drv.gpus[1].open_error = None
        drv.gpus[1].busy(sm=77)
        clock.advance(RETRY_S + 1)
        v = _vals(p)
        assert v["gpu.1.nvml_status"] == 0 and v["gpu.1.util_sm"] == 77
        assert len(p.sample()) == len(p.channels)


def test_gpu_lost_mid_run_then_retried():
    clock = ManualClock()
    with install_fake_nvml(FakeDriver(gpus=4, clock=clock)) as drv:
        for g in drv.gpus:
            g.busy()
        p = NvmlProbe(clock=clock)
        p.open()
        assert _vals(p)["gpu.2.nvml_status"] == 0
        drv.gpus[2].lose()
        clock.advance(0.1)
        v = _vals(p)
        assert v["gpu.2.nvml_status"] == 1 and math.isnan(v["gpu.2.util_sm"])
        assert v["gpu.1.nvml_status"] == 0 and v["gpu.1.util_sm"] == 95
        assert v["gpu.2.xid_events"] == 1 and v["gpu.2.xid_last"] == 79
        drv.reset_calls()
        for _ in range(20):   # a lost GPU is not hammered
            clock.advance(0.1)
            p.sample()
        assert sum(drv.gpus[2].calls.values()) == 0
        assert "lost" in p.describe()["note"]
        drv.gpus[2].recover()
        clock.advance(RETRY_S)
        v = _vals(p)
        assert v["gpu.2.nvml_status"] == 0 and v["gpu.2.util_sm"] == 95


@pytest.mark.parametrize("fake_nvml_driver", [dict(old_driver=True)], indirect=True)
def test_old_driver_fallbacks_and_no_blocking_call_on_the_sampling_path(fake_nvml_driver):
    drv = fake_nvml_driver
    for g in drv.gpus:
        g.busy(pcie_tx_gbps=3.0)
    p = _open()
    names = [c.name for c in p.channels]
    assert "gpu.0.power" in names and "gpu.0.power_limit" in names   # per-call fallbacks
    assert "gpu.0.throttle_power_cap" in names   # ...ThrottleReasons, the old name
    assert "gpu.0.pcie_tx" not in names and "gpu.0.pcie_tx_rate" in names
    worst = 0.0
    for _ in range(30):
        t = time.perf_counter()
        p.sample()
        worst = max(worst, time.perf_counter() - t)
        time.sleep(0.05)
    # the legacy call blocks 20 ms per GPU and counter in the driver: 8 GPUs would be 320 ms
    assert worst < 0.015, worst
    v = _vals(p)
    assert v["gpu.0.pcie_tx_rate"] == pytest.approx(3e9, rel=0.05)
    p.close()


def test_per_field_no_permission_drops_only_that_field(fake_nvml_driver):
    drv = fake_nvml_driver
    for g in drv.gpus:
        g.busy()
        g.refuse_fields([pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION], "no_permission")
    p = _open()
    names = [c.name for c in p.channels]
    # energy came back with the per-call fallback or not at all, never as a dead field
    v = _vals(p)
    assert not math.isnan(v["gpu.0.power"]) and not math.isnan(v["gpu.0.pcie_tx"])
    assert "no permission" in p.describe().get("note", "")
    assert ("gpu.0.energy" not in names) or not math.isnan(v["gpu.0.energy"])


def test_field_failing_transiently_is_kept_and_read_when_it_answers():
    with install_fake_nvml(FakeDriver(gpus=1)) as drv:
        drv.gpus[0].busy(power=400)
        drv.gpus[0].refuse_fields([pynvml.NVML_FI_DEV_POWER_INSTANT], 999)  # UNKNOWN
        p = _open()
        v = _vals(p)
        assert "gpu.0.power" in v and math.isnan(v["gpu.0.power"])
        drv.gpus[0].field_errors.clear()
        assert _vals(p)["gpu.0.power"] == pytest.approx(400, rel=0.01)


@pytest.mark.parametrize("fake_nvml_driver", [dict(pcie_counter_bits=32, gpus=1,
                                                   clock=ManualClock())], indirect=True)
def test_32_bit_pcie_counters_never_step_back(fake_nvml_driver):
    drv = fake_nvml_driver
    drv.gpus[0].busy(pcie_tx_gbps=20.0, pcie_rx_gbps=20.0)
    p = _open(clock=drv.clock)
    prev = _vals(p)["gpu.0.pcie_tx"]
    for _ in range(20):        # 0.1 s at 20 GB/s: a 32-bit counter wraps every ~2 samples
        drv.advance(0.1)
        cur = _vals(p)["gpu.0.pcie_tx"]
        assert cur - prev == pytest.approx(2e9, rel=0.02)
        prev = cur


def test_power_cap_shows_in_flags_clocks_and_violation_counters():
    clock = ManualClock()
    with install_fake_nvml(FakeDriver(gpus=2, clock=clock)) as drv:
        for g in drv.gpus:
            g.busy()
        p = NvmlProbe(clock=clock)
        p.open()
        a = _vals(p)
        drv.gpus[1].throttle("power")
        clock.advance(5.0)
        b = _vals(p)
        assert b["gpu.1.throttle_power_cap"] == 1 and b["gpu.0.throttle_power_cap"] == 0
        assert b["gpu.1.clock_sm"] < 0.8 * b["gpu.1.clock_sm_max"]
        assert b["gpu.1.capped_power_s"] - a["gpu.1.capped_power_s"] == pytest.approx(5.0, 0.01)
        assert b["gpu.0.capped_power_s"] == a["gpu.0.capped_power_s"]


def test_downtrained_link_and_replays():
    clock = ManualClock()
    with install_fake_nvml(FakeDriver(gpus=2, clock=clock)) as drv:
        for g in drv.gpus:
            g.busy()
        p = NvmlProbe(clock=clock)
        p.open()
        drv.gpus[0].downtrain(gen=3, width=8)
        for _ in range(p.slow_every):
            clock.advance(0.1)
            v = _vals(p)
        assert (v["gpu.0.pcie_link_gen"], v["gpu.0.pcie_link_width"]) == (3, 8)
        assert (v["gpu.0.pcie_link_gen_max"], v["gpu.0.pcie_link_width_max"]) == (5, 16)
        assert v["gpu.1.pcie_link_gen"] == 5 and v["gpu.0.pcie_replay"] > 0


def test_no_driver_says_why(monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    monkeypatch.setattr(pynvml, "CDLL", lambda *a, **k: (_ for _ in ()).throw(OSError("no")),
                        raising=False)
    p = NvmlProbe()
    p.open()
    assert not p.available
    assert "NVML not available" in p.reason


def test_reveal_probes_lists_a_refused_gpu(tmp_path):
    """`reveal probes --json` (a real subprocess) shows the skipped GPU and why."""
    boot = tmp_path / "sitecustomize.py"
    boot.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.path.join(os.path.dirname(__file__))!r})\n"
        "from fixtures_nvml import FakeDriver, install_fake_nvml\n"
        "d = FakeDriver(gpus=3); d.gpus[1].refuse('no_permission')\n"
        "_ctx = install_fake_nvml(d); _ctx.__enter__()\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "probes", "--json"],
                       capture_output=True, text=True, env=env, timeout=60)
    import json
    rows = {x["name"]: x for x in json.loads(r.stdout)}
    assert rows["nvml"]["available"] is True
    assert "GPU 1 skipped" in rows["nvml"]["note"]
