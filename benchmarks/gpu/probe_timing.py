#!/usr/bin/env python3
"""Time reveal's NVML probe per GPU per sample against two references, in the same run.

- probe:   ``NvmlProbe.sample()`` (what the agent calls every 100 ms), back to back;
- naive:   a plain collector that reads the same kinds of metrics with one NVML call per
           metric and one ``nvmlDeviceGetFieldValues`` call per field;
- smi:     one ``nvidia-smi --query-gpu=...`` process per sample (what scripts often do).
Also counts NVML calls per GPU per sample for the probe (the binding's function-pointer lookup
is wrapped, so every C call is counted).  Output: JSON.

    PYTHONPATH=. python benchmarks/gpu/probe_timing.py --out timing.json [--samples 300]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import pynvml as nv


def stats(ts):
    ts = sorted(ts)
    return {"n": len(ts), "median_us": round(statistics.median(ts) * 1e6, 1),
            "p99_us": round(ts[int(0.99 * (len(ts) - 1))] * 1e6, 1),
            "max_us": round(ts[-1] * 1e6, 1)}


class CallCounter:
    """Counts C calls through the binding's single function-pointer lookup."""

    def __init__(self):
        self.n = 0
        self.by = {}
        self._orig = nv._nvmlGetFunctionPointer

    def __enter__(self):
        def counted(name):
            fn = self._orig(name)

            def call(*a):
                self.n += 1
                self.by[name] = self.by.get(name, 0) + 1
                return fn(*a)
            return call
        nv._nvmlGetFunctionPointer = counted
        return self

    def __exit__(self, *exc):
        nv._nvmlGetFunctionPointer = self._orig


def time_probe(samples):
    from reveal_plugins.probes.nvml import NvmlProbe
    p = NvmlProbe()
    t0 = time.perf_counter()
    p.open()
    out = {"open_s": round(time.perf_counter() - t0, 4), "describe": p.describe()}
    if not p.available:
        return out
    ngpu = len({c.name.split(".")[1] for c in p.channels})
    out["gpus"] = ngpu
    out["channels"] = [c.name for c in p.channels]
    ts = []
    for _ in range(10):
        p.sample()
    with CallCounter() as cc:
        for _ in range(samples):
            t = time.perf_counter()
            p.sample()
            ts.append(time.perf_counter() - t)
    out["per_sample"] = stats(ts)
    out["per_gpu_per_sample_median_us"] = round(statistics.median(ts) / ngpu * 1e6, 1)
    out["calls_per_gpu_per_sample"] = round(cc.n / samples / ngpu, 2)
    out["calls_by_symbol"] = {k: round(v / samples / ngpu, 2) for k, v in sorted(cc.by.items())}
    vals = dict(zip(out["channels"], p.sample()))
    out["last_values"] = {k: (None if v != v else v) for k, v in vals.items()}
    p.close()
    return out


def time_naive(samples):
    nv.nvmlInit()
    hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    fids = [nv.NVML_FI_DEV_POWER_INSTANT, nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
            nv.NVML_FI_DEV_MEMORY_TEMP, nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
            nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
            nv.NVML_FI_DEV_PERF_POLICY_POWER, nv.NVML_FI_DEV_PERF_POLICY_THERMAL,
            nv.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, nv.NVML_FI_DEV_ECC_DBE_VOL_TOTAL]

    def one(h):
        for fn in (lambda: nv.nvmlDeviceGetUtilizationRates(h),
                   lambda: nv.nvmlDeviceGetMemoryInfo(h),
                   lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                   lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                   lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                   lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
                   lambda: nv.nvmlDeviceGetPowerUsage(h),
                   lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
                   lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)):
            try:
                fn()
            except nv.NVMLError:
                pass
        for f in fids:
            nv.nvmlDeviceGetFieldValues(h, [f])
    ts = []
    for _ in range(samples):
        t = time.perf_counter()
        for h in hs:
            one(h)
        ts.append(time.perf_counter() - t)
    nv.nvmlShutdown()
    return {"per_sample": stats(ts),
            "per_gpu_per_sample_median_us": round(statistics.median(ts) / len(hs) * 1e6, 1)}


def time_smi(reps):
    q = ("utilization.gpu,utilization.memory,memory.used,temperature.gpu,clocks.sm,clocks.mem,"
         "clocks_event_reasons.active,power.draw,power.limit,pcie.link.gen.current,"
         "pcie.link.width.current")
    ts, out = [], ""
    for _ in range(reps):
        t = time.perf_counter()
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        ts.append(time.perf_counter() - t)
        out = r.stdout.strip() or r.stderr.strip()
    return {"per_sample": stats(ts), "output": out}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=300)
    a = ap.parse_args(argv)
    doc = {"t": time.time(), "python": platform.python_version()}
    for name, fn in (("probe", lambda: time_probe(a.samples)),
                     ("naive", lambda: time_naive(a.samples)),
                     ("smi", lambda: time_smi(10))):
        try:
            doc[name] = fn()
        except Exception as e:
            import traceback
            doc[name] = {"error": traceback.format_exc()}
        print(name, json.dumps({k: v for k, v in doc[name].items()
                                if k not in ("channels", "last_values", "describe")})[:600],
              file=sys.stderr)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
