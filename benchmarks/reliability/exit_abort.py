"""How often a short ``reveal analyze`` aborts at exit, this tree against a reference revision.

    python benchmarks/reliability/exit_abort.py [--reference REV] [--runs 300] [--streams 3]

Each side runs ``python -m reveal_plugins.cli analyze DIR`` ``--runs`` times in each of
``--streams`` parallel streams on a synthetic 90-s run, the reference revision's package
(``git archive REV reveal_plugins``) on ``PYTHONPATH`` for one side and this tree for the
other, the sides interleaved in rounds of 20 so that both meet the same machine.  A run counts
as aborted when it exits by a signal or prints ``terminate called``: pyarrow's worker thread
dropping the last reference to a reader's pages while the interpreter finalizes, when those
pages wrap a Python object (apache/arrow#34314; seen in CI as
``test_analyze_writes_report_and_prints_summary`` failing with rc -6).
The abort needs a worker thread that waits for a core while the main thread finalizes: with
two streams on this 2-core VM it did not show (0 of 300 on either side, with and without the
sinks, 2026-12-07); two loops beside other work on the same VM gave 3 aborts in 473 runs of
ef5b0c9. Hence three streams by default (more processes than cores).
Last line: ``reference N/M aborted, current N/M aborted``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, REPO)

import results as bench_results  # noqa: E402

ROUND = 20


def analyze_once(pkg_root: str, run_dir: str) -> dict:
    env = dict(os.environ, PYTHONPATH=pkg_root)
    t0 = time.monotonic()
    # with the sinks, as `reveal analyze` runs at job end and in the CI test that aborted:
    # with --no-publish, 0 of 300 aborted on either side here (2026-12-07), against 3 of 473
    # with them
    p = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "analyze", run_dir],
                       capture_output=True, text=True, env=env, timeout=300)
    aborted = p.returncode < 0 or p.returncode in (134, 139) or "terminate called" in p.stderr
    return {"rc": p.returncode, "aborted": aborted, "s": time.monotonic() - t0,
            "stderr": p.stderr[-400:] if p.returncode else ""}


def stream(pkg_root: str, run_dir: str, n: int) -> list[dict]:
    return [analyze_once(pkg_root, run_dir) for _ in range(n)]


def side(pkg_root: str, run_dirs: list[str], n: int) -> list[dict]:
    with ThreadPoolExecutor(len(run_dirs)) as ex:
        parts = list(ex.map(lambda d: stream(pkg_root, d, n), run_dirs))
    return [r for p in parts for r in p]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", default="ef5b0c9", help="revision (default ef5b0c9)")
    ap.add_argument("--runs", type=int, default=300, help="analyses per stream and side")
    ap.add_argument("--streams", type=int, default=3, help="parallel streams (3)")
    bench_results.add_args(ap, extra_splits=(), results=True)
    args = ap.parse_args()
    if args.runs < 1 or args.streams < 1:
        ap.error("--runs and --streams must be >= 1")
    bench = bench_results.begin("exit_abort", args.split)
    ref_rev = subprocess.run(["git", "-C", REPO, "rev-parse", args.reference],
                             capture_output=True, text=True, check=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="reveal-abort-")
    try:
        ref_dir = os.path.join(tmp, "ref")
        os.makedirs(ref_dir)
        arch = subprocess.run(["git", "-C", REPO, "archive", ref_rev, "reveal_plugins"],
                              capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", ref_dir], input=arch, check=True)
        from reveal_plugins.detect.synth import SynthHost
        runs = []
        for s in range(args.streams):     # one run directory per stream: no shared report
            d = os.path.join(tmp, f"run{s}")
            SynthHost(2, seed=0, anomalies=[("storage", 40, 60)]).write_run(d, 90, 0.1)
            runs.append(d)
        out = {"reference": [], "current": []}
        done = 0
        while done < args.runs:
            k = min(ROUND, args.runs - done)
            out["reference"] += side(ref_dir, runs, k)
            out["current"] += side(REPO, runs, k)
            done += k
            print(f"{done}/{args.runs} per stream: reference "
                  f"{sum(r['aborted'] for r in out['reference'])} aborted, current "
                  f"{sum(r['aborted'] for r in out['current'])} aborted", flush=True)
        figures = {
            "reference": {"rev": ref_rev, "given": args.reference},
            "runs_per_side": args.runs * args.streams, "streams": args.streams,
            "aborted": {k: sum(r["aborted"] for r in v) for k, v in out.items()},
            "failed_other": {k: sum(1 for r in v if r["rc"] and not r["aborted"])
                             for k, v in out.items()},
            "median_s": {k: sorted(r["s"] for r in v)[len(v) // 2] for k, v in out.items()},
            "examples": {k: [r["stderr"] for r in v if r["rc"]][:3] for k, v in out.items()},
        }
        path = bench.write(args.results or bench.default_path("exit-abort"), figures)
        n = figures["runs_per_side"]
        print(f"results: {path}")
        print(f"reference {figures['aborted']['reference']}/{n} aborted, "
              f"current {figures['aborted']['current']}/{n} aborted")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
