"""Live metrics: hw.* names for GPUs, host metrics from a real node agent, the live anomaly
score, no job ids on metric series, and a stop that never hangs on a dead backend."""
import time

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from reveal_plugins.otel.config import OtelConfig, load_config
from reveal_plugins.otel.metrics import LiveMetrics
from reveal_plugins.types import RunInfo


class GpuHostAgent:
    """Stands in for the agent on a GPU node (this machine has no GPU): the agent interface
    the hook promises, ``latest()`` and ``runs()``, with channels named as the NVML probe names
    them."""

    def __init__(self):
        self.host = "gpunode"
        self.t = 1000.0
        self.cpu = {"user": 100.0, "nice": 0.0, "system": 50.0, "idle": 800.0, "iowait": 50.0,
                    "irq": 0.0, "softirq": 0.0, "steal": 0.0}

    def latest(self):
        self.t += 1
        for k in self.cpu:  # 25% user, 25% system, 50% idle per collection
            self.cpu[k] += {"user": 10.0, "system": 10.0, "idle": 20.0}.get(k, 0.0)
        d = {f"cpu.all.{k}": v for k, v in self.cpu.items()}
        d.update({"gpu.0.util_sm": 87.0, "gpu.0.util_mem": 40.0, "gpu.0.mem_used": 2e10,
                  "gpu.0.mem_total": 8e10, "gpu.0.power": 301.5, "gpu.0.temp": 71.0,
                  "gpu.0.energy": 12345.0, "gpu.0.throttle_hw_thermal": 1.0,
                  "gpu.0.ecc_corrected": 2.0, "gpu.0.pcie_tx": 5e9, "gpu.1.util_sm": float("nan"),
                  "memory.MemTotal": 1000.0, "memory.MemAvailable": 250.0,
                  "network.eth0.rx_bytes": 1e6, "network.eth0.tx_bytes": 2e6})
        return self.t, d

    def runs(self):
        return [RunInfo(run_id="slurm-77-gpunode", run_dir="/x", source="slurm", job_id="77",
                        user="bob")]


def _collect(reader):
    data = reader.get_metrics_data()
    out = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = [(dict(p.attributes), p.value) for p in m.data.data_points]
    return out, [rm.resource.attributes for rm in data.resource_metrics]


def test_gpu_and_host_metrics_use_semantic_convention_names():
    reader = InMemoryMetricReader()
    live = LiveMetrics(GpuHostAgent(), OtelConfig(enabled=True, metrics=True), reader=reader)
    live.start()
    live.record_finding({"subsystem": "gpu", "score": 6.5})
    live.record_finding({"subsystem": "gpu", "score": 4.0})
    _collect(reader)
    time.sleep(0.6)   # next snapshot: CPU utilisation needs two samples
    live.record_finding({"subsystem": "gpu", "score": 5.0})
    m, resources = _collect(reader)
    live.stop()
    assert m["hw.gpu.utilization"] == [({"hw.id": "gpu0", "hw.type": "gpu",
                                         "hw.gpu.task": "general"}, 0.87)]   # NaN GPU 1 skipped
    assert m["hw.gpu.memory.usage"][0][1] == 2e10
    assert m["hw.gpu.memory.limit"][0][1] == 8e10
    assert m["hw.power"][0] == ({"hw.id": "gpu0", "hw.type": "gpu"}, 301.5)
    assert m["hw.temperature"][0][1] == 71.0
    assert m["hw.energy"][0][1] == 12345.0
    assert m["hw.errors"][0][0]["error.type"] == "corrected"
    assert m["hw.gpu.io"][0][0]["network.io.direction"] == "transmit"
    assert m["reveal.gpu.throttle"][0][0]["reveal.throttle.reason"] == "hw_thermal"
    cpu = {a["cpu.mode"]: v for a, v in m["system.cpu.utilization"]}
    assert abs(cpu["user"] - 0.25) < 1e-9 and abs(cpu["idle"] - 0.5) < 1e-9
    assert ({"system.memory.state": "used"}, 750.0 * 1024) in m["system.memory.usage"]
    assert m["system.memory.utilization"][0][1] == 0.75
    assert {a["network.io.direction"] for a, _ in m["system.network.io"]} == {"receive",
                                                                              "transmit"}
    assert m["reveal.anomaly.score"] == [({"reveal.anomaly.subsystem": "gpu"}, 5.0)]
    assert m["reveal.runs.active"][0][1] == 1
    assert resources[0]["host.name"] == "gpunode"
    # cardinality: no job, user or run identity on any series or the metrics resource
    for name, points in m.items():
        for attrs, _ in points:
            assert not any(k.startswith(("reveal.job", "slurm.", "user.", "reveal.run."))
                           for k in attrs), (name, attrs)
    assert not any("job" in k for k in resources[0])


def test_real_agent_exports_host_metrics_over_http(otel_clean_env, otlp_http, tmp_path):
    from reveal_plugins.agent.daemon import Agent
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_http.endpoint)
    otel_clean_env.setenv("REVEAL_OTEL_METRICS", "1")
    otel_clean_env.setenv("REVEAL_CONFIG", str(tmp_path / "r.toml"))
    (tmp_path / "r.toml").write_text("[otel]\nmetrics_interval_s = 0.5\n")
    agent = Agent(str(tmp_path / "spool"), interval_s=0.1)
    agent.start()
    try:
        names = set()
        deadline = time.monotonic() + 10
        while "system.cpu.utilization" not in names and time.monotonic() < deadline:
            names = otlp_http.wait_metrics(timeout=1.0)
            time.sleep(0.2)
    finally:
        t = time.monotonic()
        agent.stop()
        stop_s = time.monotonic() - t
    assert {"system.cpu.utilization", "system.memory.usage", "reveal.runs.active"} <= names
    assert stop_s < 3.0


def test_stop_does_not_hang_on_a_dead_backend(otel_clean_env, otlp_blackhole):
    cfg = load_config(overrides={"endpoint": otlp_blackhole, "metrics": True,
                                 "metrics_interval_s": 60}, environ={})
    live = LiveMetrics(GpuHostAgent(), cfg)
    live.start()
    t = time.monotonic()
    live.stop(timeout_s=1.0)
    assert time.monotonic() - t < 1.4
