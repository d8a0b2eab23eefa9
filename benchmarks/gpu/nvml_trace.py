#!/usr/bin/env python3
"""Raw NVML answers at 10 Hz, one JSON line per sample, for replay under the fake driver.

Independent of reveal's probe on purpose: it keeps what the driver said (values, value types,
errors), so tests can replay a real GPU's behaviour through the fake driver under the real
binding.  Read-only; stops after --seconds or when --stop-file appears.

    python benchmarks/gpu/nvml_trace.py --out trace.jsonl --seconds 100 [--gpus 0]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import pynvml as nv

UINT_MAX = 0xFFFFFFFF
FIELDS = ["POWER_INSTANT", "TOTAL_ENERGY_CONSUMPTION", "MEMORY_TEMP", "PCIE_COUNT_TX_BYTES",
          "PCIE_COUNT_RX_BYTES", "PCIE_REPLAY_COUNTER", "POWER_CURRENT_LIMIT",
          "PERF_POLICY_POWER", "PERF_POLICY_THERMAL", "PERF_POLICY_SYNC_BOOST",
          "PERF_POLICY_BOARD_LIMIT", "PERF_POLICY_LOW_UTILIZATION", "PERF_POLICY_RELIABILITY",
          "PERF_POLICY_TOTAL_APP_CLOCKS", "PERF_POLICY_TOTAL_BASE_CLOCKS",
          "NVLINK_THROUGHPUT_DATA_TX", "NVLINK_THROUGHPUT_DATA_RX", "ECC_SBE_VOL_TOTAL",
          "ECC_DBE_VOL_TOTAL", "REMAPPED_PENDING", "REMAPPED_FAILURE"]
ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _e(e):
    return type(e).__name__


def sample(h, n, ids):
    s = {}

    def put(k, fn):
        try:
            s[k] = fn()
        except nv.NVMLError as e:
            s[k] = {"err": _e(e)}
    put("util", lambda: [nv.nvmlDeviceGetUtilizationRates(h).gpu,
                         nv.nvmlDeviceGetUtilizationRates(h).memory])
    put("mem", lambda: [nv.nvmlDeviceGetMemoryInfo(h).used, nv.nvmlDeviceGetMemoryInfo(h).total])
    put("temp", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
    put("clk", lambda: [nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)])
    put("reasons", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
    put("pstate", lambda: nv.nvmlDeviceGetPerformanceState(h))

    def fields():
        vals = nv.nvmlDeviceGetFieldValues(h, ids)
        return [[int(v.nvmlReturn), int(v.valueType),
                 getattr(v.value, ATTR.get(v.valueType, "ullVal")) if v.nvmlReturn == 0
                 else None, int(v.timestamp)] for v in vals]
    put("fields", fields)
    put("procs", lambda: [[p.pid, p.usedGpuMemory] for p in
                          nv.nvmlDeviceGetComputeRunningProcesses(h)])
    put("gprocs", lambda: [[p.pid, p.usedGpuMemory] for p in
                           nv.nvmlDeviceGetGraphicsRunningProcesses(h)])
    if n % 10 == 0:
        put("link", lambda: [nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
                             nv.nvmlDeviceGetCurrPcieLinkWidth(h)])
        put("putil", lambda: [[p.pid, p.smUtil, p.memUtil, p.timeStamp] for p in
                              nv.nvmlDeviceGetProcessUtilization(
                                  h, int((time.time() - 1.5) * 1e6))])
        put("viol_power", lambda: [nv.nvmlDeviceGetViolationStatus(
            h, nv.NVML_PERF_POLICY_POWER).violationTime])
    return s


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=100)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--gpus", default="all")
    ap.add_argument("--stop-file", default=None)
    a = ap.parse_args(argv)
    nv.nvmlInit()
    n_gpu = nv.nvmlDeviceGetCount()
    want = range(n_gpu) if a.gpus == "all" else [int(x) for x in a.gpus.split(",")]
    hs = {i: nv.nvmlDeviceGetHandleByIndex(i) for i in want}
    ids = []
    for f in FIELDS:
        fid = getattr(nv, "NVML_FI_DEV_" + f, None)
        if fid is not None:
            ids.append((fid, UINT_MAX if "NVLINK" in f else 0))
    with open(a.out, "w") as out:
        out.write(json.dumps({"header": {"fields": FIELDS, "ids": ids,
                                         "gpus": list(want)}}) + "\n")
        t_end = time.monotonic() + a.seconds
        n = 0
        nxt = time.monotonic()
        while time.monotonic() < t_end:
            if a.stop_file and os.path.exists(a.stop_file):
                break
            t0 = time.perf_counter()
            rec = {"t": time.time(), "g": {i: sample(h, n, ids) for i, h in hs.items()}}
            rec["cost_us"] = round((time.perf_counter() - t0) * 1e6)
            out.write(json.dumps(rec) + "\n")
            n += 1
            nxt += a.interval
            time.sleep(max(0.0, nxt - time.monotonic()))
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
