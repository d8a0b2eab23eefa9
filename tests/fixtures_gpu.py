"""Synthetic raw telemetry of one node running one job on several GPUs (the NVML probe's channel
names and units, counters cumulative), for the GPU-peer and GPU-finding tests.

``gpu_node(n_gpus, faults=[(gpu, kind, start_s, end_s)], phases=[(start_s, end_s)])``: every
GPU runs the same data-parallel step; ``phases`` are spans where *every* GPU idles at once (an
evaluation loop); kinds:

* ``throttle`` -- power capped: SM clock 1980 -> 1350 MHz, ``throttle_power_cap`` 1,
  ``capped_power_s`` rising at 0.9 s/s, power at its limit;
* ``thermal`` -- the same held by the thermal limit (``capped_thermal_s``, ``throttle_sw_thermal``,
  temperature up);
* ``downtrain`` -- PCIe link gen 5 -> 3 (and its traffic halves);
* ``narrow`` -- PCIe link width 16 -> 8;
* ``foreign`` -- one process that is not the job's: ``foreign_procs`` 0 -> 1, ``foreign_mem``
  8 GiB, ``foreign_sm`` 40 %, the job's own work on that GPU slows;
* ``lost`` -- the GPU falls off the bus: ``nvml_status`` 1, every other channel NaN;
* ``xid`` -- one XID 79 event; ``ecc`` -- uncorrected ECC errors; ``remap_pending``,
  ``remap_failure`` -- the flags set; ``nvlink`` -- NVLink CRC errors rising;
* ``starve`` (gpu ignored) -- the job's CPUs saturated (``cpu.run.usage`` at its core limit),
  every GPU's utilisation falls.
"""
from __future__ import annotations

import numpy as np

from reveal_plugins.types import ChannelMeta

T0 = 1.7e9
IV = 0.1
GiB = 2.0 ** 30
CORES = 16

GPU_CHANNELS = [
    ("util_sm", "%", "gauge"), ("util_mem", "%", "gauge"), ("mem_used", "bytes", "gauge"),
    ("mem_total", "bytes", "gauge"), ("temp", "degC", "gauge"), ("memory_temp", "degC", "gauge"),
    ("clock_sm", "MHz", "gauge"), ("clock_mem", "MHz", "gauge"), ("clock_sm_max", "MHz", "gauge"),
    ("clock_mem_max", "MHz", "gauge"),
    ("throttle_power_cap", "flag", "gauge"), ("throttle_hw_slowdown", "flag", "gauge"),
    ("throttle_sync_boost", "flag", "gauge"), ("throttle_sw_thermal", "flag", "gauge"),
    ("throttle_hw_thermal", "flag", "gauge"), ("throttle_hw_power_brake", "flag", "gauge"),
    ("throttle_idle", "flag", "gauge"),
    ("power", "W", "gauge"), ("power_limit", "W", "gauge"), ("energy", "J", "counter"),
    ("capped_power_s", "s", "counter"), ("capped_thermal_s", "s", "counter"),
    ("capped_board_s", "s", "counter"), ("capped_reliability_s", "s", "counter"),
    ("capped_sync_boost_s", "s", "counter"),
    ("pcie_tx", "bytes", "counter"), ("pcie_rx", "bytes", "counter"),
    ("pcie_replay", "replays", "counter"),
    ("pcie_link_gen", "gen", "gauge"), ("pcie_link_width", "lanes", "gauge"),
    ("pcie_link_gen_max", "gen", "gauge"), ("pcie_link_width_max", "lanes", "gauge"),
    ("ecc_corrected", "errors", "counter"), ("ecc_uncorrected", "errors", "counter"),
    ("remap_pending", "flag", "gauge"), ("remap_failure", "flag", "gauge"),
    ("nvlink_tx", "KiB", "counter"), ("nvlink_rx", "KiB", "counter"),
    ("nvlink_crc_flit_errors", "errors", "counter"), ("nvlink_replay_errors", "errors", "counter"),
    ("xid_events", "events", "counter"), ("xid_last", "xid", "gauge"),
    ("nvml_status", "state", "gauge"),
    ("foreign_procs", "processes", "gauge"), ("foreign_mem", "bytes", "gauge"),
    ("foreign_sm", "%", "gauge"),
]
CPU_CHANNELS = [
    ("cpu.all.user", "ticks", "counter"), ("cpu.all.system", "ticks", "counter"),
    ("cpu.all.idle", "ticks", "counter"), ("cpu.all.iowait", "ticks", "counter"),
    ("cpu.all.irq", "ticks", "counter"), ("cpu.all.softirq", "ticks", "counter"),
    ("cpu.all.nice", "ticks", "counter"),
    ("cpu.run.usage", "s", "counter"), ("cpu.run.limit_cores", "cores", "gauge"),
    ("cpu.procs_running", "tasks", "gauge"), ("cpu.psi.some_total", "us", "counter"),
    ("memory.MemAvailable", "kB", "gauge"),
]


def gpu_node(n_gpus: int = 8, seconds: float = 120.0, faults=(), phases=(), seed: int = 0,
             ranks: dict[int, int] | None = None):
    """``(t, values, channels, meta, events)``: raw rows of one node and what the run
    directory would hold (meta.json's GPU identities, reveal-torchrun's rank events)."""
    rng = np.random.default_rng(seed)
    t = T0 + np.arange(int(seconds / IV)) * IV
    rel = t - T0
    n = len(t)
    chans = [ChannelMeta(nm, u, k, "synth") for nm, u, k in CPU_CHANNELS]
    for g in range(n_gpus):
        chans += [ChannelMeta(f"gpu.{g}.{m}", u, k, "nvml") for m, u, k in GPU_CHANNELS]
    idx = {c.name: i for i, c in enumerate(chans)}
    V = np.zeros((n, len(chans)))
    rate = np.zeros((n, len(chans)))

    def on(a, b):
        return (rel >= a) & (rel < b)

    phase = np.zeros(n, bool)
    for a, b in phases:
        phase |= on(a, b)
    starve = np.zeros(n, bool)
    for g, kind, a, b in faults:
        if kind == "starve":
            starve |= on(a, b)
    # the job: 6 busy cores of its 8, more when starved (data loading), less in eval phases
    job = np.clip(6 + 0.3 * rng.standard_normal(n) + 2.0 * starve - 3.0 * phase, 0.5, 8.0)
    node = job + 0.1 + 0.02 * rng.random(n)
    rate[:, idx["cpu.all.user"]] = 0.85 * node * 100
    rate[:, idx["cpu.all.system"]] = 0.15 * node * 100
    rate[:, idx["cpu.all.idle"]] = (CORES - node) * 100
    rate[:, idx["cpu.all.iowait"]] = 0.2 * rng.random(n)
    rate[:, idx["cpu.all.irq"]] = 0.5
    rate[:, idx["cpu.all.softirq"]] = 0.5 + 0.1 * rng.random(n)
    rate[:, idx["cpu.all.nice"]] = 0.0
    rate[:, idx["cpu.run.usage"]] = job
    V[:, idx["cpu.run.limit_cores"]] = 8.0
    V[:, idx["cpu.procs_running"]] = np.round(6 + rng.random(n) + 3 * starve)
    rate[:, idx["cpu.psi.some_total"]] = 5000 * rng.random(n) + 400_000 * starve
    V[:, idx["memory.MemAvailable"]] = 400e6 + 1e5 * rng.standard_normal(n)
    for g in range(n_gpus):
        p = f"gpu.{g}."

        def put(m, x, counter=False):
            (rate if counter else V)[:, idx[p + m]] = x

        busy = np.where(phase, 8.0, 97.0) + rng.normal(0, 1.0, n)
        busy = np.where(starve, 35.0 + rng.normal(0, 3.0, n), busy)
        clock = 1980 + rng.normal(0, 3, n)
        power = np.where(phase, 150, 620) + rng.normal(0, 8, n)
        temp = np.where(phase, 45, 62) + rng.normal(0, 0.4, n)
        gen, width = np.full(n, 5.0), np.full(n, 16.0)
        pcie = np.where(phase, 0.1e9, 6e9) * (1 + 0.05 * rng.standard_normal(n))
        nvl = np.where(phase, 1e3, 4e7) * (1 + 0.05 * rng.standard_normal(n))
        flags = {f: np.zeros(n) for f in ("throttle_power_cap", "throttle_sw_thermal",
                                          "throttle_hw_slowdown", "throttle_hw_thermal")}
        capped = {c: np.zeros(n) for c in ("capped_power_s", "capped_thermal_s")}
        status = np.zeros(n)
        fprocs, fmem, fsm = np.zeros(n), np.zeros(n), np.zeros(n)
        xid, xid_last, ecc, nvl_err = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
        remap_p, remap_f = np.zeros(n), np.zeros(n)
        lost = np.zeros(n, bool)
        for fg, kind, a, b in faults:
            if fg != g or kind == "starve":
                continue
            w = on(a, b)
            if kind in ("throttle", "thermal"):
                clock[w] = 1350 + rng.normal(0, 5, w.sum())
                if kind == "throttle":
                    power[w] = 700 + rng.normal(0, 1, w.sum())
                    flags["throttle_power_cap"][w] = 1
                    capped["capped_power_s"][w] = 0.9
                else:
                    temp[w] = 88 + rng.normal(0, 0.4, w.sum())
                    flags["throttle_sw_thermal"][w] = 1
                    capped["capped_thermal_s"][w] = 0.9
            elif kind == "downtrain":
                gen[w] = 3
                pcie[w] *= 0.5
            elif kind == "narrow":
                width[w] = 8
                pcie[w] *= 0.5
            elif kind == "foreign":
                fprocs[w], fmem[w], fsm[w] = 1, 8 * GiB, 40
            elif kind == "lost":
                lost |= rel >= a
            elif kind == "xid":
                k = np.nonzero(w)[0][0]
                xid[k] = 1 / IV
                xid_last[k:] = 79
            elif kind == "ecc":
                ecc[w] = 0.5
            elif kind == "remap_pending":
                remap_p[w] = 1
            elif kind == "remap_failure":
                remap_f[w] = 1
            elif kind == "nvlink":
                nvl_err[w] = 3.0
        put("util_sm", np.clip(busy, 0, 100))
        put("util_mem", np.clip(0.6 * busy, 0, 100))
        put("mem_used", 60 * GiB + fmem)
        put("mem_total", 141 * GiB)
        put("temp", temp)
        put("memory_temp", temp + 8)
        put("clock_sm", clock)
        put("clock_mem", np.full(n, 2619.0))
        put("clock_sm_max", np.full(n, 1980.0))
        put("clock_mem_max", np.full(n, 2619.0))
        for f, x in flags.items():
            put(f, x)
        for f in ("throttle_sync_boost", "throttle_hw_power_brake"):
            put(f, np.zeros(n))
        put("throttle_idle", phase.astype(float))
        put("power", power)
        put("power_limit", np.full(n, 700.0))
        put("energy", power, True)
        for c, x in capped.items():
            put(c, x, True)
        for c in ("capped_board_s", "capped_reliability_s", "capped_sync_boost_s"):
            put(c, np.zeros(n), True)
        put("pcie_tx", pcie, True)
        put("pcie_rx", pcie * 0.8, True)
        put("pcie_replay", np.zeros(n), True)
        put("pcie_link_gen", gen)
        put("pcie_link_width", width)
        put("pcie_link_gen_max", np.full(n, 5.0))
        put("pcie_link_width_max", np.full(n, 16.0))
        put("ecc_corrected", np.zeros(n), True)
        put("ecc_uncorrected", ecc, True)
        put("remap_pending", remap_p)
        put("remap_failure", remap_f)
        put("nvlink_tx", nvl, True)
        put("nvlink_rx", nvl, True)
        put("nvlink_crc_flit_errors", nvl_err, True)
        put("nvlink_replay_errors", np.zeros(n), True)
        put("xid_events", xid, True)
        put("xid_last", xid_last)
        put("nvml_status", status)
        put("foreign_procs", fprocs)
        put("foreign_mem", fmem)
        put("foreign_sm", fsm)
        if lost.any():
            for m, _, _ in GPU_CHANNELS:
                V[lost, idx[p + m]] = np.nan
                rate[lost, idx[p + m]] = 0.0
            V[lost, idx[p + "nvml_status"]] = 1.0
    counter = np.array([c.kind == "counter" for c in chans])
    cum = np.cumsum(np.round(rate * IV, 6), axis=0)
    V[:, counter] = cum[:, counter]
    for g, kind, a, _ in faults:      # a lost GPU's counters are not read either
        if kind == "lost":
            for m, _, k in GPU_CHANNELS:
                if k == "counter":
                    V[rel >= a, idx[f"gpu.{g}.{m}"]] = np.nan
    ranks = ranks if ranks is not None else {g: (n_gpus - 1 - g) for g in range(n_gpus)}
    meta = {"host": "gpunode01",
            "gpus": [{"index": g, "uuid": f"GPU-{g:08x}-1111-2222-3333-44445555{g:04x}",
                      "pci_bus_id": f"00000000:{0x18 + 0x10 * g:02X}:00.0", "minor": g,
                      "name": "NVIDIA H200"} for g in range(n_gpus)]}
    events = [{"event": "rank", "t": T0 + 1.0, "rank": r, "local_rank": r, "gpu": g,
               "gpu_uuid": meta["gpus"][g]["uuid"], "gpu_source": "nvml"}
              for g, r in ranks.items()]
    return t, V, chans, meta, events


def write_gpu_run(run_dir: str, **kw) -> str:
    """A run directory (meta.json, events.jsonl, segments) of :func:`gpu_node`."""
    import json
    import os

    from reveal_plugins.store.store import SegmentWriter, write_meta

    t, V, chans, meta, events = gpu_node(**kw)
    os.makedirs(run_dir, exist_ok=True)
    w = SegmentWriter(run_dir, chans)
    for i in range(len(t)):
        w.add(float(t[i]), V[i])
    w.flush()
    full = {"schema": "reveal.run/1", "host": meta["host"],
            "run": {"run_id": os.path.basename(run_dir), "run_dir": run_dir, "source": "local",
                    "host": meta["host"], "command": ["train.py"]},
            "interval_s": IV, "channels": [c.to_dict() for c in chans],
            "probes": [{"name": "nvml", "available": True, "reason": None,
                        "channels": len(chans)}],
            "start": float(t[0]), "end": float(t[-1]) + IV, "exit_code": 0, "steps": [],
            "gpus": meta["gpus"]}
    write_meta(run_dir, full)
    with open(os.path.join(run_dir, "events.jsonl"), "a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
    return run_dir
