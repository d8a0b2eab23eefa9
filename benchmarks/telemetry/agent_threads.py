#!/usr/bin/env python3
"""The node agent's CPU per thread, this tree against a reference revision, on one machine.

    python benchmarks/telemetry/agent_threads.py [--reference REV] [--reps 3] [--duration 50]
                                                 [--split dev|test]

Each repetition runs ``reveal record --no-analyze -- sleep D`` twice, once with the reference
revision's package (``git archive REV reveal_plugins``) on ``PYTHONPATH`` and once with this
tree's, alternating, so that the machine's speed and noise hit both.  The agent's CPU is read
per thread from ``/proc/<agent>/task/*/schedstat`` (nanoseconds on CPU) over the steady part
of the run (after 8 s, until 12 s before the end).  Beside each agent, over the same span:
``prometheus-node-exporter`` scraped at 10 Hz (its CPU), a Python loop that only wakes up
10 times a second (the floor any 10 Hz Python sampler pays on this machine), and two loops
that read the agent's host files on its schedule (/proc/stat, net/dev, PSI every tick, the
others once a second) without parsing them: one in Python, one in C (``floor.c``, built with
``gcc`` when there is one): the floors of a sampler in either language.  The floors leave out
the run's own files and the qdisc netlink dump.  Also per repetition and side: the agent's
resident memory at the end of the span (VmRSS, VmHWM), and three ``reveal record --no-analyze
-- true`` with a fresh agent, timed (what a job waits for at its start and end).  The agent names
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
                 reveal_cmd, start_node_exporter)              # run.py: the same helpers)

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


#: the Python read floor: the agent's host files on its schedule, one pread each, no parsing
READ_FLOOR = r"""
import os, sys, time
interval = float(sys.argv[1])
files = [(int(a.split(":", 1)[0]), os.open(a.split(":", 1)[1], os.O_RDONLY)) for a in sys.argv[2:]]
t0, k = time.monotonic(), 0
while True:
    k += 1
    time.sleep(max(0.0, t0 + k * interval - time.monotonic()))
    for every, fd in files:
        if k % every == 0:
            os.pread(fd, 65536, 0)
"""


def host_files(interval: float = 0.1) -> list[str]:
    """``EVERY:PATH`` of the agent's host procfs and PSI files, as its sampler schedules them."""
    from reveal_plugins.probes.procfs import PROCFS_PROBES
    from reveal_plugins.probes.psi import psi_probes
    out = []
    for p in [c() for c in PROCFS_PROBES] + psi_probes():
        p.open()
        if p.available:
            out.append(f"{max(1, round((p.interval_s or 0) / interval))}:{p.file.path}")
        p.close()
    return out


def build_native_floor(tmp: str) -> str | None:
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    out = os.path.join(tmp, "floor")
    subprocess.run([gcc, "-O2", "-o", out, os.path.join(HERE, "floor.c")], check=True)
    return out


class Beside:
    """What runs next to the current agent over the same span: prometheus-node-exporter
    scraped at 10 Hz (the reference the issue names), and a Python loop that only wakes up
    10 times a second (the floor of any 10 Hz Python sampler on this machine)."""

    def __init__(self, span: float, native: str | None):
        files = host_files()
        self.floors = {"python_read": subprocess.Popen(
            [sys.executable, "-c", READ_FLOOR, "0.1", *files])}
        if native:
            self.floors["native_read"] = subprocess.Popen([native, "0.1", *files])
        self.ne, self.url, self.series = start_node_exporter()
        self.scraper = Scraper(self.url, 0.1, span)
        self.idle = subprocess.Popen([sys.executable, "-c", SAMPLER, "0.1", str(span), "idle"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
        json.loads(self.idle.stdout.readline())

    def start(self) -> None:
        self.f0 = {k: sum(thread_ns(p.pid).values()) for k, p in self.floors.items()}
        self.c0, self.t0 = proc_cpu_s(self.ne.pid), time.monotonic()
        self.idle.stdin.write("go\n")
        self.idle.stdin.flush()
        self.scraper.start()

    def stop(self) -> dict:
        try:
            self.scraper.join()
            c1, t1 = proc_cpu_s(self.ne.pid), time.monotonic()
            f1 = {k: sum(thread_ns(p.pid).values()) for k, p in self.floors.items()}
            loop = json.loads(self.idle.stdout.readline())
            for k, p in self.floors.items():
                if p.poll() is not None:
                    raise RuntimeError(f"the {k} floor loop exited with {p.returncode}")
        finally:
            for p in self.floors.values():
                p.kill()
                p.wait()
            self.ne.terminate()
            self.ne.wait(timeout=10)
            if self.idle.poll() is None:
                self.idle.kill()
        return {"node_exporter_pct": 100 * (c1 - self.c0) / (t1 - self.t0),
                "node_exporter_scrapes": self.scraper.scrapes,
                "node_exporter_errors": self.scraper.errors,
                "node_exporter_series": self.series,
                "idle_loop_pct": 100 * loop["cpu_s"] / loop["wall_s"],
                **{f"{k}_floor_pct": 100 * (f1[k] - self.f0[k]) / 1e9 / (t1 - self.t0)
                   for k in self.floors}}


def agent_memory_mb(pid: int) -> dict:
    """The agent's resident memory now and at its peak (MB)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[f"{line[:5].lower()}_mb"] = int(line.split()[1]) / 1024
    return out


def record_wall_s(pythonpath: str) -> float:
    """Seconds of ``reveal record --no-analyze -- true`` with a fresh agent: what a job waits
    for at its start and end."""
    tmp = tempfile.mkdtemp(prefix="reveal-bench-start-")
    cmd = reveal_cmd()
    try:
        t0 = time.monotonic()
        subprocess.run(cmd + ["record", "--out", os.path.join(tmp, "run"), "--no-analyze",
                              "--", "true"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, cwd=tmp, check=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": pythonpath})
        return time.monotonic() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(pythonpath: str, duration: float, beside: bool = False,
            native: str | None = None) -> dict:
    tmp = tempfile.mkdtemp(prefix="reveal-bench-threads-")
    env = {**os.environ, "PYTHONPATH": pythonpath}
    cmd = reveal_cmd()
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
        others = Beside(duration - 20.0, native) if beside else None
        time.sleep(max(0.0, 8.0 - (time.monotonic() - t_start)))
        if others:
            others.start()
        a, t0 = thread_ns(agent), time.monotonic()
        time.sleep(duration - 20.0)
        b, t1 = thread_ns(agent), time.monotonic()
        mem = agent_memory_mb(agent)
        side = others.stop() if others else {}
        rec.wait(timeout=duration + 120)
        span = t1 - t0
        threads = {}
        for k, ns in b.items():
            name = k.split(":")[0]
            pct = 100 * (ns - a.get(k, 0)) / 1e9 / span
            threads[name] = threads.get(name, 0.0) + pct  # pools: several threads, one name
        return {"span_s": span, "total_pct": sum(threads.values()), **mem,
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
        native = build_native_floor(ref_dir)
        arch = subprocess.run(["git", "-C", REPO, "archive", ref_rev, "reveal_plugins"],
                              capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", ref_dir], input=arch, check=True)
        reps = []
        for i in range(args.reps):
            ref = measure(ref_dir, args.duration, beside=True, native=native)
            cur = measure(REPO, args.duration, beside=True, native=native)
            ref["record_true_s"] = [record_wall_s(ref_dir) for _ in range(3)]
            cur["record_true_s"] = [record_wall_s(REPO) for _ in range(3)]
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
    memory = {side: {k: statistics.median(r[side][k] for r in reps)
                     for k in ("vmrss_mb", "vmhwm_mb")} for side in ("reference", "current")}
    record_true = {side: statistics.median(x for r in reps for x in r[side]["record_true_s"])
                   for side in ("reference", "current")}
    print(f"agent memory (median): reference RSS {memory['reference']['vmrss_mb']:.0f} MB "
          f"(peak {memory['reference']['vmhwm_mb']:.0f}), current "
          f"{memory['current']['vmrss_mb']:.0f} MB (peak {memory['current']['vmhwm_mb']:.0f}); "
          f"`reveal record --no-analyze -- true`: reference {record_true['reference']:.2f} s, "
          f"current {record_true['current']:.2f} s")
    idle_med = statistics.median(r["current"]["idle_loop_pct"] for r in reps)
    floors = {k: statistics.median(r[side][f"{k}_floor_pct"] for r in reps
                                   for side in ("reference", "current"))
              for k in ("python_read", "native_read") if f"{k}_floor_pct" in reps[0]["current"]}
    print(f"same spans: prometheus-node-exporter scraped at 10 Hz {ne_med:.3f} % "
          f"({ne_med / cur_med:.1f}x the agent); a Python loop that only wakes at 10 Hz "
          f"{idle_med:.3f} %; the agent's host files read without parsing: " +
          ", ".join(f"{k} {v:.3f} %" for k, v in floors.items()))
    print(f"median agent CPU: reference {args.reference} ({ref_rev[:7]}) {ref_med:.3f} % of one "
          f"core, current {cur_med:.3f} % (goal 0.3 %)")
    print("current, median per thread: " + ", ".join(
        f"{k} {v:.3f} %" for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1])
        if v >= 0.005))
    path = bench.write(args.results or bench.default_path("agent-threads"), {
        "reference": {"rev": ref_rev, "given": args.reference}, "duration_s": args.duration,
        "reps": reps, "reference_total_pct_median": ref_med, "current_total_pct_median": cur_med,
        "current_threads_pct_median": per_thread, "node_exporter_pct_median": ne_med,
        "idle_loop_pct_median": idle_med,
        "memory_mb_median": memory, "record_true_s_median": record_true,
        "read_floor_pct_median": floors,
        "read_floor_files": host_files()})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
