#!/usr/bin/env python3
"""The node agent's CPU per thread, this tree against a reference revision, on one machine.

    python benchmarks/telemetry/agent_threads.py [--reference REV] [--reps 3] [--duration 50]
                                                 [--split dev|test]

Each repetition runs ``reveal record --no-analyze -- sleep D`` twice, once with the reference
revision's package (``git archive REV reveal_plugins``) on ``PYTHONPATH`` and once with this
tree's, alternating, so that the machine's speed and noise hit both.  The agent's CPU is read
per thread from ``/proc/<agent>/task/*/schedstat`` (nanoseconds on CPU) over the steady part
of the run (after 8 s, until 12 s before the end).  Beside each agent, over the same span:
``prometheus-node-exporter`` scraped at 10 Hz (its CPU) and a Python loop that only wakes up
10 times a second (the floor any 10 Hz Python sampler pays on this machine).  The agent names
its threads in the kernel (``reveal-sampler``, ``reveal-features``, ...); an older reference
may not, and then its threads are listed by id.  Results: ``benchmarks/telemetry/results/agent-threads-<split>-<date>
.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import results as bench_results  # noqa: E402
from run import (SAMPLER, Scraper, _find_agent, proc_cpu_s,  # noqa: E402  (this folder's
                 start_node_exporter)                         # run.py: the same helpers)

#: the agent before its idle threads stopped polling and the featurizer's interpolation was
#: grouped per probe (2026-12-06)
REFERENCE = "e3ebb92"


def thread_ns(pid: int) -> dict[str, int]:
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out[f"{name}:{tid}"] = ns
    return out


class Beside:
    """What runs next to the current agent over the same span: prometheus-node-exporter
    scraped at 10 Hz (the reference the issue names), and a Python loop that only wakes up
    10 times a second (the floor of any 10 Hz Python sampler on this machine)."""

    def __init__(self, span: float):
        self.ne, self.url, self.series = start_node_exporter()
        self.scraper = Scraper(self.url, 0.1, span)
        self.idle = subprocess.Popen([sys.executable, "-c", SAMPLER, "0.1", str(span), "idle"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
        json.loads(self.idle.stdout.readline())

    def start(self) -> None:
        self.c0, self.t0 = proc_cpu_s(self.ne.pid), time.monotonic()
        self.idle.stdin.write("go\n")
        self.idle.stdin.flush()
        self.scraper.start()

    def stop(self) -> dict:
        try:
            self.scraper.join()
            c1, t1 = proc_cpu_s(self.ne.pid), time.monotonic()
            loop = json.loads(self.idle.stdout.readline())
        finally:
            self.ne.terminate()
            self.ne.wait(timeout=10)
            if self.idle.poll() is None:
                self.idle.kill()
        return {"node_exporter_pct": 100 * (c1 - self.c0) / (t1 - self.t0),
                "node_exporter_scrapes": self.scraper.scrapes,
                "node_exporter_errors": self.scraper.errors,
                "node_exporter_series": self.series,
                "idle_loop_pct": 100 * loop["cpu_s"] / loop["wall_s"]}


def measure(pythonpath: str, duration: float, beside: bool = False) -> dict:
    tmp = tempfile.mkdtemp(prefix="reveal-bench-threads-")
    env = {**os.environ, "PYTHONPATH": pythonpath}
    reveal = shutil.which("reveal")
    cmd = ([reveal] if reveal else [sys.executable, "-m", "reveal_plugins.cli"])
    try:
        rec = subprocess.Popen(cmd + ["record", "--out", os.path.join(tmp, "run"),
                                      "--no-analyze", "--", "sleep", str(duration)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=tmp,
                               env=env)
        t_start = time.monotonic()
        agent = _find_agent(rec.pid)
        if agent is None:
            rec.kill()
            raise RuntimeError("no agent process found under reveal record")
        others = Beside(duration - 20.0) if beside else None
        time.sleep(max(0.0, 8.0 - (time.monotonic() - t_start)))
        if others:
            others.start()
        a, t0 = thread_ns(agent), time.monotonic()
        time.sleep(duration - 20.0)
        b, t1 = thread_ns(agent), time.monotonic()
        side = others.stop() if others else {}
        rec.wait(timeout=duration + 120)
        span = t1 - t0
        threads = {}
        for k, ns in b.items():
            name = k.split(":")[0]
            pct = 100 * (ns - a.get(k, 0)) / 1e9 / span
            threads[name] = threads.get(name, 0.0) + pct  # pools: several threads, one name
        return {"span_s": span, "total_pct": sum(threads.values()),
                "threads_pct": dict(sorted(threads.items(), key=lambda kv: -kv[1])), **side}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", default=REFERENCE, help=f"revision (default {REFERENCE})")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=50.0, help="seconds per run (50)")
    bench_results.add_args(ap)
    args = ap.parse_args()
    if args.duration < 30:
        ap.error(f"--duration {args.duration:g}: must be at least 30 s (8 s warm-up, 12 s end)")
    bench = bench_results.begin("telemetry", args.split)
    ref_rev = subprocess.run(["git", "-C", REPO, "rev-parse", args.reference],
                             capture_output=True, text=True, check=True).stdout.strip()
    ref_dir = tempfile.mkdtemp(prefix="reveal-ref-")
    try:
        arch = subprocess.run(["git", "-C", REPO, "archive", ref_rev, "reveal_plugins"],
                              capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", ref_dir], input=arch, check=True)
        reps = []
        for i in range(args.reps):
            ref = measure(ref_dir, args.duration, beside=True)
            cur = measure(REPO, args.duration, beside=True)
            reps.append({"reference": ref, "current": cur})
            print(f"rep {i + 1}: reference {ref['total_pct']:.3f} %  current "
                  f"{cur['total_pct']:.3f} %  | current per thread: " +
                  ", ".join(f"{k} {v:.3f}" for k, v in cur["threads_pct"].items() if v >= 0.005),
                  flush=True)
    finally:
        shutil.rmtree(ref_dir, ignore_errors=True)
    ref_med = statistics.median(r["reference"]["total_pct"] for r in reps)
    cur_med = statistics.median(r["current"]["total_pct"] for r in reps)
    names = sorted({k for r in reps for k in r["current"]["threads_pct"]})
    per_thread = {k: statistics.median(r["current"]["threads_pct"].get(k, 0.0) for r in reps)
                  for k in names}
    ne_med = statistics.median(r["current"]["node_exporter_pct"] for r in reps)
    idle_med = statistics.median(r["current"]["idle_loop_pct"] for r in reps)
    print(f"same spans: prometheus-node-exporter scraped at 10 Hz {ne_med:.3f} % "
          f"({ne_med / cur_med:.1f}x the agent); a Python loop that only wakes at 10 Hz "
          f"{idle_med:.3f} %")
    print(f"median agent CPU: reference {args.reference} ({ref_rev[:7]}) {ref_med:.3f} % of one "
          f"core, current {cur_med:.3f} % (goal 0.3 %)")
    print("current, median per thread: " + ", ".join(
        f"{k} {v:.3f} %" for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1])
        if v >= 0.005))
    path = bench.write(args.results or bench.default_path("agent-threads"), {
        "reference": {"rev": ref_rev, "given": args.reference}, "duration_s": args.duration,
        "reps": reps, "reference_total_pct_median": ref_med, "current_total_pct_median": cur_med,
        "current_threads_pct_median": per_thread, "node_exporter_pct_median": ne_med,
        "idle_loop_pct_median": idle_med})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
