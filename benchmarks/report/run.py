"""Report rendering on a 2-hour run: HTML size and render times.

    python benchmarks/report/run.py            # ~1-2 min on 2 cores

Builds synthetic run directories with the real store (CPU, memory, disk, network, one GPU,
plus filler gauges up to CHANNELS channels) for 2 h at 10 Hz (the default sampling) and, as
the reference measured in the same run, 2 h at 1 Hz; renders the text summary and the HTML page
of each and prints sizes, times and the 10 Hz / 1 Hz ratios.  The HTML size should not grow
with the sample count (display bins, not samples, decide it).

    python benchmarks/report/run.py [--split dev|test] [--results FILE]

Results: ``benchmarks/report/results/report-<split>-<date>.json`` (the :mod:`results` header;
``--split test`` is refused from a dirty tree).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

import results as bench_results  # noqa: E402

from fixtures_report import make_report, make_run  # noqa: E402

from reveal_plugins.report.html import render_html  # noqa: E402
from reveal_plugins.report.text import render_text  # noqa: E402

SECONDS = 7200
CHANNELS = 300


def one(base: str, interval: float) -> dict:
    d = os.path.join(base, f"run-{interval}")
    t0 = time.perf_counter()
    meta = make_run(d, seconds=SECONDS, interval=interval, cpu_episode=(3000, 3300),
                    io_episode=(5000, 5060), iterations=False, segment_s=10.0,
                    extra_gauges=max(0, CHANNELS - 48))
    t_make = time.perf_counter() - t0
    rep = make_report(meta)
    rep["anomalies"][0]["end"] = rep["run"]["start"] + 3300
    with open(os.path.join(d, "report.json"), "w") as f:
        json.dump(rep, f)
    t0 = time.perf_counter()
    text = render_text(rep, color=False, run_dir=d)
    t_text = time.perf_counter() - t0
    t0 = time.perf_counter()
    html = render_html(rep, d)
    t_html = time.perf_counter() - t0
    stored = sum(f.stat().st_size for f in pathlib.Path(d, "segments").iterdir())
    return {"interval_s": interval, "samples": int(SECONDS / interval) + 1,
            "channels": len(meta["channels"]), "stored_MB": stored / 1e6,
            "build_s": t_make, "text_s": t_text, "text_lines": len(text.splitlines()),
            "html_s": t_html, "html_KiB": len(html.encode()) / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_results.add_args(ap)
    a = ap.parse_args()
    bench = bench_results.begin("report", a.split, extra_paths=("tests/fixtures_report.py",))
    with tempfile.TemporaryDirectory(prefix="reveal-bench-report-") as base:
        ref = one(base, 1.0)
        big = one(base, 0.1)
    keys = ("samples", "channels", "stored_MB", "build_s", "text_s", "text_lines", "html_s",
            "html_KiB")
    print(f"{'2 h run':<12}" + "".join(f"{k:>12}" for k in keys))
    for r in (ref, big):
        print(f"{str(r['interval_s']) + ' s':<12}" + "".join(
            f"{r[k]:>12.1f}" if isinstance(r[k], float) else f"{r[k]:>12}" for k in keys))
    print(f"{'ratio':<12}" + "".join(f"{big[k] / ref[k]:>12.2f}" if ref[k] else f"{'-':>12}"
                                     for k in keys))
    print("results: " + bench.write(a.results or bench.default_path(),
                                    {"seconds": SECONDS, "channels": CHANNELS,
                                     "reference_1hz": ref, "run_10hz": big}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
