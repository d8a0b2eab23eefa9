"""A fleet of short recordings with and without hogs (issue 21: "a fleet built from short
recordings with and without hogs"): can ``reveal fleet nodes`` find the node that had them?

Each repetition records four 45-s jobs under ``reveal record`` at defaults (the scenarios and
the recording of :mod:`neighbour`): ``start15`` and ``mid15`` (two busy-loop hogs on the 2-core
node, from before the job / in its middle) are labelled node ``n-hog``; two ``clean`` runs are
labelled ``n-a`` and ``n-b``.  Users alternate ``u1``/``u2`` by repetition, job ids count up.
One machine has one hostname, so the labels are written into each run's ``meta.json`` and
``report.json`` after it was recorded and analysed (the identity fields only, as
``tests/fixtures_fleet.py`` does); the telemetry, the analysis and the fleet passes are real.
Then ``reveal fleet index`` and ``reveal fleet nodes --format json`` over the runs.

    python benchmarks/detection/fleet_short.py --repeats 3 [--split test]

~50 s per recording (4 per repetition); results in
``benchmarks/detection/results/fleet-short-<split>-<date>.json``: each run's verdict, the
nodes table, and whether ``n-hog`` is the only suspect.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from neighbour import SCENARIOS, record, verdict  # noqa: E402

#: (scenario, node) recorded in each repetition
PLAN = (("start15", "n-hog"), ("mid15", "n-hog"), ("clean", "n-a"), ("clean", "n-b"))


def relabel(run_dir: str, node: str, user: str, job_id: str) -> None:
    """Give a recorded run another node, user and job id (its identity fields only)."""
    p = os.path.join(run_dir, "meta.json")
    with open(p) as f:
        meta = json.load(f)
    meta["host"] = node
    meta["run"].update(host=node, user=user, job_id=job_id, run_id=f"job-{job_id}")
    with open(p, "w") as f:
        json.dump(meta, f)
    p = os.path.join(run_dir, "report.json")
    with open(p) as f:
        rep = json.load(f)
    rep["run"].update(user=user, job_id=job_id, nodes=[node])
    for a in rep["anomalies"]:
        a["node"] = node
    with open(p, "w") as f:
        json.dump(rep, f)


def cli(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", *args], text=True,
                       capture_output=True, timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))
    if r.returncode != 0:
        raise RuntimeError(f"reveal {' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def main(argv=None) -> int:
    sys.path.insert(0, os.path.dirname(HERE))
    import results as bench_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    bench_results.add_args(ap)
    a = ap.parse_args(argv)
    run = bench_results.begin("detection", a.split, argv, script=__file__)
    path = a.results or run.default_path("fleet-short")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="reveal-fleet-short-") as tmp:
        spool = os.path.join(tmp, "spool")
        job = 1000
        for i in range(a.repeats):
            user = f"u{1 + i % 2}"
            for s, node in PLAN:
                job += 1
                d = os.path.join(spool, f"job-{job}")
                hog_at, hog_s = SCENARIOS[s]
                rep, others, log = record(d, hog_at, hog_s)
                relabel(d, node, user, str(job))
                v = {"scenario": s, "node": node, "user": user, "job_id": str(job),
                     "repeat": i, "others_cores": round(others, 3), **verdict(s, rep, log)}
                runs.append(v)
                print(json.dumps(v), flush=True)
                run.write(path, {"runs": runs}, complete=False)
        fleet = os.path.join(tmp, "fleet")
        cli("fleet", "index", spool, "--out", fleet, "--no-progress")
        nodes = json.loads(cli("fleet", "nodes", fleet, "--format", "json", "--no-progress"))
    rows = nodes.get("nodes", nodes) if isinstance(nodes, dict) else nodes
    suspects = sorted(r["node"] for r in rows if r.get("suspect"))
    summary = {"runs": len(runs), "hog_runs_found": sum(r["ok"] for r in runs
                                                        if r["scenario"] != "clean"),
               "hog_runs": sum(r["scenario"] != "clean" for r in runs),
               "clean_runs_without_anomaly": sum(r["ok"] for r in runs
                                                 if r["scenario"] == "clean"),
               "clean_runs": sum(r["scenario"] == "clean" for r in runs),
               "suspects": suspects, "hog_node_only_suspect": suspects == ["n-hog"]}
    run.write(path, {"job": "45-s single-threaded busy loop, `reveal record` defaults; two "
                            "`python -c 'while True: pass'` hogs on n-hog's runs",
                     "plan": [list(p) for p in PLAN], "summary": summary, "runs": runs,
                     "nodes": nodes}, complete=True)
    print(json.dumps(summary, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
