#!/usr/bin/env python3
"""Prolog/Epilog wall time on a real one-node Slurm (root; starts and stops its own Slurm).

    python benchmarks/slurm/run.py [--jobs 50] [--ref-jobs 20]

Three phases, measured in the same run:
  spank    the recommended setup: the SPANK plugin's job_prolog/job_epilog register and close
           the job in C (time from the start of ``slurmstepd spank prolog|epilog`` to the end of
           the callback, 10 ms resolution); the Python parts run detached;
  scripts  slurm.conf Prolog=/Epilog= running ``reveal slurm prolog|epilog`` (time measured by
           the wrapper script around the interpreter, i.e. what slurmd waits for);
  ref      the same scripts with ``enabled = false``: interpreter start-up + reading the
           configuration, the floor of any Python hook.
Also printed: jobs/s end to end for each phase.  Results:
``benchmarks/slurm/results/slurm-<split>-<date>.json`` (``--results``; the :mod:`results` header;
``--split test`` is refused from a dirty tree).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "tests"))
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parents[1]))

import results as bench_results  # noqa: E402

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


def phase(c: SlurmCluster, name: str, n: int, mode: str, disabled: bool = False):
    extra = "enabled = false\n" if disabled else ""
    with c.hook_mode(mode), c.hook_config(c.default_hook_config + extra):
        batch(c, 2)  # warm-up: the first job starts the node agent
        ids, wall = batch(c, n)
        time.sleep(1)
    out = {"name": name, "n": n, "jobs_per_s": n / wall}
    for hook in ("prolog", "epilog"):
        t = c.hook_wall_times(hook)
        out[hook] = [t[j] * 1e3 for j in ids if j in t]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--ref-jobs", type=int, default=20)
    ap.add_argument("--keep", action="store_true", help="keep the Slurm directory (logs)")
    bench_results.add_args(ap)
    a = ap.parse_args()
    bench = bench_results.begin("slurm", a.split, extra_paths=("tests/fixtures_slurm.py",))
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
        res = [phase(c, "ref", a.ref_jobs, "scripts", disabled=True),
               phase(c, "spank", a.jobs, "spank"),
               phase(c, "scripts", a.jobs, "scripts")]
    finally:
        c.stop()
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    ref = res[0]
    print(f"Slurm hook wall time per job (ms); load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'phase':8} {'hook':7} {'n':>3} {'p50':>7} {'p99':>7} {'max':>7} "
          f"{'p50/ref':>8} {'budget':>7} {'over':>5} {'jobs/s':>7}")
    table = []
    for r in res:
        for hook in ("prolog", "epilog"):
            xs = r[hook]
            if not xs:
                print(f"{r['name']:8} {hook:7} no samples")
                continue
            over = sum(x > BUDGET[hook] * 1e3 for x in xs)
            table.append({"phase": r["name"], "hook": hook, "n": len(xs), "p50_ms": pct(xs, 50),
                          "p99_ms": pct(xs, 99), "max_ms": max(xs), "budget_ms":
                          BUDGET[hook] * 1e3, "over_budget": over,
                          "jobs_per_s": r["jobs_per_s"]})
            print(f"{r['name']:8} {hook:7} {len(xs):3d} {pct(xs, 50):7.1f} {pct(xs, 99):7.1f} "
                  f"{max(xs):7.1f} {pct(xs, 50) / pct(ref[hook], 50):8.2f} "
                  f"{BUDGET[hook] * 1e3:5.0f}ms {over:5d} {r['jobs_per_s']:7.2f}")
    print("results: " + bench.write(a.results or bench.default_path(),
                                    {"table": table, "phases": res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
