#!/usr/bin/env python3
"""The NVML probe's cost on the driver-level fake (8 GPUs), with references in the same run.

Measured per sample (all 8 GPUs), back to back, for each driver mode (current, old driver):
- ``probe``: :class:`reveal_plugins.probes.nvml.NvmlProbe` as the agent calls it;
- ``previous``: the probe as it was before this issue (``--previous-rev``, loaded from git), on
  the same fake: the reference;
- ``driver``: time spent inside the fake driver's C functions during the probe's samples (the
  part a real driver replaces with its own, usually cheaper, cost), so ``probe - driver`` is
  the probe's own Python cost;
and the C calls per GPU per sample, the slowest sample (a blocking call shows there).

    python benchmarks/gpu/probe_fake.py [--samples 300] [--split dev|test] [--results FILE]

Results: ``benchmarks/gpu/results/gpu_fake-<split>-<date>.json`` with the :mod:`results`
header (``--split test`` is refused from a dirty tree).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

from fixtures_nvml import FakeDriver, install_fake_nvml  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import results as bench_results  # noqa: E402


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout.strip()


def _previous_probe(rev: str):
    # the probe moved from telemetry/ to probes/ after the reference revision
    src = (_git("show", f"{rev}:reveal_plugins/probes/nvml.py")
           or _git("show", f"{rev}:reveal_plugins/telemetry/nvml.py"))
    if not src:
        raise SystemExit(f"probe_fake.py: no nvml.py at --previous-rev {rev}")
    d = tempfile.mkdtemp()
    path = os.path.join(d, "nvml_previous.py")
    with open(path, "w") as f:
        f.write(src.replace("from ..types import", "from reveal_plugins.types import")
                .replace("from .probe import", "from reveal_plugins.probes.probe import"))
    spec = importlib.util.spec_from_file_location("nvml_previous", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.NvmlProbe


class DriverTimer:
    """Wraps the fake library's C functions to add up the time spent inside them."""

    def __init__(self, drv: FakeDriver):
        self.total = 0.0
        funcs = drv.lib.__dict__["_functions"]   # the fake library's symbol table
        self._keep = []
        for name, fn in list(funcs.items()):
            funcs[name] = self._wrap(fn)

    def _wrap(self, fn):
        # keep a CFUNCTYPE object: the binding calls it like the C library's symbol
        proto = type(fn)

        me = threading.get_ident()   # the sampling thread (the legacy PCIe thread is not)

        def timed(*a):
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                if threading.get_ident() == me:
                    self.total += time.perf_counter() - t
        c = proto(timed)
        self._keep.append(c)   # a ctypes callback must outlive its callers
        return c


def measure(probe_cls, drv_kwargs: dict, samples: int, interval: float) -> dict:
    drv = FakeDriver(**drv_kwargs)
    for g in drv.gpus:
        g.busy()
    timer = DriverTimer(drv)
    with install_fake_nvml(drv):
        p = probe_cls()
        t0 = time.perf_counter()
        p.open()
        opened = time.perf_counter() - t0
        if not p.available:
            return {"error": p.reason}
        for _ in range(10):
            p.sample()
        drv.reset_calls()
        timer.total = 0.0
        ts = []
        for _ in range(samples):
            t = time.perf_counter()
            p.sample()
            ts.append(time.perf_counter() - t)
            if interval:
                time.sleep(interval)
        calls = drv.calls_per_gpu()
        ngpu = len(drv.gpus)
        p.close()
    ts.sort()
    return {"channels": len(p.channels), "open_s": round(opened, 4),
            "per_sample_median_ms": round(statistics.median(ts) * 1e3, 3),
            "per_sample_p99_ms": round(ts[int(0.99 * (len(ts) - 1))] * 1e3, 3),
            "per_sample_max_ms": round(ts[-1] * 1e3, 3),
            "driver_ms_per_sample": round(timer.total / samples * 1e3, 3),
            "probe_own_ms_per_sample": round((sum(ts) - timer.total) / samples * 1e3, 3),
            "calls_per_gpu_per_sample": round(sum(calls.values()) / ngpu / samples, 2)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--interval", type=float, default=0.01,
                    help="sleep between samples (lets background threads run, as in the agent)")
    ap.add_argument("--previous-rev", default="d643792")
    bench_results.add_args(ap)
    a = ap.parse_args(argv)
    bench = bench_results.begin("gpu_fake", a.split, argv,
                                extra_paths=("tests/fixtures_nvml.py",))
    from reveal_plugins.probes.nvml import NvmlProbe
    prev = _previous_probe(a.previous_rev)
    doc = {"what": "nvml probe on the driver-level fake, 8 GPUs",
           "samples": a.samples, "previous_rev": a.previous_rev, "modes": {}}
    for mode, kw in (("current_driver", {}), ("old_driver", {"old_driver": True}),
                     ("32bit_counters_refused_gpu", {"pcie_counter_bits": 32,
                                                     "refused": {5: "no_permission"}})):
        row = {"probe": measure(NvmlProbe, kw, a.samples, a.interval)}
        if prev is not None:
            try:
                row["previous"] = measure(prev, kw, a.samples, a.interval)
            except Exception as e:  # the old probe may not survive a mode at all
                row["previous"] = {"error": f"{type(e).__name__}: {e}"}
        doc["modes"][mode] = row
        print(mode, json.dumps(row), flush=True)
    print("results: " + bench.write(a.results or bench.default_path(), doc))


if __name__ == "__main__":
    main()
