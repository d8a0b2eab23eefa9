"""The job's own efficiency, in the manner of Slurm's ``seff`` and Princeton's ``jobstats``:
CPU cores used against those allocated, peak memory against the limit, each allocated GPU's
utilisation and memory, wall time -- from the run's own accounting (``cpu.run.*``,
``memory.run.*``, ``gpu.<i>.*``), never from the node's totals (which hold other people's load).

Read straight from the run directory (only the channels it needs, segment by segment), so the
in-memory and the streamed analysis both get it, and with plain notes where a figure calls for
action ("used 0.1 of 8 cores: the code may be serial")."""
from __future__ import annotations

import re
from typing import Any

import numpy as np

#: Below this share of the allocated cores the job is called under-using them.
LOW_CPU = 0.25
#: Below this share of a memory limit (and with more than 4 GiB asked) ask for less.
LOW_MEM = 0.10
#: A GPU whose utilisation stayed below this (%) over the job is idle.
IDLE_GPU = 5.0
_GPU = re.compile(r"^gpu\.(\d+)\.(util_sm|mem_used|mem_total)$")
_GiB = float(1 << 30)


def _alloc_cores(meta: dict, quota: float | None, node: int) -> tuple[float | None, str]:
    """Cores the job may use, and where that figure comes from."""
    if quota and np.isfinite(quota) and quota > 0:
        return float(quota), "cgroup CPU quota"
    extra = (meta.get("run") or {}).get("extra") or {}
    v = extra.get("cpus_on_node")
    try:
        if v is not None and int(str(v).split("(")[0]) > 0:
            return float(int(str(v).split("(")[0])), "Slurm allocation on this node"
    except ValueError:
        pass
    return (float(node), "the whole node (no allocation known)") if node else (None, "unknown")


def job_efficiency(run_dir: str, meta: dict) -> dict[str, Any] | None:
    """The ``efficiency`` section of report.json, or None when the run has no own accounting
    (no ``cpu.run.usage``: a node-level run)."""
    from ...store import store

    names = [c.get("name") for c in meta.get("channels") or [] if isinstance(c, dict)]
    want = [n for n in names if n in ("cpu.run.usage", "cpu.run.limit_cores", "memory.run.rss",
                                      "memory.run.anon", "memory.run.usage",
                                      "memory.run.limit", "memory.MemTotal")
            or (isinstance(n, str) and _GPU.match(n))]
    if "cpu.run.usage" not in want:
        return None
    node_cores = sum(1 for n in names if isinstance(n, str) and re.match(r"^cpu\.core\d+\.idle$", n))
    ts, vs = [], []
    for p in store.segment_paths(run_dir):
        try:
            t, v = store.read_segment(p, want)
        except Exception:   # noqa: BLE001 - unreadable segments are the analysis' note
            continue
        ts.append(t)
        vs.append(v)
    if not ts:
        return None
    t = np.concatenate(ts).astype(np.float64)
    V = np.concatenate(vs, axis=0).astype(np.float64)
    order = np.argsort(t, kind="stable")
    t, V = t[order], V[order]
    col = {n: V[:, i] for i, n in enumerate(want)}
    wall = float(t[-1] - t[0]) if len(t) > 1 else 0.0
    if wall <= 0:
        return None
    out: dict[str, Any] = {"wall_s": round(wall, 1), "notes": []}

    # CPU: cores used (mean over the run, peak over 10-s windows) vs allocated
    use = col["cpu.run.usage"]
    ok = np.isfinite(use)
    mean = float((use[ok][-1] - use[ok][0]) / (t[ok][-1] - t[ok][0])) if ok.sum() > 1 else 0.0
    peak = mean
    if ok.sum() > 1:
        tt, uu = t[ok], use[ok]
        j = np.searchsorted(tt, tt + 10.0)
        good = j < len(tt)
        if good.any():
            peak = float(np.max((uu[j[good]] - uu[good]) / (tt[j[good]] - tt[good])))
    quota = np.nanmedian(col["cpu.run.limit_cores"]) if "cpu.run.limit_cores" in col and \
        np.isfinite(col["cpu.run.limit_cores"]).any() else None
    alloc, src = _alloc_cores(meta, quota, node_cores)
    cpu = {"cores_used_mean": round(max(mean, 0.0), 3), "cores_used_peak": round(max(peak, 0.0), 3),
           "cores_allocated": alloc, "allocated_from": src}
    if alloc:
        cpu["efficiency_pct"] = round(100.0 * max(mean, 0.0) / alloc, 1)
        if alloc >= 2 and mean < LOW_CPU * alloc:
            out["notes"].append(
                f"used {mean:.1f} of {alloc:g} cores ({cpu['efficiency_pct']:.0f} %): the code "
                "may be serial, or wait on I/O; ask for fewer cores or parallelise "
                "(DataLoader num_workers, threads)")
    out["cpu"] = cpu

    # memory: the peak of the run's own memory vs its limit
    mname = next((n for n in ("memory.run.anon", "memory.run.rss", "memory.run.usage")
                  if n in col and np.isfinite(col[n]).any()), None)
    if mname:
        mpeak = float(np.nanmax(col[mname]))
        mem: dict[str, Any] = {"peak_bytes": int(mpeak), "measured_as": mname}
        lim = col.get("memory.run.limit")
        lim_v = float(np.nanmin(lim)) if lim is not None and np.isfinite(lim).any() else None
        if lim_v and lim_v < 1e18:
            mem.update(limit_bytes=int(lim_v), limit_from="cgroup memory limit",
                       pct=round(100.0 * mpeak / lim_v, 1))
            if lim_v > 4 * _GiB and mpeak < LOW_MEM * lim_v:
                out["notes"].append(f"peak memory {mpeak / _GiB:.1f} GiB of {lim_v / _GiB:.0f} "
                                    f"GiB allowed ({mem['pct']:.0f} %): ask for less memory")
            elif mpeak >= 0.95 * lim_v:
                out["notes"].append(f"peak memory {mpeak / _GiB:.1f} GiB reached "
                                    f"{mem['pct']:.0f} % of the {lim_v / _GiB:.1f} GiB limit: "
                                    "the job may be killed or swap; ask for more")
        elif "memory.MemTotal" in col and np.isfinite(col["memory.MemTotal"]).any():
            tot = float(np.nanmax(col["memory.MemTotal"])) * 1024.0
            mem.update(limit_bytes=int(tot), limit_from="the node's memory (no limit set)",
                       pct=round(100.0 * mpeak / tot, 1))
        out["memory"] = mem

    # GPUs: the run's GPUs (or every GPU recorded when the run names none)
    run_gpus = (meta.get("run") or {}).get("gpus")
    idx = sorted({int(m.group(1)) for n in col if (m := _GPU.match(n))})
    if isinstance(run_gpus, list) and run_gpus:
        idx = [i for i in idx if i in set(int(g) for g in run_gpus)]
    gpus = []
    for i in idx:
        g: dict[str, Any] = {"index": i}
        u = col.get(f"gpu.{i}.util_sm")
        if u is not None and np.isfinite(u).any():
            g["util_mean_pct"] = round(float(np.nanmean(u)), 1)
            if g["util_mean_pct"] < IDLE_GPU:
                out["notes"].append(f"GPU {i} idle for the whole job (mean utilisation "
                                    f"{g['util_mean_pct']:.1f} %): the job may not use it")
        mu, mt = col.get(f"gpu.{i}.mem_used"), col.get(f"gpu.{i}.mem_total")
        if mu is not None and np.isfinite(mu).any():
            g["mem_peak_bytes"] = int(np.nanmax(mu))
            if mt is not None and np.isfinite(mt).any():
                g["mem_total_bytes"] = int(np.nanmax(mt))
        gpus.append(g)
    if gpus:
        out["gpus"] = gpus
    return out


def efficiency_lines(eff: dict | None) -> list[str]:
    """Plain-text lines of the section (text report, Slurm summary)."""
    if not eff:
        return []
    lines = []
    c = eff.get("cpu") or {}
    if c:
        alloc = c.get("cores_allocated")
        lines.append(f"CPU     {c['cores_used_mean']:.2f} cores used on average (peak "
                     f"{c['cores_used_peak']:.2f})" + (
                         f" of {alloc:g} allocated ({c.get('efficiency_pct', 0):.0f} %, "
                         f"{c['allocated_from']})" if alloc else ""))
    m = eff.get("memory") or {}
    if m:
        lines.append(f"Memory  peak {m['peak_bytes'] / _GiB:.2f} GiB" + (
            f" of {m['limit_bytes'] / _GiB:.1f} GiB ({m['pct']:.0f} %, {m['limit_from']})"
            if m.get("limit_bytes") else ""))
    for g in eff.get("gpus") or []:
        lines.append(f"GPU {g['index']}   " + ", ".join(
            x for x in (f"{g['util_mean_pct']:.0f} % utilised" if "util_mean_pct" in g else "",
                        f"peak memory {g['mem_peak_bytes'] / _GiB:.1f}"
                        + (f" of {g['mem_total_bytes'] / _GiB:.0f} GiB"
                           if g.get("mem_total_bytes") else " GiB")
                        if "mem_peak_bytes" in g else "") if x))
    lines.append(f"Wall    {eff['wall_s']:.0f} s")
    lines += [f"note: {n}" for n in eff.get("notes") or []]
    return lines
