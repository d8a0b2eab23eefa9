#!/usr/bin/env python3
"""What the NVIDIA driver on this node answers, and what each answer costs.

Read-only: calls only NVML *Get* functions (never a setter, never a reset) through the real
``nvidia-ml-py`` binding.  For every GPU it records which field ids answer (scope 0 and the
all-links scope ``UINT_MAX``) with their value type, which device calls answer or refuse (with
the NVML error), and the median latency of each call.  Output: one JSON document.

    python benchmarks/gpu/nvml_survey.py --out survey.json [--gpus 0] [--reps 20]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import pynvml as nv

UINT_MAX = 0xFFFFFFFF


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _plain(v, depth=0):
    """JSON-able view of what the binding returned (ctypes structs, lists, bytes)."""
    if depth > 3:
        return repr(v)[:200]
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x, depth + 1) for x in list(v)[:16]]
    fields = getattr(v, "_fields_", None)
    if fields:
        return {f[0]: _plain(getattr(v, f[0], None), depth + 1) for f in fields
                if not f[0].startswith("_")}
    return repr(v)[:200]


def timed(fn, reps):
    """(ok, value-or-error, median seconds)."""
    t = []
    val = None
    for _ in range(reps):
        t0 = time.perf_counter()
        try:
            val = fn()
        except nv.NVMLError as e:
            return False, _err(e), time.perf_counter() - t0
        except Exception as e:  # a binding fault is a finding too
            return False, "BINDING " + _err(e), time.perf_counter() - t0
        t.append(time.perf_counter() - t0)
    return True, _plain(val), statistics.median(t)


def device_calls(h):
    c = nv
    calls = {
        "GetName": lambda: c.nvmlDeviceGetName(h),
        "GetUUID": lambda: c.nvmlDeviceGetUUID(h),
        "GetSerial": lambda: c.nvmlDeviceGetSerial(h),
        "GetPciInfo_v3": lambda: c.nvmlDeviceGetPciInfo_v3(h),
        "GetMinorNumber": lambda: c.nvmlDeviceGetMinorNumber(h),
        "GetArchitecture": lambda: c.nvmlDeviceGetArchitecture(h),
        "GetCudaComputeCapability": lambda: c.nvmlDeviceGetCudaComputeCapability(h),
        "GetPersistenceMode": lambda: c.nvmlDeviceGetPersistenceMode(h),
        "GetComputeMode": lambda: c.nvmlDeviceGetComputeMode(h),
        "GetMigMode": lambda: c.nvmlDeviceGetMigMode(h),
        "GetMaxMigDeviceCount": lambda: c.nvmlDeviceGetMaxMigDeviceCount(h),
        "GetUtilizationRates": lambda: c.nvmlDeviceGetUtilizationRates(h),
        "GetMemoryInfo": lambda: c.nvmlDeviceGetMemoryInfo(h),
        "GetMemoryInfo_v2": lambda: c.nvmlDeviceGetMemoryInfo(h, version=c.nvmlMemory_v2),
        "GetBAR1MemoryInfo": lambda: c.nvmlDeviceGetBAR1MemoryInfo(h),
        "GetTemperature_GPU": lambda: c.nvmlDeviceGetTemperature(h, c.NVML_TEMPERATURE_GPU),
        "GetClockInfo_SM": lambda: c.nvmlDeviceGetClockInfo(h, c.NVML_CLOCK_SM),
        "GetClockInfo_MEM": lambda: c.nvmlDeviceGetClockInfo(h, c.NVML_CLOCK_MEM),
        "GetClockInfo_GRAPHICS": lambda: c.nvmlDeviceGetClockInfo(h, c.NVML_CLOCK_GRAPHICS),
        "GetMaxClockInfo_SM": lambda: c.nvmlDeviceGetMaxClockInfo(h, c.NVML_CLOCK_SM),
        "GetMaxClockInfo_MEM": lambda: c.nvmlDeviceGetMaxClockInfo(h, c.NVML_CLOCK_MEM),
        "GetCurrentClocksEventReasons": lambda: c.nvmlDeviceGetCurrentClocksEventReasons(h),
        "GetCurrentClocksThrottleReasons": lambda: c.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "GetSupportedClocksEventReasons": lambda: c.nvmlDeviceGetSupportedClocksEventReasons(h),
        "GetPerformanceState": lambda: c.nvmlDeviceGetPerformanceState(h),
        "GetPowerUsage": lambda: c.nvmlDeviceGetPowerUsage(h),
        "GetEnforcedPowerLimit": lambda: c.nvmlDeviceGetEnforcedPowerLimit(h),
        "GetPowerManagementDefaultLimit": lambda: c.nvmlDeviceGetPowerManagementDefaultLimit(h),
        "GetTotalEnergyConsumption": lambda: c.nvmlDeviceGetTotalEnergyConsumption(h),
        "GetCurrPcieLinkGeneration": lambda: c.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "GetCurrPcieLinkWidth": lambda: c.nvmlDeviceGetCurrPcieLinkWidth(h),
        "GetMaxPcieLinkGeneration": lambda: c.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "GetMaxPcieLinkWidth": lambda: c.nvmlDeviceGetMaxPcieLinkWidth(h),
        "GetGpuMaxPcieLinkGeneration": lambda: c.nvmlDeviceGetGpuMaxPcieLinkGeneration(h),
        "GetPcieReplayCounter": lambda: c.nvmlDeviceGetPcieReplayCounter(h),
        "GetPcieSpeed": lambda: c.nvmlDeviceGetPcieSpeed(h),
        "GetEccMode": lambda: c.nvmlDeviceGetEccMode(h),
        "GetTotalEccErrors_corr_vol": lambda: c.nvmlDeviceGetTotalEccErrors(
            h, c.NVML_MEMORY_ERROR_TYPE_CORRECTED, c.NVML_VOLATILE_ECC),
        "GetRemappedRows": lambda: c.nvmlDeviceGetRemappedRows(h),
        "GetRetiredPages_dbe": lambda: c.nvmlDeviceGetRetiredPages(
            h, c.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        "GetComputeRunningProcesses": lambda: c.nvmlDeviceGetComputeRunningProcesses(h),
        "GetGraphicsRunningProcesses": lambda: c.nvmlDeviceGetGraphicsRunningProcesses(h),
        "GetProcessUtilization": lambda: c.nvmlDeviceGetProcessUtilization(h, 0),
        "GetProcessesUtilizationInfo": lambda: c.nvmlDeviceGetProcessesUtilizationInfo(h, 0),
        "GetSupportedEventTypes": lambda: c.nvmlDeviceGetSupportedEventTypes(h),
        "GetTemperatureThreshold_SLOWDOWN": lambda: c.nvmlDeviceGetTemperatureThreshold(
            h, c.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "GetNumGpuCores": lambda: c.nvmlDeviceGetNumGpuCores(h),
        "GetGpuFabricInfoV": lambda: c.nvmlDeviceGetGpuFabricInfoV(h),
    }
    for pol in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTILIZATION",
                "RELIABILITY", "TOTAL_APP_CLOCKS", "TOTAL_BASE_CLOCKS"):
        k = getattr(c, "NVML_PERF_POLICY_" + pol)
        calls[f"GetViolationStatus_{pol}"] = lambda k=k: c.nvmlDeviceGetViolationStatus(h, k)
    for link in range(18):
        calls[f"GetNvLinkState_{link}"] = lambda link=link: c.nvmlDeviceGetNvLinkState(h, link)
    calls["GetPcieThroughput_TX"] = lambda: c.nvmlDeviceGetPcieThroughput(
        h, c.NVML_PCIE_UTIL_TX_BYTES)
    return calls


SLOW = {"GetPcieThroughput_TX", "GetPcieSpeed"}


def field_names():
    out = {}
    for k in dir(nv):
        if k.startswith("NVML_FI_DEV_") or k.startswith("NVML_FI_PWR_"):
            v = getattr(nv, k)
            if isinstance(v, int):
                out.setdefault(v, k)
    return out


def survey_fields(h, names):
    res = {}
    ids = sorted(i for i in names if 0 < i < 400)
    for scope_name, scope in (("scope0", 0), ("all", UINT_MAX)):
        # one id per call: a refusal of one must not hide the others
        for fid in ids:
            try:
                v = nv.nvmlDeviceGetFieldValues(h, [(fid, scope)])[0]
                r = {"ret": int(v.nvmlReturn), "type": int(v.valueType)}
                if v.nvmlReturn == 0:
                    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal",
                            5: "siVal", 6: "usVal"}.get(v.valueType, "ullVal")
                    r["value"] = getattr(v.value, attr)
            except nv.NVMLError as e:
                r = {"error": _err(e)}
            res.setdefault(names[fid], {"id": fid})[scope_name] = r
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpus", default="all")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    doc = {"t": time.time(), "binding": getattr(nv, "__version__", None)}
    t0 = time.perf_counter()
    nv.nvmlInit()
    doc["init_s"] = time.perf_counter() - t0
    for k, fn in (("driver", nv.nvmlSystemGetDriverVersion),
                  ("nvml", nv.nvmlSystemGetNVMLVersion),
                  ("cuda_driver", nv.nvmlSystemGetCudaDriverVersion_v2)):
        try:
            doc[k] = _plain(fn())
        except Exception as e:
            doc[k] = _err(e)
    n = nv.nvmlDeviceGetCount()
    doc["count"] = n
    want = range(n) if a.gpus == "all" else [int(x) for x in a.gpus.split(",")]
    names = field_names()
    doc["gpus"] = []
    for i in want:
        g = {"index": i}
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as e:
            g["handle_error"] = _err(e)
            doc["gpus"].append(g)
            continue
        calls = {}
        for name, fn in device_calls(h).items():
            ok, val, med = timed(fn, 3 if name in SLOW else a.reps)
            calls[name] = {"ok": ok, "value": val, "median_us": round(med * 1e6, 1)}
        g["calls"] = calls
        t1 = time.perf_counter()
        g["fields"] = survey_fields(h, names)
        g["field_survey_s"] = time.perf_counter() - t1
        doc["gpus"].append(g)
        print(f"GPU {i}: {sum(c['ok'] for c in calls.values())}/{len(calls)} calls answer, "
              f"{sum(1 for f in g['fields'].values() if f['scope0'].get('ret') == 0)}"
              f"/{len(g['fields'])} fields (scope 0), "
              f"{sum(1 for f in g['fields'].values() if f['all'].get('ret') == 0)} (all links)",
              file=sys.stderr)
        for name, c in calls.items():
            print(f"  {name:36s} {'ok ' if c['ok'] else 'NO '} {c['median_us']:>9.1f} us  "
                  f"{str(c['value'])[:70]}", file=sys.stderr)
    nv.nvmlShutdown()
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, default=repr)


if __name__ == "__main__":
    main()
