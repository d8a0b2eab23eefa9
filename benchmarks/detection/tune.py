"""Thresholds of the pipeline references, tuned on dev recordings the same way for every
detector: each of IsolationForest, PCA, k-means and the pipeline's robust z runs alone inside
the whole pipeline at every threshold of ``GRID``, and keeps the one with the best dev F1
(ties: fewer false events, then the one nearest the pipeline's default).  The pipeline with
all its detectors is swept the same way and its choice reported beside its configured
default, which is not changed here.

    python benchmarks/detection/run.py --seed SEED --out DIR   # record dev (the default split)
    python benchmarks/detection/tune.py DIR                                # writes thresholds.json

``run.py`` then scores ``pipeline_<name>`` on the test split with these thresholds.  Only
``dev-*`` runs are read: a test run in DIR is refused, not skipped silently.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from scoring import (PIPELINE_DETECTORS, THRESHOLDS, events_of, pipeline_events,  # noqa: E402
                     run_base, score)

sys.path.insert(0, os.path.dirname(HERE))
import results as bench_results  # noqa: E402

#: Fused-score thresholds tried (robust sigmas of a detector's own scores).
GRID = (2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 14.0)
#: F1 within this of the best counts as a tie.
TIE = 0.005


def dev_runs(root: str) -> dict[str, dict]:
    """``{run directory: its labels}`` of the recorded runs under ``root``, all dev."""
    runs = {}
    for n in sorted(os.listdir(root)):
        path = os.path.join(root, n, "labels.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            labels = json.load(f)
        split = labels["scenario"].get("split")
        if split != "dev":
            raise SystemExit(f"tune.py: {os.path.join(root, n)} is a {split!r} run; "
                             "thresholds are tuned on dev recordings only")
        runs[os.path.join(root, n)] = labels
    if not runs:
        raise SystemExit(f"tune.py: no recorded runs (labels.json) under {root}")
    return runs


def sweep(runs: dict[str, dict], name: str | None, grid=GRID) -> list[dict]:
    """Dev figures of detector ``name`` (None: all of them) at each threshold of ``grid``;
    ``runs`` as :func:`dev_runs` returns them."""
    rows = []
    for th in grid:
        scored = []
        for r, labels in runs.items():
            rep = pipeline_events(r, name, th)
            scored.append(dict(run_base(rep, labels), events=events_of(rep)))
        s = score(scored)
        rows.append({"threshold": th, "f1": s["f1"], "recall": s["recall"],
                     "precision_alarm_s": s["precision_alarm_s"],
                     "attribution_accuracy": s["attribution_accuracy"],
                     "false_events_total": s["false_events_total"],
                     "false_events_clean": s["false_events_clean"]})
    return rows


def choose(rows: list[dict], default: float) -> float:
    best = max(r["f1"] for r in rows)
    tied = [r for r in rows if r["f1"] >= best - TIE]
    return min(tied, key=lambda r: (r["false_events_total"],
                                   abs(r["threshold"] - default)))["threshold"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dev_dir", help="directory of dev-split recordings (run.py, default split)")
    ap.add_argument("--out", default=THRESHOLDS, help="thresholds file (default: %(default)s)")
    ap.add_argument("--results", default=None, help="results file (default: "
                    "results/tune-dev-<date>.json next to the script)")
    args = ap.parse_args(argv)
    from reveal_plugins.detect.config import DetectConfig

    default = DetectConfig().threshold
    bench = bench_results.begin("tune", "dev", argv)
    runs = dev_runs(args.dev_dir)
    sweeps, chosen = {}, {}
    for name in (None, *PIPELINE_DETECTORS):
        key = name or "reveal"
        sweeps[key] = sweep(runs, name)
        chosen[key] = choose(sweeps[key], default)
        print(f"{key:10s} " + "  ".join(f"{r['threshold']:g}:{r['f1']:.3f}/{r['false_events_total']}"
                                        for r in sweeps[key])
              + f"   -> {chosen[key]:g}", flush=True)
    res = {"dev_dir": os.path.abspath(args.dev_dir), "runs": [os.path.basename(r) for r in runs],
           "grid": list(GRID), "default_threshold": default, "sweeps": sweeps,
           "chosen": chosen}
    path = bench.write(args.results or bench.default_path(), res)
    doc = {"thresholds": {k: v for k, v in chosen.items() if k != "reveal"},
           "reveal_would_choose": chosen["reveal"], "reveal_uses": default,
           "tuned_on": os.path.relpath(path, HERE), "commit": bench.header["commit"]}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"results: {path}\nthresholds: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
