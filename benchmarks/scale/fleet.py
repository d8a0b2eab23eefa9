"""Fleet pass (``reveal fleet index`` + ``reveal fleet nodes``) over 100, 1,000 and 10,000 runs.

    flock -x /tmp/reveal-quiet.lock python benchmarks/scale/fleet.py --runs 100 1000
    flock -x /tmp/reveal-quiet.lock python benchmarks/scale/fleet.py --runs 10000

For each fleet size: wall time and peak memory (RSS summed over the command's whole process
tree: client, scheduler, nanny and worker processes, sampled every 50 ms) of the real CLI,
embedded Dask with 1 and 2 workers, against a single-process reference measured in the same
run on the same runs: ``build_index(client=None)`` (the same extraction, in one process, no
Dask) and pandas reading the same index (``read_parquet`` + ``groupby``) for the ranking.
Prints speed-up 2 workers / 1 worker and the ratios against the reference.  Goals (issue 12):
10,000 runs <= 2 min on a 2-core VM, memory bounded, 2 workers >= 1.6x one.

Runs: three analysed templates (real store and pipeline, synthetic 70-s telemetry at 10 Hz,
64 channels; tests/fixtures_fleet.py) cloned under up to 200 nodes x 40 users (segments hard-linked,
so after the first pass they are read from the page cache: a cold spool is slower).
Window features are on (the default): each run's segments are read and windowed.  One node
(cn007) is a lemon: all its runs carry the CPU-contention template's anomaly.

Results: ``benchmarks/scale/results/fleet-<split>-<date>.json`` (``--out``; the :mod:`results`
header; ``--split dev`` by default, ``test`` is refused from a dirty tree).  An existing
``--out`` file keeps its other sizes only when it was written from the same commit and tree
state.  ``results-fleet.json`` holds the figures of 2026-12-03 (written before results headers).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE.parent))

import results as bench_results  # noqa: E402
from fixtures_fleet import DAY, T0, clone_run, make_templates  # noqa: E402


def build_fleet(root: str, templates: dict, n: int) -> str:
    spool = os.path.join(root, f"spool-{n}")
    if os.path.isdir(spool):
        return spool
    wls = [f"workload-{i}" for i in range(12)]
    nodes = min(200, max(10, n // 10))
    for j in range(n):
        node = f"cn{j % nodes:03d}"
        kind = "cpu" if node == "cn007" else ("storage" if j % 37 == 0 else "clean")
        clone_run(templates[kind], os.path.join(spool, "jobs", str(100000 + j), node),
                  job_id=str(100000 + j), user=f"u{(j * 7) % 40}", node=node,
                  workload=wls[j % len(wls)], start=T0 + (j % 7) * DAY + (j % 8000) * 9.0)
    return spool


def measure(cmd: list[str], env=None) -> dict:
    """Wall time and peak RSS of the process tree of ``cmd``."""
    import psutil
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    peak = [0]
    stop = threading.Event()

    def sample():
        try:
            root = psutil.Process(p.pid)
        except psutil.Error:
            return
        while not stop.is_set():
            tot = 0
            try:
                for q in [root] + root.children(recursive=True):
                    try:
                        tot += q.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                break
            peak[0] = max(peak[0], tot)
            stop.wait(0.05)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-3000:]}")
    return {"wall_s": wall, "peak_rss_mb": peak[0] / 2**20, "stdout": out}


def reference_main(spool: str, fleet: str) -> None:
    """Single process: the same extraction without Dask, then pandas on the same index."""
    import pandas as pd

    from reveal_plugins.fleet.index import build_index
    from reveal_plugins.fleet.nodes import wilson
    t0 = time.perf_counter()
    build_index([spool], fleet, None, progress=False)
    t1 = time.perf_counter()
    df = pd.read_parquet(os.path.join(fleet, "runs"),
                         columns=["node", "user", "analysed", "anomalous"])
    df = df[df["analysed"]]
    g = df.groupby("node").agg(analysed=("anomalous", "size"), anomalous=("anomalous", "sum"),
                               users=("user", "nunique"))
    bu = df[df["anomalous"]].groupby("node")["user"].nunique()
    g["users_affected"] = bu.reindex(g.index).fillna(0).astype(int)
    lo = [wilson(int(k), int(n))[0] for k, n in zip(g["anomalous"], g["analysed"])]
    ulo = [wilson(int(k), int(n))[0] for k, n in zip(g["users_affected"], g["users"])]
    g["score"] = [min(a, b) for a, b in zip(lo, ulo)]
    g = g.sort_values(["score", "anomalous"], ascending=False)
    t2 = time.perf_counter()
    print(json.dumps({"index_s": t1 - t0, "nodes_s": t2 - t1, "top": list(g.index[:5]),
                      "top_anomalous": [int(x) for x in g["anomalous"][:5]]}))


def one_size(root: str, templates: dict, n: int) -> dict:
    spool = build_fleet(root, templates, n)
    py = sys.executable
    cli = [py, "-m", "reveal_plugins.cli", "fleet"]
    res: dict = {"runs": n}
    for w in (1, 2):
        fleet = os.path.join(root, f"F-{n}-{w}")
        shutil.rmtree(fleet, ignore_errors=True)
        a = measure(cli + ["index", spool, "--out", fleet, "--workers", str(w)])
        b = measure(cli + ["nodes", fleet, "--workers", str(w), "--json"])
        c = measure(cli + ["index", spool, "--out", fleet, "--workers", str(w)])  # no change
        top = json.loads(b["stdout"])["nodes"]
        res[f"dask_{w}w"] = {"index_s": a["wall_s"], "nodes_s": b["wall_s"],
                             "total_s": a["wall_s"] + b["wall_s"],
                             "reindex_unchanged_s": c["wall_s"],
                             "peak_rss_mb": max(a["peak_rss_mb"], b["peak_rss_mb"]),
                             "top": [r["node"] for r in top[:5]]}
    fleet = os.path.join(root, f"F-{n}-ref")
    shutil.rmtree(fleet, ignore_errors=True)
    r = measure([py, __file__, "--reference", spool, fleet])
    ref = json.loads(r["stdout"].strip().splitlines()[-1])
    res["reference"] = {"index_s": ref["index_s"], "nodes_s": ref["nodes_s"],
                        "total_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"],
                        "top": ref["top"]}
    res["speedup_2w_vs_1w"] = res["dask_1w"]["total_s"] / res["dask_2w"]["total_s"]
    res["index_speedup_2w_vs_1w"] = res["dask_1w"]["index_s"] / res["dask_2w"]["index_s"]
    res["dask_2w_vs_reference"] = res["reference"]["total_s"] / res["dask_2w"]["total_s"]
    res["same_top_node"] = (res["dask_1w"]["top"][0] == res["dask_2w"]["top"][0]
                            == res["reference"]["top"][0] == "cn007")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--work", help="keep fleets here (default: a temporary directory)")
    ap.add_argument("--out", default=None,
                    help="results file (default results/fleet-<split>-<date>.json)")
    bench_results.add_args(ap, results=False)
    ap.add_argument("--reference", nargs=2, metavar=("SPOOL", "FLEET"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference:
        reference_main(*args.reference)
        return 0
    bench = bench_results.begin("fleet", args.split, extra_paths=("tests/fixtures_fleet.py",))
    out = args.out or bench.default_path()
    root = args.work or tempfile.mkdtemp(prefix="reveal-fleet-bench-")
    os.makedirs(root, exist_ok=True)
    templates = make_templates(root)
    try:
        old = json.load(open(out)) if os.path.exists(out) else {}
    except ValueError:
        old = {}
    oh = old.get("header") or {}
    if old and not (oh.get("commit") == bench.header["commit"] and oh.get("tree_clean")
                    and bench.header["tree_clean"] and oh.get("split") == args.split):
        print(f"# {out}: other commit, split or a dirty tree; its sizes are not kept")
        old = {}
    results = old.get("sizes", {})
    print(f"{'runs':>6} {'mode':<10} {'index s':>8} {'nodes s':>8} {'total s':>8} "
          f"{'peak MB':>8}  top node")
    for n in args.runs:
        r = one_size(root, templates, n)
        results[str(n)] = r
        for mode in ("dask_1w", "dask_2w", "reference"):
            m = r[mode]
            print(f"{n:>6} {mode:<10} {m['index_s']:>8.1f} {m['nodes_s']:>8.2f} "
                  f"{m['total_s']:>8.1f} {m['peak_rss_mb']:>8.0f}  {m['top'][0]}")
        print(f"{n:>6} 2 workers / 1 worker: {r['speedup_2w_vs_1w']:.2f}x (index alone "
              f"{r['index_speedup_2w_vs_1w']:.2f}x); 2 workers vs single-process reference: "
              f"{r['dask_2w_vs_reference']:.2f}x; unchanged re-index "
              f"{r['dask_2w']['reindex_unchanged_s']:.1f} s; same top node: "
              f"{r['same_top_node']}")
    print(f"results: {bench.write(out, {'sizes': results})}")
    if not args.work:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
