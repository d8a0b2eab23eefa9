#!/usr/bin/env python3
"""Scale: analysis of long runs (1 h, 24 h, 7 days x ~700 channels at 10 Hz) in bounded memory.

    python benchmarks/scale/run.py --hours H [--keep DIR] [--no-full] [--replay-above 24]
                                   [--split dev|test] [--results FILE]

Telemetry: :class:`reveal_plugins.detect.synth.SynthHost` (64 cores, 140 extra gauges: 688
raw channels, the procfs layout), written through the real segment store, with a CPU and a
storage anomaly (30 s and 20 s).  Each analysis runs in a fresh process (wall time, peak RSS
from ``ru_maxrss``), through ``analysis.analyze_and_publish`` like the Epilog's.

* ``H <= --replay-above`` (default 24): H hours of segments (plus a 1-s final segment, the one
  the agent writes when the run ends).  ``--full`` is measured first (it rebuilds the feature
  store from the raw segments, as the agent would have built it while the run went on: the two
  give identical files, ``tests/test_scale_longrun.py``); then the feature file of the final
  segment is removed (the agent featurizes a segment after writing it, so at job end the last
  one is the raw tail) and the job-end analysis is measured.
* ``H > --replay-above`` (7 days = 168): a clean hour and an hour with the anomalies are
  synthesized and featurized (``--full``, timed); the long run's feature store is those hours'
  windows replayed, one file per hour (window start times shifted to each hour, ~4 s between
  hours without windows; the anomalous hour at 40 % of the run); its segment directory holds
  the clean hour's segments as hard links (the ones before the last hour are never read: their
  windows are in the store) and its final segment as the raw tail.  Job end is
  measured on it; ``full_s`` is **extrapolated** (hours x the measured per-hour ``--full``
  time), not measured, and ``full_rss_mb`` the larger of the measured 1-h ``--full`` peak
  (featurizing holds one segment at a time) and this job-end peak (``--full`` then makes the
  same pass over the features).

Up to 2 h the in-memory pipeline is measured on the same run as the reference (ratios printed).
The last line is ``job_end_s=... job_end_rss_mb=... full_s=... full_rss_mb=...``.  Goals
(issue 12): job end <= 60 s and <= 1 GB for 7 days; --full linear in duration and <= 1 GB at
any length; 1 h still <= 10 s.  Results: ``benchmarks/scale/results/scale-<H>h-<split>-<date>.json``
(``--results``; the :mod:`results` header; ``--split test`` is refused from a dirty tree).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(HERE))
import results as bench_results  # noqa: E402

T0 = 1.7e9
CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
run_dir, cfg = sys.argv[1], json.loads(sys.argv[2])
t0 = time.perf_counter()
from reveal_plugins.analysis import analyze_and_publish
rep = analyze_and_publish(run_dir, cfg, publish=False)
dt = time.perf_counter() - t0
an = [[round(a["start"], 1), round(a["end"], 1), a["subsystem"]] for a in rep["anomalies"]]
print(json.dumps(dict(seconds=dt, peak_rss_mb=resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1024, anomalies=an, status=rep["status"],
    windows=rep["analysis"].get("windows"), fit_windows=rep["analysis"].get("fit_windows"),
    modelled=rep["analysis"].get("channels_modelled"), streamed=rep["analysis"].get("streamed",
    False))))
"""


def host(t0: float, hours: float, anomalous: bool):
    from reveal_plugins.detect.synth import SynthHost
    an = [("cpu", hours * 3600 * 0.3, hours * 3600 * 0.3 + 30),
          ("storage", hours * 3600 * 0.7, hours * 3600 * 0.7 + 20)] if anomalous else []
    return SynthHost(64, t0=t0, seed=1, extra_gauges=140, anomalies=an)


def make_run(d: str, t0: float, hours: float, anomalous: bool = True) -> float:
    t = time.perf_counter()
    host(t0, hours, anomalous).write_run(d, hours * 3600 + 1.0, 0.1)
    return time.perf_counter() - t


def measure(run_dir: str, cfg: dict) -> dict:
    code = CHILD.format(root=ROOT)
    r = subprocess.run([sys.executable, "-c", code, run_dir, json.dumps(cfg)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def drop_tail_features(d: str) -> None:
    """Remove the feature file of the final segment: at job end it is the raw tail."""
    from reveal_plugins.detect.longrun.featstore import FeatureStore
    fs = FeatureStore.for_run(d)
    a, b, p = max(fs.files(), key=lambda f: f[1])
    if a != b:
        raise RuntimeError(f"{p}: the final segment is in a merged file")
    os.unlink(p)


def du_mb(path: str) -> float:
    tot = 0
    for dp, _, fn in os.walk(path):
        for f in fn:
            st = os.lstat(os.path.join(dp, f))
            tot += st.st_size if st.st_nlink == 1 else 0
    return tot / 1e6


def direct(hours: float, base: str, do_full: bool) -> dict:
    d = os.path.join(base, f"run-{hours:g}h")
    gen = make_run(d, T0, hours)
    raw_mb = du_mb(os.path.join(d, "segments"))
    print(f"# synthesized {hours:g} h in {gen:.0f} s ({raw_mb:.0f} MB of segments)", flush=True)
    row = {"hours": hours, "generate_s": round(gen, 1), "segments_mb": round(raw_mb)}
    full = measure(d, {"full": True, "stream_after_s": 0})
    row["full"] = full
    row["features_mb"] = round(du_mb(os.path.join(d, "features")))
    print(f"# --full (streamed, from raw): {json.dumps(full)}", flush=True)
    drop_tail_features(d)
    job = measure(d, {})
    row["job_end"] = job
    print(f"# job end (default settings): {json.dumps(job)}", flush=True)
    if not job["streamed"]:
        drop_tail_features(d)
        st = measure(d, {"stream_after_s": 0})
        row["job_end_streamed"] = st
        print(f"# job end, streamed path forced (stream_after_s=0): {json.dumps(st)}",
              flush=True)
    if hours <= 2:   # the reference, same run: the in-memory pipeline (~0.5 GB per hour)
        drop_tail_features(d)
        mem = measure(d, {"stream_after_s": 1e9})
        row["in_memory"] = mem
        print(f"# reference, in-memory pipeline: {json.dumps(mem)}", flush=True)
        print(f"# job end / in-memory: time x{job['seconds'] / mem['seconds']:.2f}, peak RSS "
              f"x{job['peak_rss_mb'] / mem['peak_rss_mb']:.2f}; same anomalies: "
              f"{[a[2] for a in job['anomalies']] == [a[2] for a in mem['anomalies']]}",
              flush=True)
    if not do_full:
        row.pop("full")
    row["same_anomalies_job_end_vs_full"] = job["anomalies"] == full["anomalies"]
    return row


def replayed(hours: int, base: str) -> dict:
    """A long run from two featurized hours (see the module docstring)."""
    import numpy as np

    from reveal_plugins.detect.longrun.featstore import FeatureStore, merge, read, read_info, read_names
    from reveal_plugins.store import store

    last = hours - 1
    hot = int(hours * 0.4)
    pa_, pb = os.path.join(base, "pool-clean"), os.path.join(base, "pool-anomalous")
    make_run(pa_, T0 + last * 3600, 1, anomalous=False)
    make_run(pb, T0 + hot * 3600, 1, anomalous=True)
    pools = {}
    for name, d, k0 in (("clean", pa_, last), ("anomalous", pb, hot)):
        r = measure(d, {"full": True, "stream_after_s": 0})
        print(f"# pool {name}: --full of 1 h: {json.dumps(r)}", flush=True)
        fs = FeatureStore.for_run(d)
        segs = store.segment_paths(d)
        n = len(segs) - 1          # the hour's segments but the last: that one is the tail
        files = [f for f in fs.files() if f[1] <= n]
        if not files or files[-1][1] != n:
            raise RuntimeError(f"{d}: feature files do not end at segment {n}")
        pools[name] = (merge([read(f[2]) for f in files]), read_info(files[-1][2])["state"],
                       read_names(files[-1][2]), k0, r, segs)
    run = os.path.join(base, f"run-{hours}h")
    sd = os.path.join(run, "segments")
    os.makedirs(sd)
    meta = store.read_meta(pa_)
    meta.update(start=T0, end=T0 + hours * 3600 + 1.0)
    meta["run"]["run_id"] = os.path.basename(run)
    store.write_meta(run, meta)
    segs = pools["clean"][5]
    n = len(segs) - 1
    for k in range(hours):             # hard links: never read (their windows are stored)
        for i in range(n):
            os.link(segs[i], os.path.join(sd, f"seg-{k * n + i + 1:06d}.parquet"))
    os.link(segs[n], os.path.join(sd, f"seg-{hours * n + 1:06d}.parquet"))   # the raw tail
    out = FeatureStore.for_run(run, create=True, sync=False)
    t = time.perf_counter()
    for k in range(hours):
        ch, state, names, k0 = pools["anomalous" if k == hot else "clean"][:4]
        shift = (k - k0) * 3600.0
        c2 = type(ch)(ch.start + shift, ch.count, ch.valid, ch.stats, ch.colstats)
        c2.samples, c2.t_min, c2.t_max = ch.samples, ch.t_min + shift, ch.t_max + shift
        c2.gaps, c2.resets, c2.dropped_t = [], ch.resets, ch.dropped_t
        st = dict(state, t0=T0, next_w=int(state["next_w"] + round((k0 * 3600 + shift)
                                                                      / state["stride_s"])),
                  last_t=state["last_t"] + shift)
        out.write(c2, k * n + 1, (k + 1) * n, st, names)
    build = time.perf_counter() - t
    print(f"# replayed feature store: {hours} hour files in {build:.0f} s "
          f"({du_mb(os.path.join(run, 'features')):.0f} MB)", flush=True)
    job = measure(run, {})
    print(f"# job end: {json.dumps(job)}", flush=True)
    per_hour = np.mean([p[4]["seconds"] for p in pools.values()])
    return {"hours": hours, "job_end": job, "full_per_hour_s": round(float(per_hour), 2),
            "full": {"seconds": float(per_hour) * hours, "extrapolated": True,
                     # --full = featurizing (one segment at a time: the 1-h figure) + this
                     # same pass over the features
                     "peak_rss_mb": max([p[4]["peak_rss_mb"] for p in pools.values()]
                                        + [job["peak_rss_mb"]])},
            "pools": {k: v[4] for k, v in pools.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, required=True)
    ap.add_argument("--keep", help="keep the run directories here (default: removed)")
    ap.add_argument("--no-full", action="store_true", help="skip reporting --full")
    ap.add_argument("--replay-above", type=float, default=24.0,
                    help="longer runs are built by replaying featurized hours")
    bench_results.add_args(ap)
    args = ap.parse_args(argv)
    bench = bench_results.begin("scale", args.split, argv)
    base = args.keep or tempfile.mkdtemp(prefix="reveal-scale-")
    os.makedirs(base, exist_ok=True)
    try:
        if args.hours > args.replay_above:
            row = replayed(int(round(args.hours)), base)
        else:
            row = direct(args.hours, base, not args.no_full)
        with open(os.path.join(base, f"scale-{args.hours:g}h.json"), "w") as f:
            json.dump(row, f, indent=1)
        print(json.dumps(row))
        print("results: " + bench.write(args.results or bench.default_path(
            f"scale-{args.hours:g}h"), row))
        j, fu = row["job_end"], row.get("full") or {}
        ext = " (extrapolated)" if fu.get("extrapolated") else ""
        print(f"# goals: job end <= 60 s and <= 1024 MB at 7 days; 1 h <= 10 s; --full <= 1024 "
              f"MB, linear in duration{ext}")
        print(f"job_end_s={j['seconds']:.1f} job_end_rss_mb={j['peak_rss_mb']:.0f} "
              f"full_s={fu.get('seconds', float('nan')):.1f} "
              f"full_rss_mb={fu.get('peak_rss_mb', float('nan')):.0f}")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
