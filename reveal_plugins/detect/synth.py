"""Synthetic host telemetry with the procfs probe's channel layout, for tests and the
performance benchmark (not used by the analysis itself).

``SynthHost(n_cores).chunk(t)`` returns raw rows (counters cumulative) for timestamps ``t``;
anomalies are injected as ``(kind, start_s, end_s)`` relative to the first timestamp, with kind
in cpu | memory | storage | network | steal.
"""
from __future__ import annotations

import numpy as np

from ..types import ChannelMeta

_TICKS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


class SynthHost:
    def __init__(self, n_cores: int = 2, t0: float = 1.7e9, seed: int = 0,
                 anomalies: list[tuple[str, float, float]] | None = None,
                 extra_gauges: int = 0):
        self.n_cores = n_cores
        self.t0 = t0
        self.rng = np.random.default_rng(seed)
        self.anomalies = anomalies or []
        ch: list[ChannelMeta] = []

        def add(name: str, unit: str, kind: str) -> None:
            ch.append(ChannelMeta(name, unit, kind, "synth"))

        for k in _TICKS:
            add(f"cpu.all.{k}", "ticks", "counter")
        for c in range(n_cores):
            for k in _TICKS:
                add(f"cpu.core{c}.{k}", "ticks", "counter")
        add("cpu.procs_running", "", "gauge")
        add("cpu.procs_blocked", "", "gauge")
        add("cpu.ctxt", "", "counter")
        add("cpu.intr", "", "counter")
        add("cpu.load1", "", "gauge")
        add("cpu.psi.some_total", "us", "counter")
        add("memory.MemTotal", "kB", "gauge")
        add("memory.MemAvailable", "kB", "gauge")
        add("memory.MemFree", "kB", "gauge")
        add("memory.Cached", "kB", "gauge")
        add("memory.vm.pgfault", "", "counter")
        add("memory.vm.pgmajfault", "", "counter")
        add("memory.psi.some_total", "us", "counter")
        add("memory.psi.full_total", "us", "counter")
        for f, u in (("read_bytes", "B"), ("write_bytes", "B"), ("reads", ""), ("writes", ""),
                     ("io_ticks", "ms"), ("time_in_queue", "ms")):
            add(f"storage.sda.{f}", u, "counter")
        if any(k == "ownio" for k, _, _ in self.anomalies):
            add("storage.run.write_bytes", "B", "counter")   # the run's own writes
        add("storage.psi.some_total", "us", "counter")
        add("storage.psi.full_total", "us", "counter")
        for f, u in (("rx_bytes", "B"), ("tx_bytes", "B"), ("rx_packets", ""),
                     ("tx_packets", "")):
            add(f"network.eth0.{f}", u, "counter")
        add("network.tcp.RetransSegs", "", "counter")
        if any(k == "shaped" for k, _, _ in self.anomalies):   # the qdisc probe's channels
            add("network.eth0.qdisc_backlog", "bytes", "gauge")
            add("network.eth0.qdisc_qlen", "packets", "gauge")
            add("network.eth0.qdisc_drops", "packets", "counter")
            add("network.eth0.qdisc_overlimits", "packets", "counter")
        add("system.uptime", "s", "gauge")
        for i in range(extra_gauges):
            add(f"system.extra{i}", "", "gauge")
        self.channels = ch
        self.idx = {c.name: i for i, c in enumerate(ch)}
        self._cum = np.zeros(len(ch))
        self._last_t: float | None = None

    def active(self, rel: np.ndarray, kind: str) -> np.ndarray:
        a = np.zeros(len(rel), bool)
        for k, s, e in self.anomalies:
            if k == kind:
                a |= (rel >= s) & (rel < e)
        return a

    def chunk(self, t: np.ndarray) -> np.ndarray:
        """Raw rows for timestamps ``t`` (continuing from the previous chunk)."""
        n = len(t)
        rng = self.rng
        rel = t - self.t0
        prev = self._last_t if self._last_t is not None else t[0] - (t[1] - t[0] if n > 1 else .1)
        dt = np.diff(np.concatenate([[prev], t]))
        self._last_t = float(t[-1])
        V = np.zeros((n, len(self.channels)))
        rate = np.zeros((n, len(self.channels)))
        cpu_a, mem_a = self.active(rel, "cpu"), self.active(rel, "memory")
        sto_a, net_a = self.active(rel, "storage"), self.active(rel, "network")
        steal_a = self.active(rel, "steal")
        # "shaped": a tbf on the link, as `tc qdisc ... tbf rate 2mbit` does to a DDP job:
        # ~1.5 MB/s fewer bytes (lost in the link's noise), the job waiting (less CPU), a small
        # standing queue, packets held back for the rate (overlimits); no loss, no retransmits
        shp_a = self.active(rel, "shaped")
        # "ownio": the run's own checkpoint, its writes and what they do to the device
        own_a = self.active(rel, "ownio")
        dev_a = sto_a | own_a
        # training loop: ~80 % busy with an iteration ripple
        busy = 0.8 + 0.05 * np.sin(2 * np.pi * rel / 0.7) + 0.03 * rng.standard_normal(n)
        busy = np.clip(busy + 0.18 * cpu_a + 0.1 * mem_a - 0.45 * shp_a, 0.05, 0.99)
        iow = np.clip(0.003 + 0.002 * rng.standard_normal(n) + 0.35 * dev_a, 0, 0.5)
        steal = np.clip(0.001 * rng.random(n) + 0.3 * steal_a, 0, 0.5)
        hz = 100.0 * self.n_cores
        shares = {"user": busy * 0.85, "nice": np.zeros(n) + 0.0005 * rng.random(n),
                  "system": busy * 0.15, "idle": 1 - busy - iow - steal, "iowait": iow,
                  "irq": 0.001 + 0 * busy, "softirq": 0.002 + 0.001 * rng.random(n),
                  "steal": steal}
        for k, s in shares.items():
            rate[:, self.idx[f"cpu.all.{k}"]] = np.clip(s, 0, 1) * hz
            for c in range(self.n_cores):
                jitter = 1 + 0.05 * rng.standard_normal(n)
                rate[:, self.idx[f"cpu.core{c}.{k}"]] = np.clip(s * jitter, 0, 1) * 100.0
        V[:, self.idx["cpu.procs_running"]] = np.maximum(
            1, np.round(2 + 0.5 * rng.standard_normal(n) + 4 * cpu_a + 2 * mem_a))
        V[:, self.idx["cpu.procs_blocked"]] = np.maximum(0, np.round(
            0.1 * rng.random(n) + 2 * sto_a))
        rate[:, self.idx["cpu.ctxt"]] = 4000 * (1 + 0.1 * rng.standard_normal(n) + cpu_a)
        rate[:, self.idx["cpu.intr"]] = 2000 * (1 + 0.1 * rng.standard_normal(n))
        V[:, self.idx["cpu.load1"]] = 2 + 0.1 * np.sin(rel / 60) + 3 * cpu_a
        rate[:, self.idx["cpu.psi.some_total"]] = np.clip(
            20000 * rng.random(n) + 500000 * cpu_a + 100000 * mem_a, 0, 1e6)
        V[:, self.idx["memory.MemTotal"]] = 24e6
        V[:, self.idx["memory.MemAvailable"]] = 20e6 + 1e5 * rng.standard_normal(n) - 8e6 * mem_a
        V[:, self.idx["memory.MemFree"]] = 10e6 + 1e5 * rng.standard_normal(n) - 6e6 * mem_a
        V[:, self.idx["memory.Cached"]] = 9e6 + 5e4 * rng.standard_normal(n) - 2e6 * mem_a
        rate[:, self.idx["memory.vm.pgfault"]] = 5000 * (1 + 0.2 * rng.random(n) + 20 * mem_a)
        rate[:, self.idx["memory.vm.pgmajfault"]] = 0.5 * rng.random(n) + 50 * mem_a
        rate[:, self.idx["memory.psi.some_total"]] = 1000 * rng.random(n) + 200000 * mem_a
        rate[:, self.idx["memory.psi.full_total"]] = 500 * rng.random(n) + 100000 * mem_a
        rate[:, self.idx["storage.sda.read_bytes"]] = 2e5 * rng.random(n) + 80e6 * sto_a
        rate[:, self.idx["storage.sda.write_bytes"]] = 5e5 * rng.random(n) + 60e6 * dev_a
        rate[:, self.idx["storage.sda.reads"]] = 5 * rng.random(n) + 600 * sto_a
        rate[:, self.idx["storage.sda.writes"]] = 10 * rng.random(n) + 400 * dev_a
        rate[:, self.idx["storage.sda.io_ticks"]] = 20 * rng.random(n) + 900 * dev_a
        rate[:, self.idx["storage.sda.time_in_queue"]] = 30 * rng.random(n) + 5000 * dev_a
        rate[:, self.idx["storage.psi.some_total"]] = 2000 * rng.random(n) + 400000 * dev_a
        rate[:, self.idx["storage.psi.full_total"]] = 1000 * rng.random(n) + 300000 * dev_a
        if "storage.run.write_bytes" in self.idx:
            rate[:, self.idx["storage.run.write_bytes"]] = 1e4 * rng.random(n) + 60e6 * own_a
        nf = 1 - 0.9 * net_a - 0.03 * shp_a    # (the job's share of a busy link)
        rate[:, self.idx["network.eth0.rx_bytes"]] = 50e6 * nf * (1 + 0.1 * rng.standard_normal(n))
        rate[:, self.idx["network.eth0.tx_bytes"]] = 50e6 * nf * (1 + 0.1 * rng.standard_normal(n))
        rate[:, self.idx["network.eth0.rx_packets"]] = 35000 * nf * (1 + 0.1 * rng.random(n))
        rate[:, self.idx["network.eth0.tx_packets"]] = 35000 * nf * (1 + 0.1 * rng.random(n))
        rate[:, self.idx["network.tcp.RetransSegs"]] = 0.2 * rng.random(n) + 40 * net_a
        if "network.eth0.qdisc_backlog" in self.idx:
            V[:, self.idx["network.eth0.qdisc_backlog"]] = shp_a * rng.choice(
                [0.0, 10816.0, 21632.0], n)
            V[:, self.idx["network.eth0.qdisc_qlen"]] = shp_a * rng.choice([0.0, 1.0, 2.0], n)
            rate[:, self.idx["network.eth0.qdisc_overlimits"]] = shp_a * (90 + 20 * rng.random(n))
        V[:, self.idx["system.uptime"]] = 1000 + rel
        for i in range(len(self.channels)):
            if self.channels[i].name.startswith("system.extra"):
                V[:, i] = 100 + 10 * np.sin(rel / (5 + i % 17)) + rng.standard_normal(n)
        rate = np.maximum(rate, 0)
        counter = np.array([c.kind == "counter" for c in self.channels])
        inc = np.round(rate * dt[:, None])
        cum = self._cum + np.cumsum(inc, axis=0)
        self._cum = cum[-1].copy()
        V[:, counter] = cum[:, counter]
        return V

    def frame(self, duration_s: float, interval_s: float = 0.1):
        t = self.t0 + np.arange(int(duration_s / interval_s)) * interval_s
        return t, self.chunk(t), self.channels

    def write_run(self, run_dir: str, duration_s: float, interval_s: float = 0.1,
                  chunk_s: float = 60.0, meta_extra: dict | None = None) -> str:
        """Write a run directory (meta.json + segments) without holding it all in memory."""
        import os

        from ..store.store import SegmentWriter, write_meta

        os.makedirs(run_dir, exist_ok=True)
        w = SegmentWriter(run_dir, self.channels)
        n = int(duration_s / interval_s)
        per = int(chunk_s / interval_s)
        for a in range(0, n, per):
            t = self.t0 + np.arange(a, min(n, a + per)) * interval_s
            V = self.chunk(t)
            for i in range(len(t)):
                w.add(float(t[i]), V[i])
        w.flush()
        meta = {"schema": "reveal.run/1", "host": "synth",
                "run": {"run_id": os.path.basename(run_dir), "run_dir": run_dir,
                        "source": "local", "host": "synth", "command": ["synthetic"]},
                "interval_s": interval_s, "channels": [c.to_dict() for c in self.channels],
                "probes": [{"name": "synth", "available": True, "reason": None,
                            "channels": len(self.channels)}],
                "start": self.t0, "end": self.t0 + n * interval_s, "exit_code": 0, "steps": []}
        meta.update(meta_extra or {})
        write_meta(run_dir, meta)
        return run_dir
