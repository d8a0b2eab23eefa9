"""Hint rules are plugins: built-ins fire on their patterns, a site adds rules and detectors
the same way, fallbacks give way to specific hints."""
import numpy as np
import pytest

from reveal_plugins.detect.pipeline import detect, hints_for
from reveal_plugins.detect.synth import SynthHost
from reveal_plugins.hooks import get_plugin_manager
from reveal_plugins.hooks.hookspec import hookimpl
from reveal_plugins.hooks.manager import reset_plugin_manager


def ctx(**chans):
    return {"channels": {n: {"baseline": b, "observed": o, "deviation": d, "unit": u}
                         for n, (b, o, d, u) in chans.items()}, "meta": {}, "facts": {},
            "impact": None}


CASES = [
    ("cpu", {"cpu.psi.some_total": (1e4, 6e5, 30, "us/s"), "cpu.procs_running": (2, 6, 8, "tasks")},
     "CPU contention"),
    ("cpu", {"cpu.all.steal_pct": (0, 30, 15, "%")}, "CPU steal"),
    ("cpu", {"cpu.core0.freq": (3000, 1200, -20, "MHz")}, "CPU frequency"),
    ("memory", {"memory.MemAvailable": (2e7, 1e7, -25, "kB"),
                "memory.vm.pswpout": (0, 500, 40, "count/s")}, "Memory pressure"),
    ("memory", {"cpu.perf.cache_miss_pct": (5, 40, 12, "%")}, "Memory-bandwidth"),
    ("storage", {"storage.psi.some_total": (0, 5e5, 25, "us/s"),
                 "storage.vda.weighted_io_ms": (1, 900, 40, "ms/s")}, "Storage stall on vda"),
    ("network", {"network.tcp.RetransSegs": (0, 50, 40, "count/s")}, "TCP retransmissions"),
    ("network", {"network.eth0.rx_bytes": (5e7, 1e6, -20, "bytes/s")}, "throughput collapsed"),
    ("network", {"network.ib.mlx5_0_1.symbol_error": (0, 3, 9, "count/s")}, "InfiniBand"),
    ("gpu", {"gpu.0.throttle_hw_thermal": (0, 1, 10, "flag"), "gpu.0.temp": (60, 89, 12, "degC")},
     "GPU clocks throttled (thermal)"),
    ("gpu", {"gpu.0.pcie_link_gen": (4, 1, -5, "gen"), "gpu.0.pcie_link_gen_max": (4, 4, 0, "gen")},
     "PCIe link"),
    ("gpu", {"gpu.0.ecc_uncorrected": (0, 2, 5, "errors/s")}, "ECC"),
    ("gpu", {"gpu.0.util_sm": (95, 20, -15, "%"), "cpu.all.busy_pct": (60, 100, 8, "%")},
     "input-bound"),
]


@pytest.mark.parametrize("sub,chans,title", CASES, ids=[c[2] for c in CASES])
def test_builtin_rule_fires(sub, chans, title):
    an = {"subsystem": sub, "evidence": [{"channel": "x", "deviation": 5.0}]}
    hints = hints_for(an, ctx(**chans))
    assert any(title in h["title"] for h in hints), [h["title"] for h in hints]
    for h in hints:
        assert h["severity"] in ("info", "warning", "critical") and h["why"] and h["action"]
        assert not h.get("fallback")


def test_a_qdisc_dropping_for_its_rate_is_shaping_not_interface_errors():
    """A shaper's drops (network.<if>.qdisc_drops) are no link errors: no cable or transceiver
    advice, the qdisc's own rule with the `tc` command for that interface."""
    an = {"subsystem": "network", "evidence": [{"channel": "x", "deviation": 5.0}]}
    hints = hints_for(an, ctx(**{"network.veth1.qdisc_drops": (0, 40, 16, "packets/s"),
                                 "network.veth1.qdisc_backlog": (0, 21000, 5, "bytes")}))
    assert [h["rule"] for h in hints] == ["network_shaped"], hints
    assert "tc -s qdisc show dev veth1" in hints[0]["action"]
    assert "veth1" in hints[0]["title"]


def test_fallback_only_when_nothing_specific():
    an = {"subsystem": "system", "evidence": [{"channel": "system.forks", "deviation": 9.0}]}
    hints = hints_for(an, ctx(**{"system.forks": (1, 50, 9, "count/s")}))
    assert len(hints) == 1 and hints[0]["fallback"] and hints[0]["severity"] == "info"
    assert "system.forks" in hints[0]["why"]


def test_iteration_impact_makes_it_critical():
    c = ctx(**{"cpu.psi.some_total": (1e4, 6e5, 30, "us/s")})
    c["impact"] = {"iteration_time_pct": 45.0, "text": "iteration time +45% during this anomaly"}
    h = hints_for({"subsystem": "cpu", "evidence": []}, c)[0]
    assert h["severity"] == "critical" and "+45%" in h["why"]


class SitePlugin:
    """What a site ships through the ``reveal_plugins`` entry-point group."""

    @hookimpl
    def reveal_hints(self, anomaly, context):
        if anomaly["subsystem"] == "cpu":
            return [{"title": "Site rule: open a ticket", "action": "mail hpc-support",
                     "severity": "warning", "why": "site policy"}]
        return []

    @hookimpl
    def reveal_detectors(self, config):
        class Energy:
            name = "site_energy"
            score_floor = 1.0

            def fit(self, X):
                return self

            def score_samples(self, X):
                return np.sqrt((np.asarray(X) ** 2).sum(axis=1))
        return [Energy()]


def test_site_plugin_adds_rule_and_detector():
    reset_plugin_manager()
    pm = get_plugin_manager()
    pm.register(SitePlugin(), name="site")
    try:
        h = SynthHost(2, seed=3, anomalies=[("cpu", 50, 70)])
        t, v, ch = h.frame(120, 0.1)
        det = detect(t, v, ch)
        assert "site_energy" in det.analysis["detectors"]
        titles = [x["title"] for x in det.anomalies[0]["hints"]]
        assert "Site rule: open a ticket" in titles and any("CPU contention" in x for x in titles)
    finally:
        reset_plugin_manager()


def test_broken_hint_plugin_is_isolated():
    class Broken:
        @hookimpl
        def reveal_hints(self, anomaly, context):
            raise RuntimeError("boom")

    reset_plugin_manager()
    get_plugin_manager().register(Broken(), name="broken")
    try:
        hints = hints_for({"subsystem": "cpu", "evidence": []},
                          ctx(**{"cpu.psi.some_total": (1e4, 6e5, 30, "us/s")}))
        assert any("CPU contention" in x["title"] for x in hints)
    finally:
        reset_plugin_manager()
