"""Report fixtures: a synthetic but realistic run directory (real store, real channel names)
with a CPU-contention and an I/O episode, iteration markers, and a matching report.json.

``make_run`` is also used by ``benchmarks/report/`` to build a 2-hour run."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from reveal_plugins.store.store import SegmentWriter, append_event, write_meta
from reveal_plugins.types import ChannelMeta

T0 = 1_780_000_000.0
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _channels(cores: int, gpus: int) -> list[ChannelMeta]:
    ch = []
    for who in ["all"] + [f"core{i}" for i in range(cores)]:
        ch += [ChannelMeta(f"cpu.{who}.{f}", "ticks", "counter", "procfs.stat") for f in CPU_FIELDS]
    ch += [ChannelMeta("cpu.procs_running", "tasks", "gauge", "procfs.stat"),
           ChannelMeta("cpu.psi.some_total", "us", "counter", "psi.cpu"),
           ChannelMeta("cpu.psi.some_avg10", "%", "gauge", "psi.cpu"),
           ChannelMeta("memory.MemTotal", "kB", "gauge", "procfs.meminfo"),
           ChannelMeta("memory.MemAvailable", "kB", "gauge", "procfs.meminfo"),
           ChannelMeta("memory.psi.some_total", "us", "counter", "psi.memory"),
           ChannelMeta("memory.vm.pgmajfault", "count", "counter", "procfs.vmstat"),
           ChannelMeta("storage.psi.some_total", "us", "counter", "psi.io")]
    for d in ("sda", "sda1"):
        ch += [ChannelMeta(f"storage.{d}.{f}", u, "counter", "procfs.diskstats")
               for f, u in (("read_sectors", "sectors"), ("write_sectors", "sectors"),
                            ("io_ms", "ms"))]
    for i in ("eth0", "lo"):
        ch += [ChannelMeta(f"network.{i}.{f}", "bytes", "counter", "procfs.netdev")
               for f in ("rx_bytes", "tx_bytes")]
    ch.append(ChannelMeta("network.tcp.RetransSegs", "count", "counter", "procfs.snmp"))
    for g in range(gpus):
        # the NVML probe's names and units
        ch += [ChannelMeta(f"gpu.{g}.util_sm", "%", "gauge", "nvml"),
               ChannelMeta(f"gpu.{g}.mem_used", "bytes", "gauge", "nvml"),
               ChannelMeta(f"gpu.{g}.mem_total", "bytes", "gauge", "nvml"),
               ChannelMeta(f"gpu.{g}.power", "W", "gauge", "nvml"),
               ChannelMeta(f"gpu.{g}.temp", "degC", "gauge", "nvml"),
               ChannelMeta(f"gpu.{g}.clock_sm", "MHz", "gauge", "nvml")]
    return ch


def make_run(run_dir: str, seconds: float = 120.0, interval: float = 0.5, cores: int = 2,
             gpus: int = 1, cpu_episode=(40.0, 70.0), io_episode=(90.0, 100.0),
             iterations: bool = True, host: str = "node01", job_id: str | None = "4242",
             exit_code: int = 0, seed: int = 0, segment_s: float = 10.0,
             extra_gauges: int = 0) -> dict:
    """Write a run directory; returns its meta dict.  Episodes are (start, end) offsets in s."""
    rng = np.random.default_rng(seed)
    os.makedirs(run_dir, exist_ok=True)
    chans = _channels(cores, gpus)
    chans += [ChannelMeta(f"system.extra{i}", "count", "gauge", "synthetic")
              for i in range(extra_gauges)]
    names = [c.name for c in chans]
    idx = {n: i for i, n in enumerate(names)}
    n = int(seconds / interval) + 1
    t = T0 + np.arange(n) * interval
    off = t - T0
    in_cpu = (off >= cpu_episode[0]) & (off < cpu_episode[1]) if cpu_episode else np.zeros(n, bool)
    in_io = (off >= io_episode[0]) & (off < io_episode[1]) if io_episode else np.zeros(n, bool)
    V = np.zeros((n, len(chans)))
    busy = np.clip(np.where(in_cpu, 0.99, 0.45) + rng.normal(0, 0.03, n), 0, 1)
    iow = np.where(in_io, 0.3, 0.01)
    ticks = 100 * interval * cores
    for who in ["all"] + [f"core{i}" for i in range(cores)]:
        scale = 1 if who == "all" else 1 / cores
        d_user = ticks * scale * busy * 0.85
        d_sys = ticks * scale * busy * 0.15
        d_iow = ticks * scale * (1 - busy) * iow
        d_idle = ticks * scale - d_user - d_sys - d_iow
        for f, d in (("user", d_user), ("system", d_sys), ("idle", d_idle), ("iowait", d_iow)):
            V[:, idx[f"cpu.{who}.{f}"]] = np.cumsum(np.round(d))
    V[:, idx["cpu.procs_running"]] = np.where(in_cpu, 5, 1) + rng.integers(0, 2, n)
    psi = np.where(in_cpu, 0.6, 0.01) * interval * 1e6
    V[:, idx["cpu.psi.some_total"]] = np.cumsum(psi)
    V[:, idx["cpu.psi.some_avg10"]] = np.where(in_cpu, 60, 1.0)
    V[:, idx["memory.MemTotal"]] = 24 * 1024 ** 2
    V[:, idx["memory.MemAvailable"]] = 24 * 1024 ** 2 - (6 + rng.normal(0, 0.05, n)) * 1024 ** 2
    V[:, idx["memory.psi.some_total"]] = np.cumsum(np.full(n, 0.001 * interval * 1e6))
    V[:, idx["memory.vm.pgmajfault"]] = np.cumsum(rng.integers(0, 3, n))
    V[:, idx["storage.psi.some_total"]] = np.cumsum(np.where(in_io, 0.4, 0.005) * interval * 1e6)
    wr = np.where(in_io, 200e6, 2e6) * interval / 512
    for d in ("sda", "sda1"):
        V[:, idx[f"storage.{d}.read_sectors"]] = np.cumsum(np.full(n, 1e6 * interval / 512))
        V[:, idx[f"storage.{d}.write_sectors"]] = np.cumsum(np.round(wr))
        V[:, idx[f"storage.{d}.io_ms"]] = np.cumsum(np.where(in_io, 900, 20) * interval)
    for i, rate in (("eth0", 5e6), ("lo", 1e5)):
        V[:, idx[f"network.{i}.rx_bytes"]] = np.cumsum(np.full(n, rate * interval))
        V[:, idx[f"network.{i}.tx_bytes"]] = np.cumsum(np.full(n, rate * interval / 2))
    V[:, idx["network.tcp.RetransSegs"]] = np.cumsum(rng.integers(0, 2, n))
    for g in range(gpus):
        V[:, idx[f"gpu.{g}.util_sm"]] = np.clip(np.where(in_cpu, 35, 92) + rng.normal(0, 3, n), 0, 100)
        V[:, idx[f"gpu.{g}.mem_used"]] = 30 * 1024 ** 3
        V[:, idx[f"gpu.{g}.mem_total"]] = 80 * 1024 ** 3
        V[:, idx[f"gpu.{g}.power"]] = np.where(in_cpu, 150, 280) + rng.normal(0, 5, n)
        V[:, idx[f"gpu.{g}.temp"]] = 65 + rng.normal(0, 0.5, n)
        V[:, idx[f"gpu.{g}.clock_sm"]] = 1980.0
    for i in range(extra_gauges):
        V[:, idx[f"system.extra{i}"]] = rng.normal(100, 10, n)
    w = SegmentWriter(run_dir, chans, segment_s=segment_s)
    for k in range(n):
        w.add(float(t[k]), V[k])
    w.flush()
    append_event(run_dir, "run_start", t=T0)
    append_event(run_dir, "step_start", t=T0, step_id="0")
    if iterations:
        tt, step = T0 + 2.0, 0
        while tt < T0 + seconds - 1:
            o = tt - T0
            dt = 0.45 if (cpu_episode and cpu_episode[0] <= o < cpu_episode[1]) else 0.2
            dt *= 1 + rng.normal(0, 0.03)
            tt += dt
            append_event(run_dir, "iteration", t=tt, rank=0, step=step, dt=dt)
            step += 1
    end = float(t[-1])
    append_event(run_dir, "step_end", t=end, step_id="0", exit_code=exit_code)
    append_event(run_dir, "run_end", t=end, exit_code=exit_code)
    meta = {
        "schema": "reveal.run/1",
        "run": {"run_id": f"{job_id or 'local'}-{host}", "run_dir": run_dir,
                "source": "slurm" if job_id else "local", "host": host, "job_id": job_id,
                "step_id": None, "user": "alice", "uid": 1000, "gid": 1000,
                "command": ["python", "examples/train.py", "--model", "cnn", "--seconds",
                            str(int(seconds))],
                "pids": [], "cgroup": None, "gpus": None, "extra": {}},
        "host": host, "interval_s": interval,
        "probes": [{"name": "procfs.stat", "available": True, "reason": None, "channels": 27},
                   {"name": "nvml", "available": gpus > 0,
                    "reason": None if gpus else "no NVIDIA driver (libnvidia-ml.so.1 not found)",
                    "channels": 5 * gpus},
                   {"name": "perf", "available": False,
                    "reason": "hardware counters not supported in this VM", "channels": 0}],
        "channels": [c.to_dict() for c in chans],
        "start": T0, "end": end, "exit_code": exit_code,
        "steps": [{"step_id": "0", "start": T0, "end": end, "exit_code": exit_code}],
        "agent": {"pid": 1, "version": "0.1.0"},
    }
    write_meta(run_dir, meta)
    return meta


def make_report(meta: dict, anomalies: bool = True, samples: int | None = None) -> dict:
    """A report.json for a run made by :func:`make_run` (hand-written, as the pipeline would)."""
    run = meta["run"]
    start = meta["start"]
    an = []
    if anomalies:
        an = [
            {"id": "a1", "start": start + 40, "end": start + 70, "node": run["host"],
             "step_id": "0", "subsystem": "cpu", "score": 8.3,
             "title": "CPU contention from processes outside the job",
             "evidence": [
                 {"channel": "cpu.psi.some_total", "deviation": 14.2, "baseline": 10000.0,
                  "observed": 600000.0, "unit": "us/s"},
                 {"channel": "cpu.procs_running", "deviation": 9.1, "baseline": 1.5,
                  "observed": 5.5, "unit": "tasks"},
                 {"channel": "gpu.0.util_sm", "deviation": -7.5, "baseline": 92.0,
                  "observed": 35.0, "unit": "%"},
                 {"channel": "cpu.all.user", "deviation": 6.0, "baseline": 76.0,
                  "observed": 168.0}],
             "hints": [
                 {"title": "CPU contention: other processes compete with the job's threads",
                  "why": "Runnable tasks waited for a CPU 60 % of the time (PSI cpu some), "
                         "while GPU utilization fell from 92 % to 35 %.",
                  "action": "Find the competing processes with `top -o %CPU`; on Slurm run the "
                            "job with `srun --exclusive` or `--cpus-per-task` and bind with "
                            "`--cpu-bind=cores`.",
                  "severity": "critical"},
                 {"title": "Data loader threads may be starved",
                  "why": "Input pipeline threads need free cores.",
                  "action": "Set DataLoader(num_workers=N) to the cores you own minus one.",
                  "severity": "info"}]},
            {"id": "a2", "start": start + 90, "end": start + 100, "node": run["host"],
             "step_id": "0", "subsystem": "storage", "score": 5.1,
             "evidence": [
                 {"channel": "storage.psi.some_total", "deviation": 11.0, "baseline": 5000.0,
                  "observed": 400000.0},
                 {"channel": "storage.sda.write_sectors", "deviation": 8.0, "baseline": 3906.0,
                  "observed": 390625.0}],
             "hints": [
                 {"title": "I/O stalls: the disk is saturated by writes",
                  "why": "Tasks waited on I/O 40 % of the time while writes rose to 200 MB/s.",
                  "action": "Move checkpoints to node-local NVMe ($TMPDIR) or write them "
                            "asynchronously; check `iostat -x 1` for the busy device.",
                  "severity": "warning"}]},
        ]
    n = samples if samples is not None else int((meta["end"] - start) / meta["interval_s"]) + 1
    return {
        "schema": "reveal.report/1", "status": "ok",
        "run": {"source": run["source"], "job_id": run["job_id"], "step_id": run["step_id"],
                "user": run["user"], "command": run["command"], "exit_code": meta["exit_code"],
                "start": start, "end": meta["end"], "nodes": [run["host"]],
                "steps": [{"step_id": s["step_id"], "start": s["start"], "end": s["end"]}
                          for s in meta["steps"]]},
        "telemetry": {"interval_s": meta["interval_s"], "samples": n,
                      "channels": len(meta["channels"]), "bytes_stored": 123456,
                      "probes": [{"name": p["name"], "available": p["available"],
                                  "reason": p["reason"]} for p in meta["probes"]]},
        "anomalies": an,
        "analysis": {"window_s": 3.0, "stride_s": 1.0, "windows": 118, "channels_in": len(
            meta["channels"]), "channels_analysed": 31, "detectors": ["robust_z", "pca",
                                                                     "iforest"]},
        "summary": ("2 anomalies: CPU contention (30 s, iteration time ×2.2) and an I/O "
                    "stall (10 s)." if anomalies else "No anomalies found in 118 windows."),
    }


@pytest.fixture
def report_run(tmp_path):
    """(run_dir, report) of a 2-minute run with a CPU and a storage anomaly."""
    d = str(tmp_path / "run")
    meta = make_run(d)
    rep = make_report(meta)
    with open(os.path.join(d, "report.json"), "w") as f:
        json.dump(rep, f)
    return d, rep


def make_empty_run(run_dir: str, host: str = "node01") -> dict:
    """A run that ended before the first sample: meta.json and events, no segments."""
    os.makedirs(run_dir, exist_ok=True)
    append_event(run_dir, "run_start", t=T0)
    append_event(run_dir, "run_end", t=T0 + 0.05, exit_code=1)
    meta = {"schema": "reveal.run/1",
            "run": {"run_id": "local-x", "run_dir": run_dir, "source": "local", "host": host,
                    "job_id": None, "step_id": None, "user": "bob", "uid": 1001, "gid": 1001,
                    "command": ["false"], "pids": [], "cgroup": None, "gpus": None, "extra": {}},
            "host": host, "interval_s": 0.1, "probes": [], "channels": [],
            "start": T0, "end": T0 + 0.05, "exit_code": 1, "steps": [],
            "agent": {"pid": 1, "version": "0.1.0"}}
    write_meta(run_dir, meta)
    return meta


def empty_report(meta: dict) -> dict:
    run = meta["run"]
    return {"schema": "reveal.report/1", "status": "ok",
            "run": {"source": run["source"], "job_id": None, "step_id": None,
                    "user": run["user"], "command": run["command"], "exit_code": 1,
                    "start": meta["start"], "end": meta["end"], "nodes": [run["host"]],
                    "steps": []},
            "telemetry": {"interval_s": 0.1, "samples": 0, "channels": 0, "bytes_stored": 0,
                          "probes": []},
            "anomalies": [], "summary": "No samples were recorded."}
