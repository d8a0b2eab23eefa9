#!/usr/bin/env python3
"""Performance of the analysis: 700 channels at 10 Hz for 15 min, 30 min, 1 h, 2 h (synthetic
telemetry with the procfs layout, written through the real segment store), analysed in a fresh
process each (time, peak RSS), with the single-IsolationForest reference timed in the same run.

    python benchmarks/detection/perf.py                  # 15,30,60,120 min
    python benchmarks/detection/perf.py --minutes 15,60  # a subset
Goal: 1 h in <= 10 s with <= 1 GB peak RSS on 2 cores; cost linear in duration.
Results: ``benchmarks/detection/results/perf-<split>-<date>.json`` (``--results``; the
:mod:`results` header, ``{"rows": [...]}``; ``--split test`` is refused from a dirty tree).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import results as bench_results  # noqa: E402

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {here!r})
what, run_dir = sys.argv[1], sys.argv[2]
t0 = time.perf_counter(); c0 = time.process_time()
if what == "reveal":
    from reveal_plugins.detect import analyze
    rep = analyze(run_dir)
    extra = {{"anomalies": len(rep["anomalies"]), "windows": rep["analysis"].get("windows"),
             "modelled": rep["analysis"].get("channels_modelled")}}
else:
    from scoring import reference_iforest
    extra = {{"events": len(reference_iforest(run_dir))}}
dt = time.perf_counter() - t0
print(json.dumps(dict(seconds=dt, cpu_seconds=time.process_time() - c0, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra)))
"""


def make_run(d: str, minutes: float) -> int:
    from reveal_plugins.detect.synth import SynthHost

    h = SynthHost(64, seed=1, extra_gauges=140,
                  anomalies=[("cpu", minutes * 30, minutes * 30 + 30),
                             ("storage", minutes * 45, minutes * 45 + 20)])
    h.write_run(d, minutes * 60, 0.1)
    return len(h.channels)


def measure(what: str, run_dir: str) -> dict:
    code = CHILD.format(root=ROOT, here=HERE)
    r = subprocess.run([sys.executable, "-c", code, what, run_dir], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", default="15,30,60,120")
    ap.add_argument("--reference", action="store_true",
                    help="also time the 1xIsolationForest reference (slow on long runs)")
    ap.add_argument("--keep", help="keep run directories here")
    bench_results.add_args(ap)
    args = ap.parse_args(argv)
    bench = bench_results.begin("perf", args.split, argv)
    base = args.keep or tempfile.mkdtemp(prefix="reveal-perf-")
    rows = []
    for m in [float(x) for x in args.minutes.split(",")]:
        d = os.path.join(base, f"run-{m:g}min")
        if not os.path.exists(os.path.join(d, "meta.json")):
            t0 = time.perf_counter()
            nch = make_run(d, m)
            gen = time.perf_counter() - t0
        else:
            nch, gen = len(json.load(open(os.path.join(d, "meta.json")))["channels"]), 0.0
        size = sum(os.path.getsize(os.path.join(d, "segments", f))
                   for f in os.listdir(os.path.join(d, "segments")))
        r = measure("reveal", d)
        row = {"minutes": m, "channels": nch, "samples": int(m * 600), "stored_mb":
               round(size / 1e6, 1), "seconds": round(r["seconds"], 2),
               "cpu_seconds": round(r["cpu_seconds"], 2),
               "peak_rss_mb": round(r["peak_rss_mb"]), "anomalies": r["anomalies"],
               "windows": r["windows"], "channels_modelled": r["modelled"],
               "generate_s": round(gen, 1)}
        if args.reference:
            rr = measure("reference", d)
            row["reference_seconds"] = round(rr["seconds"], 2)
            row["reference_cpu_seconds"] = round(rr["cpu_seconds"], 2)
            row["reference_peak_rss_mb"] = round(rr["peak_rss_mb"])
            row["speed_ratio_vs_reference"] = round(rr["seconds"] / max(r["seconds"], 1e-9), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print(f"{'duration':>9s} {'channels':>8s} {'samples':>8s} {'wall s':>10s} {'CPU s':>7s} "
          f"{'wall s/h':>10s} {'peak RSS MB':>11s} {'anomalies':>9s}"
          + (f" {'1xIForest s':>11s}" if args.reference else ""))
    for r in rows:
        print(f"{r['minutes']:>7g} m {r['channels']:>8d} {r['samples']:>8d} {r['seconds']:>10.2f} "
              f"{r['cpu_seconds']:>7.2f} "
              f"{r['seconds'] / (r['minutes'] / 60):>10.2f} {r['peak_rss_mb']:>11d} "
              f"{r['anomalies']:>9d}" + (f" {r['reference_seconds']:>11.2f}" if args.reference
                                         else ""))
    one_h = [r for r in rows if r["minutes"] == 60]
    if one_h:
        r = one_h[0]
        print(f"\n1 h x {r['channels']} channels: {r['seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s "
              f"CPU (goal <= 10 s; wall > CPU means other load on the machine), "
              f"peak RSS {r['peak_rss_mb']} MB (goal <= 1024 MB)")
    with open(os.path.join(base, "perf.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"run directories and perf.json in {base}")
    print(f"results: {bench.write(args.results or bench.default_path(), {'rows': rows})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
