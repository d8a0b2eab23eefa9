#!/usr/bin/env python3
"""Telemetry benchmarks: collector CPU, stored bytes per second, per-probe sample cost.

    python benchmarks/telemetry/run.py [--duration 60] [--reps 3] [--split dev|test]
                                       [--results FILE]

1. Collector CPU at 10 Hz for the host procfs+PSI probe set, as % of one core, measured from
   the sampling process's own CPU time (getrusage around a drift-free 10 Hz loop of the real
   probes, assembling each sample into a numpy row like the agent does).  In the same window,
   Debian's ``prometheus-node-exporter`` (the same /proc sources: cpu, stat, meminfo, vmstat,
   diskstats, netdev, netstat, loadavg, pressure) runs on a loopback port and is scraped at
   10 Hz; its CPU comes from /proc/<pid>/stat.  Both run side by side, so machine noise hits
   both; the ratio is printed per repetition and as the median.
2. Stored bytes per second per host at 10 Hz, from a real ``reveal record --interval 0.1 --
   sleep D`` run (all available probes, Parquet segments + meta.json + events.jsonl); the agent
   process's CPU over the steady part of that run is reported too (every probe + storage).
3. Per-probe sample cost (CPU µs per ``sample()``), for every registered probe.

The machine is shared: medians of ``--reps`` repetitions are reported, with min–max as noise.
Results: ``benchmarks/telemetry/results/telemetry-<split>-<date>.json`` (``--results``; the
:mod:`results` header; ``--split test`` is refused from a dirty tree).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(HERE))
import results as bench_results  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"
NE_COLLECTORS = ["cpu", "stat", "meminfo", "vmstat", "diskstats", "netdev", "netstat",
                 "loadavg", "pressure"]

# The sampler runs in its own process so its CPU time is the collector's alone.
SAMPLER = r"""
import json, os, resource, sys, time
import numpy as np
from reveal_plugins.probes.procfs import PROCFS_PROBES
from reveal_plugins.probes.psi import psi_probes
interval, duration, mode = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
probes = [c() for c in PROCFS_PROBES] + psi_probes()
for p in probes:
    p.open()
probes = [p for p in probes if p.available]
if mode == "raw":  # the floor: one pread per file, no parsing, same files
    class Raw:
        def __init__(self, p):
            self.fd = os.open(p.file.path, os.O_RDONLY)
            self.channels, self.name = p.channels, p.name
            self.interval_s = p.interval_s
            self.nan = [float("nan")] * len(p.channels)
        def sample(self):
            os.pread(self.fd, 65536, 0)
            return self.nan
    probes = [Raw(p) for p in probes]
elif mode == "idle":  # the loop alone: wake up 10 times a second, build an empty row
    probes = []
slices, n = [], 0
every = []  # as the agent does: slow-moving files (Probe.interval_s) are read once a second
for p in probes:
    slices.append((n, n + len(p.channels)))
    n += len(p.channels)
    every.append(1 if mode == "every_tick" else
                 max(1, round((getattr(p, "interval_s", None) or 0) / interval)))
print(json.dumps({"ready": True, "probes": [p.name for p in probes], "channels": n}), flush=True)
sys.stdin.readline()  # go
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def sys_s():
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime
t0, c0, s0 = time.monotonic(), cpu(), sys_s()
k = 0
nxt = t0
while True:
    nxt += interval
    if nxt - t0 > duration:
        break
    row = np.full(n, np.nan)
    for p, (a, b), e in zip(probes, slices, every):
        if e == 1 or k % e == 0:
            row[a:b] = p.sample()
    k += 1
    d = nxt - time.monotonic()
    if d > 0:
        time.sleep(d)
c1, t1, s1 = cpu(), time.monotonic(), sys_s()
print(json.dumps({"cpu_s": c1 - c0, "sys_s": s1 - s0, "wall_s": t1 - t0, "samples": k}),
      flush=True)
"""


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    f = data[data.rindex(b")") + 2:].split()
    return (int(f[11]) + int(f[12])) / CLK_TCK  # utime + stime


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Scraper(threading.Thread):
    """GETs /metrics at a fixed rate (drift-free), like Prometheus at a 100 ms scrape interval."""

    def __init__(self, url: str, interval: float, duration: float):
        super().__init__(daemon=True)
        self.url, self.interval, self.duration = url, interval, duration
        self.scrapes = self.errors = 0
        self.bytes = 0

    def run(self) -> None:
        t0 = time.monotonic()
        nxt = t0
        while True:
            nxt += self.interval
            if nxt - t0 > self.duration:
                return
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    self.bytes += len(r.read())
                self.scrapes += 1
            except OSError:
                self.errors += 1
            d = nxt - time.monotonic()
            if d > 0:
                time.sleep(d)


def start_node_exporter() -> tuple[subprocess.Popen, str, int]:
    port = free_port()
    args = [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
            "--web.disable-exporter-metrics", "--collector.disable-defaults"]
    args += [f"--collector.{c}" for c in NE_COLLECTORS]
    ne = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    for _ in range(100):
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                body = r.read()
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
            return ne, url, series
        except OSError:
            time.sleep(0.1)
    ne.kill()
    raise RuntimeError(f"{NODE_EXPORTER} did not answer on {url}")


def bench_overhead(duration: float, interval: float = 0.1) -> dict:
    """One side-by-side repetition: our procfs+PSI sampler vs node-exporter scraped at 10 Hz."""
    ne, url, series = start_node_exporter()
    def spawn(mode):
        return subprocess.Popen([sys.executable, "-c", SAMPLER, str(interval), str(duration),
                                 mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    sampler, raw, idle = spawn("probes"), spawn("raw"), spawn("idle")
    alltick = spawn("every_tick")  # reference: every file read on every tick
    try:
        info = json.loads(sampler.stdout.readline())
        json.loads(raw.stdout.readline())
        json.loads(idle.stdout.readline())
        json.loads(alltick.stdout.readline())
        scraper = Scraper(url, interval, duration)
        ne_c0, t0 = proc_cpu_s(ne.pid), time.monotonic()
        for s in (sampler, raw, idle, alltick):
            s.stdin.write("go\n")
            s.stdin.flush()
        scraper.start()
        scraper.join()
        ne_c1, t1 = proc_cpu_s(ne.pid), time.monotonic()
        ours = json.loads(sampler.stdout.readline())
        floor = json.loads(raw.stdout.readline())
        loop = json.loads(idle.stdout.readline())
        every = json.loads(alltick.stdout.readline())
        for s in (sampler, raw, idle, alltick):
            s.wait(timeout=30)
    finally:
        ne.terminate()
        ne.wait(timeout=10)
        for s in (sampler, raw, idle, alltick):
            if s.poll() is None:
                s.kill()
    ours_pct = 100 * ours["cpu_s"] / ours["wall_s"]
    ne_pct = 100 * (ne_c1 - ne_c0) / (t1 - t0)
    return {
        "ours_channels": info["channels"], "ours_samples": ours["samples"],
        "ours_cpu_pct": ours_pct, "ours_us_per_sample": 1e6 * ours["cpu_s"] / ours["samples"],
        "ours_kernel_share": ours["sys_s"] / ours["cpu_s"] if ours["cpu_s"] else None,
        "raw_floor_cpu_pct": 100 * floor["cpu_s"] / floor["wall_s"],
        "raw_floor_us_per_sample": 1e6 * floor["cpu_s"] / floor["samples"],
        "idle_loop_cpu_pct": 100 * loop["cpu_s"] / loop["wall_s"],
        "every_tick_cpu_pct": 100 * every["cpu_s"] / every["wall_s"],
        "ne_series": series, "ne_scrapes": scraper.scrapes, "ne_errors": scraper.errors,
        "ne_cpu_pct": ne_pct,
        "ne_us_per_scrape": 1e6 * (ne_c1 - ne_c0) / max(1, scraper.scrapes),
        "ratio": ne_pct / ours_pct if ours_pct > 0 else float("inf"),
    }


def _children(pid: int) -> list[int]:
    out = []
    for t in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            out += [int(x) for x in open(t).read().split()]
        except OSError:
            pass
    return out


def reveal_cmd() -> list[str]:
    """The ``reveal`` command: the installed script, else the module."""
    reveal = shutil.which("reveal")
    return [reveal] if reveal else [sys.executable, "-m", "reveal_plugins.cli"]


def _find_agent(record_pid: int, timeout: float = 15.0) -> int | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for c in _children(record_pid):
            try:
                cmd = open(f"/proc/{c}/cmdline", "rb").read()
            except OSError:
                continue
            if b"reveal_plugins.agent.daemon" in cmd:
                return c
        time.sleep(0.2)
    return None


def bench_storage(duration: float, interval: float = 0.1) -> dict:
    """A real ``reveal record`` run of ``sleep duration``: bytes on disk per second."""
    tmp = tempfile.mkdtemp(prefix="reveal-bench-")
    out = os.path.join(tmp, "run")
    cmd = reveal_cmd() + ["record", "--out", out, "--interval", str(interval), "--no-analyze", "--",
            "sleep", str(duration)]
    try:
        rec = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=tmp)
        agent = _find_agent(rec.pid)
        agent_pct = None
        if agent:
            # steady state: skip imports/startup, stop before the end-of-run flush
            warm = min(5.0, duration / 4)
            time.sleep(warm)
            c0, t0 = proc_cpu_s(agent), time.monotonic()
            time.sleep(max(1.0, duration - 2 * warm))
            c1, t1 = proc_cpu_s(agent), time.monotonic()
            agent_pct = 100 * (c1 - c0) / (t1 - t0)
        log = rec.communicate(timeout=duration + 120)[0]
        if rec.returncode != 0:
            raise RuntimeError(f"reveal record failed ({rec.returncode}):\n{log[-2000:]}")
        meta = json.load(open(os.path.join(out, "meta.json")))
        segs = [p for p in glob.glob(os.path.join(out, "**", "*.parquet"), recursive=True)]
        seg_bytes = sum(os.path.getsize(p) for p in segs)
        total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(out, "**", "*"),
                                                          recursive=True) if os.path.isfile(p))
        span = (meta.get("end") or time.time()) - meta["start"]
        import pyarrow.parquet as pq
        from reveal_plugins.store.store import load_run
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in segs)
        samples = len(load_run(out).frame.t)
        return {"span_s": span, "segments": len(segs), "channels": len(meta["channels"]),
                "rows": rows, "samples": samples, "meta_bytes":
                os.path.getsize(os.path.join(out, "meta.json")),
                "segment_bytes": seg_bytes, "total_bytes": total,
                "segment_Bps": seg_bytes / span, "total_Bps": total / span,
                "steady_Bps": (total - os.path.getsize(os.path.join(out, "meta.json"))) / span,
                "agent_cpu_pct": agent_pct,
                "probes_available": [p["name"] for p in meta["probes"] if p["available"]]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_probes(n: int = 1000) -> list[dict]:
    """CPU µs per sample() of every registered probe (host ones, and run ones for this PID)."""
    from reveal_plugins.hooks import hook
    from reveal_plugins.types import RunInfo
    probes = [p for b in hook().reveal_register_probes(config={}) for p in b]
    me = RunInfo(run_id="bench", run_dir="", pids=[os.getpid()], uid=os.getuid())
    probes += [p for b in hook().reveal_register_run_probes(run=me, config={}) for p in b]
    rows = []
    for p in probes:
        p.open()
        row = {"probe": p.name, "available": p.available, "channels": len(p.channels)}
        if p.available:
            for _ in range(20):
                p.sample()
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                p.sample()
            c1, w1 = time.process_time(), time.perf_counter()
            row["cpu_us"] = 1e6 * (c1 - c0) / n
            row["wall_us"] = 1e6 * (w1 - w0) / n
        else:
            row["reason"] = p.reason
        p.close()
        rows.append(row)
    return rows


def bench_probes_cold(ticks: int = 300, interval: float = 0.1) -> list[dict]:
    """CPU µs per ``sample()`` as the agent pays it: every probe at its own schedule in a
    10 Hz loop, so caches are cold after each 100 ms sleep; and, for the probes backed by one
    procfs file, the cost of a bare ``pread`` of that file in the same loop (the kernel's
    share, which no parsing change can remove).  The run probe follows a ``sleep`` process
    (the process-tree mode of ``reveal record``)."""
    from reveal_plugins.hooks import hook
    from reveal_plugins.types import RunInfo
    child = subprocess.Popen(["sleep", str(ticks * interval + 30)])
    try:
        probes = [p for b in hook().reveal_register_probes(config={}) for p in b]
        run = RunInfo(run_id="bench", run_dir="", pids=[child.pid], uid=os.getuid())
        probes += [p for b in hook().reveal_register_run_probes(run=run, config={}) for p in b]
        for p in probes:
            p.open()
        probes = [p for p in probes if p.available and p.channels]
        every = [max(1, round((p.interval_s or 0) / interval)) for p in probes]
        files = {p.name: os.open(p.file.path, os.O_RDONLY) for p in probes
                 if getattr(getattr(p, "file", None), "path", None)}
        cost = {p.name: 0.0 for p in probes}
        raw = {n: 0.0 for n in files}
        calls = {p.name: 0 for p in probes}
        c_loop = time.thread_time()
        for k in range(ticks):
            time.sleep(interval)
            for p, n in zip(probes, every):
                if k % n:
                    continue
                c0 = time.thread_time()
                p.sample()
                cost[p.name] += time.thread_time() - c0
                calls[p.name] += 1
        loop_s = time.thread_time() - c_loop
        for k in range(ticks // 2):  # then the bare reads alone, cold in the same way
            time.sleep(interval)
            for name, fd in files.items():
                c0 = time.thread_time()
                os.pread(fd, 1 << 16, 0)
                raw[name] += time.thread_time() - c0
        rows = []
        for p, n in zip(probes, every):
            r = {"probe": p.name, "channels": len(p.channels), "every_ticks": n,
                 "cold_cpu_us": 1e6 * cost[p.name] / max(1, calls[p.name]),
                 "pct_of_core": 100 * cost[p.name] / (ticks * interval)}
            if p.name in raw:
                r["bare_pread_us"] = 1e6 * raw[p.name] / (ticks // 2)
            rows.append(r)
        rows.append({"probe": "(whole loop: probes + 10 Hz wake-ups)",
                     "pct_of_core": 100 * loop_s / (ticks * interval)})
        for fd in files.values():
            os.close(fd)
        for p in probes:
            p.close()
        return rows
    finally:
        child.kill()
        child.wait()


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per run (60)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the CPU comparison (3)")
    ap.add_argument("--storage-reps", type=int, default=1, help="reveal record runs (1)")
    ap.add_argument("--only", choices=["cpu", "storage", "probes"], action="append",
                    help="run only these parts (repeatable)")
    bench_results.add_args(ap)
    ap.add_argument("--json", metavar="FILE", dest="results", help=argparse.SUPPRESS)  # old name
    args = ap.parse_args()
    bench = bench_results.begin("telemetry", args.split)
    parts = set(args.only or ["cpu", "storage", "probes"])
    res: dict = {"host": socket.gethostname(), "ncpu": os.cpu_count(),
                 "duration_s": args.duration, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                    time.gmtime())}
    print(f"# Reveal telemetry benchmarks on {res['host']} ({res['ncpu']} CPUs), "
          f"{args.duration:g} s per run\n")

    if "probes" in parts:
        rows = bench_probes()
        res["probes"] = rows
        print("## Per-probe sample cost (CPU µs per sample() in a hot loop of 1000)")
        print(f"{'probe':<18} {'channels':>8} {'cpu µs':>8} {'wall µs':>8}  note")
        for r in rows:
            if r["available"]:
                print(f"{r['probe']:<18} {r['channels']:>8} {r['cpu_us']:>8.1f} "
                      f"{r['wall_us']:>8.1f}")
            else:
                print(f"{r['probe']:<18} {'-':>8} {'-':>8} {'-':>8}  unavailable: {r['reason']}")
        host = [r for r in rows if r["available"] and r["probe"].startswith(("procfs", "psi"))]
        tot = sum(r["cpu_us"] for r in host)
        print(f"procfs+PSI set: {sum(r['channels'] for r in host)} channels, {tot:.0f} µs "
              f"per sample in a hot loop = {tot / 1e3:.3f}% of one core at 10 Hz (probe calls "
              f"only; at 10 Hz caches are cold and the real cost is higher, see below)\n")

        cold = bench_probes_cold()
        res["probes_cold"] = cold
        print("## Per-probe cost at 10 Hz as the agent pays it (cold caches, own schedule)")
        print(f"{'probe':<40} {'every':>5} {'cpu µs':>8} {'pread µs':>8} {'% core':>7}")
        for r in cold:
            print(f"{r['probe']:<40} {r.get('every_ticks', ''):>5} "
                  f"{r.get('cold_cpu_us', float('nan')):>8.1f} "
                  f"{r.get('bare_pread_us', float('nan')):>8.1f} {r['pct_of_core']:>7.3f}")
        print()

    if "cpu" in parts:
        reps = []
        print(f"## Collector CPU at 10 Hz, procfs+PSI set vs prometheus-node-exporter "
              f"({args.reps} x {args.duration:g} s, side by side)")
        for i in range(args.reps):
            r = bench_overhead(args.duration)
            reps.append(r)
            print(f"rep {i + 1}: reveal {r['ours_cpu_pct']:.3f}% ({r['ours_us_per_sample']:.0f} "
                  f"µs/sample, {100 * (r['ours_kernel_share'] or 0):.0f}% of it in the kernel, "
                  f"{r['ours_channels']} ch, {r['ours_samples']} samples)   "
                  f"node-exporter {r['ne_cpu_pct']:.3f}% ({r['ne_us_per_scrape']:.0f} µs/scrape, "
                  f"{r['ne_series']} series, {r['ne_scrapes']} scrapes)   "
                  f"ratio {r['ratio']:.1f}x   [floor: bare pread of the same files in the "
                  f"same loop {r['raw_floor_cpu_pct']:.3f}%, "
                  f"{r['raw_floor_us_per_sample']:.0f} µs; idle 10 Hz loop "
                  f"{r['idle_loop_cpu_pct']:.3f}%; every file on every tick "
                  f"{r['every_tick_cpu_pct']:.3f}%]", flush=True)
        res["cpu"] = {"reps": reps,
                      "ours_cpu_pct_median": med([r["ours_cpu_pct"] for r in reps]),
                      "ours_us_per_sample_median": med([r["ours_us_per_sample"] for r in reps]),
                      "ne_cpu_pct_median": med([r["ne_cpu_pct"] for r in reps]),
                      "raw_floor_cpu_pct_median": med([r["raw_floor_cpu_pct"] for r in reps]),
                      "idle_loop_cpu_pct_median": med([r["idle_loop_cpu_pct"] for r in reps]),
                      "every_tick_cpu_pct_median": med([r["every_tick_cpu_pct"] for r in reps]),
                      "ratio_median": med([r["ratio"] for r in reps])}
        c = res["cpu"]
        lo = min(r["ours_cpu_pct"] for r in reps)
        hi = max(r["ours_cpu_pct"] for r in reps)
        print(f"median: reveal {c['ours_cpu_pct_median']:.3f}% of one core "
              f"(range {lo:.3f}-{hi:.3f}; goal <= 0.3%) "
              f"{'OK' if c['ours_cpu_pct_median'] <= 0.3 else 'OVER GOAL'}; "
              f"node-exporter {c['ne_cpu_pct_median']:.3f}%; node-exporter / reveal = "
              f"{c['ratio_median']:.1f}x; floor (bare pread loop) "
              f"{c['raw_floor_cpu_pct_median']:.3f}%, idle loop "
              f"{c['idle_loop_cpu_pct_median']:.3f}%; every file on every tick "
              f"{c['every_tick_cpu_pct_median']:.3f}% (the default schedule reads the slow "
              f"files once a second)\n")

    if "storage" in parts:
        runs = []
        print(f"## Stored bytes per second per host at 10 Hz (reveal record -- sleep "
              f"{args.duration:g}, all available probes)")
        for i in range(args.storage_reps):
            s = bench_storage(args.duration)
            runs.append(s)
            print(f"run {i + 1}: {s['channels']} channels, {s['samples']} samples in "
                  f"{s['span_s']:.1f} s, {s['segments']} segments ({s['rows']} change-log "
                  f"rows), meta.json {s['meta_bytes'] / 1e3:.1f} KB once; Parquet "
                  f"{s['segment_Bps'] / 1e3:.2f} KB/s, segments+events "
                  f"{s['steady_Bps'] / 1e3:.2f} KB/s, all files incl. meta.json "
                  f"{s['total_Bps'] / 1e3:.2f} KB/s; "
                  f"agent CPU {s['agent_cpu_pct'] if s['agent_cpu_pct'] is None else round(s['agent_cpu_pct'], 2)}%",
                  flush=True)
        tot = med([s["steady_Bps"] for s in runs])
        res["storage"] = {"runs": runs, "steady_Bps_median": tot,
                          "total_Bps_median": med([s["total_Bps"] for s in runs]),
                          "segment_Bps_median": med([s["segment_Bps"] for s in runs]),
                          "agent_cpu_pct_median": med([s["agent_cpu_pct"] for s in runs])}
        print(f"median: {tot / 1e3:.2f} KB/s stored per host, steady rate "
              f"(+ one meta.json per run: {res['storage']['total_Bps_median'] / 1e3:.2f} KB/s "
              f"over this {args.duration:g} s run) (goal <= 2 KB/s) "
              f"{'OK' if tot <= 2000 else 'OVER GOAL'}; paper 14-22 KB/s -> "
              f"{14000 / tot:.1f}-{22000 / tot:.1f}x less; full agent (all probes + storage) "
              f"{res['storage']['agent_cpu_pct_median']:.2f}% of one core\n")

    print(f"results: {bench.write(args.results or bench.default_path(), res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
