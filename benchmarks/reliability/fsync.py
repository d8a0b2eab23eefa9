"""What fsync costs the agent: time per segment (and per meta.json) with and without it.

    python benchmarks/reliability/fsync.py [--segments 40] [--channels 700] [--dir DIR]

A segment is the agent's: ``--channels`` channels x 100 samples (10 s at 100 ms), about half of
them changing each tick.  ``--dir`` must be on the disk the spool lives on (a tmpfs makes
fsync free).  Take the quiet lock for figures: ``flock /tmp/reveal-quiet.lock python ...``.
Last line: ``seg_ms_sync=… seg_ms_nosync=… seg_ratio=… meta_ms_sync=… meta_ms_nosync=…``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from reveal_plugins.store import rundir, store  # noqa: E402
from reveal_plugins.types import ChannelMeta  # noqa: E402


def _segments(d: str, chans: list[ChannelMeta], n: int, sync: bool) -> float:
    """Median ms of one ``SegmentWriter.flush`` (the rows are built beforehand)."""
    rng = np.random.default_rng(0)
    w = store.SegmentWriter(d, chans, segment_s=1e9, sync=sync)
    base = rng.normal(100, 10, len(chans))
    times = []
    for s in range(n):
        for k in range(100):
            row = base.copy()
            row[: len(chans) // 2] += rng.normal(0, 1, len(chans) // 2)
            w.add(s * 10 + k * 0.1, row)
        t0 = time.perf_counter()
        w.flush()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def _meta(d: str, chans: list[ChannelMeta], n: int, sync: bool) -> float:
    import json
    data = json.dumps({"channels": [c.to_dict() for c in chans]}).encode()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        rundir.write_file(d, store.META, data, sync=sync)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=40)
    ap.add_argument("--channels", type=int, default=700)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir in .)")
    a = ap.parse_args()
    base = tempfile.mkdtemp(prefix=".fsync-bench-", dir=a.dir or ".")
    chans = [ChannelMeta(f"cpu.core{i}.user", "ticks", "counter", "procfs.stat")
             for i in range(a.channels)]
    try:
        res = {}
        for sync in (False, True, False, True):   # interleaved: a warm cache for both
            d = os.path.join(base, f"run-{sync}-{time.time_ns()}")
            os.makedirs(d)
            key = "sync" if sync else "nosync"
            res[f"seg_ms_{key}"] = min(res.get(f"seg_ms_{key}", 1e9),
                                       _segments(d, chans, a.segments, sync))
            res[f"meta_ms_{key}"] = min(res.get(f"meta_ms_{key}", 1e9),
                                        _meta(d, chans, a.segments, sync))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    res["seg_ratio"] = res["seg_ms_sync"] / res["seg_ms_nosync"]
    print(f"{a.channels} channels x 100 samples a segment, {a.segments} segments, median of "
          f"each mode (best of 2 passes), in {os.path.abspath(a.dir or '.')}")
    print(" ".join(f"{k}={res[k]:.2f}" for k in ("seg_ms_sync", "seg_ms_nosync", "seg_ratio",
                                                  "meta_ms_sync", "meta_ms_nosync")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
