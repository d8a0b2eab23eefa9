#!/usr/bin/env python3
"""Prolog/Epilog wall time on a real one-node Slurm (root; starts and stops its own Slurm).

    python benchmarks/slurm/run.py [--jobs 50] [--ref-jobs 20]

Wall times are measured by the hook wrapper scripts around the whole ``reveal slurm
prolog|epilog`` process (interpreter start-up included), i.e. what slurmd waits for.
Reference, measured in the same run: the same hooks with ``enabled = false`` (interpreter
start-up + reading the configuration), so the ratio isolates what Reveal's work costs.
Also printed: job throughput (jobs/s end to end) with and without the hooks doing work.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "tests"))
sys.path.insert(0, str(HERE.parents[2]))

from fixtures_slurm import SlurmCluster, _ensure_installed  # noqa: E402

BUDGET = {"prolog": 0.5, "epilog": 1.0}


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def batch(cluster: SlurmCluster, n: int) -> tuple[list[str], float]:
    t0 = time.monotonic()
    ids = [cluster.sbatch("#!/bin/sh\nsrun true\n").stdout.strip() for _ in range(n)]
    for j in ids:
        res = cluster.wait(j, timeout=600)
        if res.state != "COMPLETED":
            raise SystemExit(f"job {j} ended {res.state}")
    return ids, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--ref-jobs", type=int, default=20)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (it starts slurmctld/slurmd)", file=sys.stderr)
        return 2
    reason = _ensure_installed()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="reveal-slurm-bench-")
    os.chmod(base, 0o755)
    c = SlurmCluster(base)
    c.start()
    try:
        with c.hook_config(c.default_hook_config + "enabled = false\n"):
            ref_ids, ref_wall = batch(c, a.ref_jobs)
        batch(c, 2)  # warm-up: the first Prolog starts the node agent
        ids, wall = batch(c, a.jobs)
        time.sleep(2)
        print(f"Slurm hook wall time, {a.jobs} jobs (reference: {a.ref_jobs} jobs with "
              "hooks disabled = interpreter start-up only)")
        print(f"{'hook':8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'ref p50':>8} "
              f"{'ref p99':>8} {'p50/ref':>8} {'budget':>7} {'over':>5}")
        for hook in ("prolog", "epilog"):
            t = c.hook_wall_times(hook)
            xs = [t[j] * 1e3 for j in ids if j in t]
            rs = [t[j] * 1e3 for j in ref_ids if j in t]
            over = sum(x > BUDGET[hook] * 1e3 for x in xs)
            print(f"{hook:8} {pct(xs, 50):8.1f} {pct(xs, 99):8.1f} {max(xs):8.1f} "
                  f"{pct(rs, 50):8.1f} {pct(rs, 99):8.1f} {pct(xs, 50) / pct(rs, 50):8.2f} "
                  f"{BUDGET[hook] * 1e3:6.0f}ms {over:5d}")
        print(f"throughput: {a.jobs / wall:.2f} jobs/s with Reveal, "
              f"{a.ref_jobs / ref_wall:.2f} jobs/s hooks disabled "
              f"(ratio {(a.jobs / wall) / (a.ref_jobs / ref_wall):.2f})")
        reports = sum(os.path.exists(os.path.join(c.run_dir(j), "report.json")) for j in ids)
        print(f"reports written: {reports}/{len(ids)}; samples in n={len(ids)} "
              f"(median of per-job medians unaffected by the detached analysis)")
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
