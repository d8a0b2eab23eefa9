"""GPU findings of one node: invariants, and each GPU of the job against its siblings.

Two kinds of finding, both subsystem ``gpu`` and both naming the GPU (``anomaly["gpu"]``:
NVML index, UUID, PCI bus id, model, and the rank that ran on it):

* **Invariants** (:func:`invariant_findings`): conditions that are wrong however long they last,
  so the run's own normal cannot hide them -- a lost GPU (``nvml_status`` 1, "fell off the
  bus"), XID events, uncorrected ECC errors, a pending or failed row remap (or a pending page
  retirement), NVLink CRC/replay/recovery errors, a busy GPU whose PCIe link runs below its
  maximum generation or width (or keeps replaying), clocks held down by a thermal, board or
  reliability limit or by hardware slowdown for a good part of the busy time, and processes
  that are not the job's on the job's GPU.
* **GPU peers** (:func:`peer_findings`): the GPUs of one job on one node run the same code on
  the same schedule, so at any moment they should look alike.  Each GPU is compared with its
  siblings over the same windows by :func:`reveal_plugins.detect.peers.nodes.compare` (the node-peer
  machinery: residual against the median of the others, the GPU's own change must explain it,
  symptoms and causes vote, activity does not), with every ``gpu.<i>.<metric>`` renamed to one
  common name.  A GPU that is throttled, power-capped, link-downtrained or shares its SMs with
  a foreign process is named; a change every GPU shows at once (an eval phase, a checkpoint)
  leaves no residual and is the job's own phase (:func:`shared_phases`).  Two GPUs can only
  say which of the two *changed* (each is the other's only reference); a difference present
  from the first window cannot be placed on either -- the invariants cover the permanent ones.

:func:`findings` is what the pipeline calls (batch and streamed paths): invariants, then the
peer comparison, merged with the detector's own anomalies (a peer finding about the same GPU
and time as a detector anomaly enriches that anomaly instead of repeating it).
"""
from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np

from . import attribution as attr
from ..config import DetectConfig

GPU_RE = re.compile(r"^gpu\.(\d+)\.(.+)$")

#: Metrics the sibling GPUs are compared on (all others -- maxima, limits, totals, identities
#: -- describe the GPU, not what it does).
PEER_METRICS = re.compile(
    r"^(util_sm|util_mem|clock_sm|clock_mem|sm_clock_pct_of_max|temp|memory_temp|power|"
    r"power_pct_of_limit|throttle_(power_cap|hw_slowdown|sw_thermal|hw_thermal|hw_power_brake)|"
    r"capped_(power|thermal|board|reliability)_s|pcie_(tx|rx|replay)|pcie_link_(gen|width)|"
    r"nvlink_(tx|rx)|nvlink_\w+_errors|foreign_(procs|mem|sm)|ecc_uncorrected|xid_events)$")
#: Metrics the invariants read.
INVARIANT_METRICS = re.compile(
    r"^(util_sm|pcie_link_(gen|width)(_max)?|pcie_replay|throttle_\w+|capped_\w+_s|clock_sm|"
    r"clock_sm_max|xid_events|xid_last|ecc_uncorrected|remap_(pending|failure)|"
    r"retired_pages_pending|nvml_status|nvlink_\w+_errors|foreign_(procs|mem|sm))$")
#: Columns a streamed analysis keeps for every window (longrun gathers them).
GATHER = re.compile(r"^gpu\.\d+\.(" + PEER_METRICS.pattern[2:-2] + "|" +
                    INVARIANT_METRICS.pattern[2:-2] + ")$")

#: Peer settings for GPUs (:data:`reveal_plugins.detect.peers.nodes.DEFAULTS` otherwise): up to 3
#: of 8 GPUs may stand out at once (the median of the other 5 is still a healthy reference).
PEER_CONFIG = {"max_share": 0.4}

#: util_sm at or above this is "busy" (link width and throttling only matter under load).
BUSY_UTIL = 30.0
#: Share of the busy time a thermal/board/reliability cap or HW slowdown must hold the clocks
#: down to be a finding by itself (short spikes are normal; 20 % of a run is not).
CAP_SHARE = 0.2
#: PCIe replays over the run that make a finding without a downtrained link.
REPLAYS_MIN = 10
#: Seconds of foreign processes on the job's GPU that make a finding.
FOREIGN_MIN_S = 5.0

#: Clock-limit reasons: violation counter (seconds capped, a rate = share of time) and the
#: clock-event flag that says the same; the words a person reads.
REASONS = {"power": ("capped_power_s", "throttle_power_cap", "power cap"),
           "thermal": ("capped_thermal_s", "throttle_sw_thermal", "thermal limit"),
           "hw_thermal": (None, "throttle_hw_thermal", "hardware thermal slowdown"),
           "hw_slowdown": (None, "throttle_hw_slowdown", "hardware slowdown"),
           "power_brake": (None, "throttle_hw_power_brake", "hardware power brake"),
           "board": ("capped_board_s", None, "board limit"),
           "reliability": ("capped_reliability_s", None, "reliability (voltage) limit")}
#: Reasons that are a finding by themselves (the power cap is what a GPU at full load meets
#: every day: it is named only when one GPU meets it more than its siblings).
INVARIANT_REASONS = ("thermal", "hw_thermal", "hw_slowdown", "power_brake", "board",
                     "reliability")


def gpu_indices(names: list[str]) -> list[int]:
    return sorted({int(m.group(1)) for n in names if (m := GPU_RE.match(n))})


# -- identities -------------------------------------------------------------------------------

def identities(meta: dict, events: list[dict], indices: list[int]) -> dict[int, dict]:
    """NVML index -> ``{"index", "uuid", "pci_bus_id", "minor", "name", "rank"[, "ranks"]}``
    from meta.json's ``gpus`` (identities recorded at the start) and the ``rank`` events of
    reveal-torchrun (which rank NVML saw on which GPU)."""
    ids: dict[int, dict] = {}
    run = meta.get("run") if isinstance(meta.get("run"), dict) else {}
    for src in (meta.get("gpus"), run.get("gpus")):
        for g in src if isinstance(src, list) else []:
            if isinstance(g, dict) and isinstance(g.get("index"), int):
                d = ids.setdefault(int(g["index"]), {"index": int(g["index"])})
                for k in ("uuid", "pci_bus_id", "name"):
                    if isinstance(g.get(k), str) and g[k] and k not in d:
                        d[k] = g[k]
                if isinstance(g.get("minor"), int):
                    d.setdefault("minor", g["minor"])
    ranks: dict[int, list[int]] = {}
    for e in events:
        if e.get("event") != "rank" or not isinstance(e.get("rank"), int):
            continue
        gs = e.get("gpus") if isinstance(e.get("gpus"), list) else (
            [e["gpu"]] if isinstance(e.get("gpu"), int) else [])
        for g in gs:
            if isinstance(g, int):
                lst = ranks.setdefault(g, [])
                if e["rank"] not in lst:
                    lst.append(int(e["rank"]))
        if isinstance(e.get("gpu"), int) and isinstance(e.get("gpu_uuid"), str):
            ids.setdefault(e["gpu"], {"index": e["gpu"]}).setdefault("uuid", e["gpu_uuid"])
    for i in indices:
        ids.setdefault(i, {"index": i})
    for i, d in ids.items():
        r = sorted(ranks.get(i, []))
        d["rank"] = r[0] if len(r) == 1 else None
        if len(r) > 1:
            d["ranks"] = r
    return ids


def label(ident: dict | None, index: int | None = None, full: bool = False) -> str:
    """``GPU 3 (rank 3)``, or with ``full`` ``GPU 3 (rank 3, GPU-8f2c…, 00000000:41:00.0)``:
    what a person finds the GPU by (the NVML index is what ``nvidia-smi -i`` takes)."""
    ident = ident or {}
    i = ident.get("index", index)
    parts = []
    if ident.get("rank") is not None:
        parts.append(f"rank {ident['rank']}")
    elif ident.get("ranks"):
        parts.append("ranks " + ",".join(str(r) for r in ident["ranks"]))
    if full:
        parts += [str(ident[k]) for k in ("uuid", "pci_bus_id") if ident.get(k)]
    return f"GPU {i}" + (f" ({', '.join(parts)})" if parts else "")


def _identity(ids: dict[int, dict], i: int) -> dict:
    d = dict(ids.get(i) or {"index": i})
    d.setdefault("rank", None)
    return d


# -- per-GPU facts ----------------------------------------------------------------------------

def _col(X, j: int) -> np.ndarray:
    return np.asarray(X[:, j], dtype=np.float64)


def _mean(v: np.ndarray) -> float | None:
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else None


def facts(t: np.ndarray, X, names: list[str], i: int, rows: np.ndarray,
          dt: float) -> dict[str, Any]:
    """What GPU ``i`` did over ``rows`` (sample or window indices ``dt`` seconds apart): the
    share of the time each clock limit held it down (violation counters where the driver has
    them, else the clock-event flags), clocks against their maximum, the PCIe link against its
    maximum, error counts, foreign processes, lost."""
    idx = {n: j for j, n in enumerate(names)}
    p = f"gpu.{i}."
    rows = np.asarray(rows)
    out: dict[str, Any] = {"index": i, "seconds": round(float(len(rows) * dt), 1)}
    if not len(rows):
        return out

    def v(metric: str) -> np.ndarray | None:
        return _col(X, idx[p + metric])[rows] if p + metric in idx else None

    capped, flags = {}, {}
    for k, (counter, flag, _) in REASONS.items():
        c = v(counter) if counter else None
        if c is not None and np.isfinite(c).any():
            capped[k] = round(float(np.clip(np.nanmean(c), 0.0, 1.0)), 3)
        f = v(flag) if flag else None
        if f is not None and np.isfinite(f).any():
            flags[k] = round(float(np.nanmean(np.nan_to_num(f) > 0.5)), 3)
    if capped:
        out["capped"] = capped          # share of the time (violation counters)
    if flags:
        out["throttle"] = flags         # share of the samples (clock-event flags)
    for m in ("clock_sm", "clock_sm_max", "util_sm", "power", "temp"):
        x = v(m)
        if x is not None and _mean(x) is not None:
            out[m] = round(_mean(x), 1)
    link = {}
    for m in ("pcie_link_gen", "pcie_link_width", "pcie_link_gen_max", "pcie_link_width_max"):
        x = v(m)
        if x is not None and np.isfinite(x).any():
            link[m[len("pcie_link_"):]] = float(np.nanmedian(x))
    if link:
        out["link"] = link
    counts = {}
    for m in ("pcie_replay", "xid_events", "ecc_uncorrected", "nvlink_crc_flit_errors",
              "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors"):
        x = v(m)
        if x is not None and np.isfinite(x).any():
            counts[m] = round(float(np.nansum(np.clip(x, 0, None)) * dt), 1)
    if counts:
        out["counts"] = counts
    x = v("xid_last")
    if x is not None and np.isfinite(x).any() and np.nanmax(x) > 0:
        out["xid_last"] = int(np.nanmax(x))
    for m in ("remap_pending", "remap_failure", "retired_pages_pending"):
        x = v(m)
        if x is not None and np.isfinite(x).any():
            out[m] = int(np.nanmax(x) > 0.5)
    procs = v("foreign_procs")
    if procs is not None and np.isfinite(procs).any():
        on = np.nan_to_num(procs) > 0.5
        fo: dict[str, Any] = {"procs": int(round(float(np.nanmax(procs)))),
                              "seconds": round(float(on.sum() * dt), 1)}
        for m, key in (("foreign_mem", "mem"), ("foreign_sm", "sm")):
            x = v(m)
            if x is not None and on.any() and _mean(x[on]) is not None:
                fo[key] = round(_mean(x[on]), 1)
        out["foreign"] = fo
    st = v("nvml_status")
    if st is not None and (np.round(np.nan_to_num(st)) == 1).any():
        lost = np.nonzero(np.round(np.nan_to_num(st)) == 1)[0]
        out["lost"] = True
        out["lost_at"] = float(t[rows[lost[0]]])
    return out


# -- invariants -------------------------------------------------------------------------------

def invariant_findings(t: np.ndarray, X, names: list[str], units: list[str],
                       interval_s: float) -> list[dict]:
    """Conditions wrong however long they last (module docstring).  Returns skeletons:
    ``start``, ``end``, ``score``, ``channels`` ({column: (reference, observed)}), ``why``,
    plus ``gpu`` (index), ``kind`` and ``facts`` (:func:`facts` over the finding's rows)."""
    idx = {n: i for i, n in enumerate(names)}
    out: list[dict] = []
    n = len(t)
    if n == 0:
        return out
    dt = float(np.median(np.diff(t))) if n > 1 else float(interval_s or 1.0)
    dt = dt if dt > 0 else float(interval_s or 1.0)
    min_rows = max(3, int(10.0 / max(dt, 1e-3)))
    for g in gpu_indices(names):
        p = f"gpu.{g}."

        def has(m: str) -> bool:
            return p + m in idx

        def col(m: str) -> np.ndarray:
            return _col(X, idx[p + m])

        def add(kind: str, rows: np.ndarray, score: float, chans: dict, why: str) -> None:
            f = facts(t, X, names, g, rows, dt)
            out.append({"start": float(t[rows[0]]), "end": float(t[rows[-1]]) + dt,
                        "score": float(score), "channels": chans, "why": why, "gpu": g,
                        "kind": kind, "facts": f})

        # lost: NVML answers GPU_IS_LOST
        if has("nvml_status"):
            st = np.round(np.nan_to_num(col("nvml_status")))
            lost = np.nonzero(st == 1)[0]
            if len(lost):
                add("lost", np.arange(lost[0], n), 30.0,
                    {idx[p + "nvml_status"]: (0.0, 1.0)},
                    f"GPU {g} was lost (fell off the bus) from "
                    f"{float(t[lost[0]]) - float(t[0]):.0f} s into the run")
        # counters where any increase is a fault
        for m, score, what in (("xid_events", 20.0, "XID events"),
                               ("ecc_uncorrected", 20.0, "uncorrected ECC errors"),
                               ("nvlink_crc_flit_errors", 15.0, "NVLink flit CRC errors"),
                               ("nvlink_crc_data_errors", 15.0, "NVLink data CRC errors"),
                               ("nvlink_replay_errors", 15.0, "NVLink replays"),
                               ("nvlink_recovery_errors", 15.0, "NVLink link recoveries")):
            if not has(m):
                continue
            v = col(m)
            hit = np.nonzero(np.nan_to_num(v) > 0)[0]
            if len(hit):
                chans = {idx[p + m]: (0.0, float(np.nanmax(v)))}
                if m == "xid_events" and has("xid_last"):
                    xl = col("xid_last")[hit[0]:hit[-1] + 1]
                    if np.isfinite(xl).any():
                        chans[idx[p + "xid_last"]] = (0.0, float(np.nanmax(xl)))
                kind = "nvlink" if m.startswith("nvlink") else m.split("_")[0]
                add(kind, np.arange(hit[0], hit[-1] + 1), score, chans, f"{m} increased")
        # flags that say the GPU's memory needs a reset or a replacement
        for m, score in (("remap_failure", 25.0), ("remap_pending", 20.0),
                         ("retired_pages_pending", 20.0)):
            if not has(m):
                continue
            v = col(m)
            hit = np.nonzero(np.nan_to_num(v) > 0.5)[0]
            if len(hit):
                add("remap", np.arange(hit[0], hit[-1] + 1), score,
                    {idx[p + m]: (0.0, 1.0)}, f"{m} set")
        # foreign processes on the job's GPU
        if has("foreign_procs"):
            v = np.nan_to_num(col("foreign_procs"))
            on = np.nonzero(v > 0.5)[0]
            if len(on) * dt >= FOREIGN_MIN_S:
                rows = np.arange(on[0], on[-1] + 1)
                chans = {idx[p + "foreign_procs"]: (0.0, float(np.nanmax(v)))}
                for m in ("foreign_mem", "foreign_sm"):
                    if has(m):
                        x = col(m)[on]
                        if np.isfinite(x).any():
                            chans[idx[p + m]] = (0.0, float(np.nanmean(x)))
                add("foreign", rows, 10.0 + min(10.0, len(on) * dt / 10.0), chans,
                    f"{int(np.nanmax(v))} process(es) not of this job on GPU {g} for "
                    f"{len(on) * dt:.0f} s")
        # under load: the PCIe link, clock limits
        util = col("util_sm") if has("util_sm") else None
        busy = (np.nan_to_num(util, nan=-1.0) >= BUSY_UTIL) if util is not None else \
            np.ones(n, bool)
        if busy.sum() < min_rows:
            continue
        rows = np.nonzero(busy)[0]
        link_ch, link_why = {}, []
        for what in ("gen", "width"):
            a, b = f"pcie_link_{what}", f"pcie_link_{what}_max"
            if has(a) and has(b):
                cur, mx = np.nanmedian(col(a)[rows]), np.nanmedian(col(b)[rows])
                if np.isfinite(cur) and np.isfinite(mx) and cur < mx:
                    link_ch[idx[p + a]] = (float(mx), float(cur))
                    link_ch[idx[p + b]] = (float(mx), float(mx))
                    link_why.append(f"PCIe link {what} {cur:g} < max {mx:g}")
        if has("pcie_replay"):
            rep = np.clip(np.nan_to_num(col("pcie_replay")), 0, None)
            total = float(rep.sum() * dt)
            if total >= REPLAYS_MIN or (link_ch and total > 0):
                link_ch[idx[p + "pcie_replay"]] = (0.0, float(np.nanmax(rep)))
                link_why.append(f"{total:.0f} PCIe replays")
        if link_ch:
            add("link", rows, 10.0, link_ch, "; ".join(link_why) + " while busy")
        held: dict[str, float] = {}
        cap_ch: dict[int, tuple[float, float]] = {}
        for k in INVARIANT_REASONS:
            counter, flag, _ = REASONS[k]
            if counter and has(counter):
                c = np.clip(col(counter)[rows], 0.0, 1.0)
                if np.isfinite(c).any():
                    frac = float(np.nanmean(c))
                    if frac >= CAP_SHARE:
                        held[k] = frac
                        cap_ch[idx[p + counter]] = (0.0, frac)
                    continue      # the counter is the truth where the driver has it
            if flag and has(flag):
                f = col(flag)[rows]
                if np.isfinite(f).any():
                    frac = float(np.nanmean(np.nan_to_num(f) > 0.5))
                    if frac >= CAP_SHARE:
                        held[k] = max(held.get(k, 0.0), frac)
                        cap_ch[idx[p + flag]] = (0.0, frac)
        if held:
            if has("clock_sm") and has("clock_sm_max"):
                cap_ch[idx[p + "clock_sm"]] = (float(np.nanmedian(col("clock_sm_max")[rows])),
                                               float(np.nanmean(col("clock_sm")[rows])))
            add("throttle", rows, 10.0 * max(held.values()), cap_ch,
                "clocks held down: " + ", ".join(
                    f"{REASONS[k][2]} {100 * f:.0f}% of the busy time"
                    for k, f in sorted(held.items(), key=lambda kv: -kv[1])))
    return out


# -- peers ------------------------------------------------------------------------------------

def peer_findings(t: np.ndarray, X, names: list[str], units: list[str], starts: list[float],
                  ends: list[float], events: list[dict], ids: dict[int, dict],
                  result: dict, config: dict | None = None) -> list[dict]:
    """Each GPU against its siblings; returns peer suspects (the GPU's own channel names
    back in the evidence, ``gpu`` the index) and fills ``result`` (the report's
    ``analysis["gpu_peers"]``)."""
    from ..peers.nodes import NodeSeries, compare

    gpus = gpu_indices(names)
    idx = {n: j for j, n in enumerate(names)}
    result.update({"gpus": len(gpus), "suspects": [], "shared": [], "notes": []})
    if len(gpus) < 2:
        result["notes"].append("one GPU: no sibling to compare it with" if gpus else
                               "no GPU channels")
        return []
    metrics = None
    for g in gpus:
        have = {m.group(2) for n in names if (m := GPU_RE.match(n)) and int(m.group(1)) == g
                and PEER_METRICS.match(m.group(2))}
        metrics = have if metrics is None else metrics & have
    metrics = sorted(metrics or [])
    if not metrics:
        result["notes"].append("the GPUs share no comparable channel")
        return []
    if len(gpus) == 2:
        result["notes"].append(
            "2 GPUs: each is compared with the other only, so a GPU is named when its own "
            "signals changed while the other's did not; a difference present from the first "
            "window cannot be placed on either (the invariants cover link width, clock limits, "
            "errors and foreign processes), and with 3 or more the median of the siblings "
            "is the reference")
    series = []
    for k, g in enumerate(gpus):
        cols = [idx[f"gpu.{g}.{m}"] for m in metrics]
        Xg = np.column_stack([_col(X, j) for j in cols]).astype(np.float32)
        series.append(NodeSeries(f"gpu{g}", np.asarray(t, np.float64), Xg,
                                 [f"gpu.0.{m}" for m in metrics], [units[j] for j in cols],
                                 events=events if k == 0 else [],
                                 rank=_identity(ids, g).get("rank"),
                                 starts=list(starts), ends=list(ends)))
    cfg = dict(PEER_CONFIG)
    cfg.update(config or {})
    res = compare(series, cfg)
    result["notes"] += res.notes
    result["analysis"] = res.analysis
    out = []
    for sp in res.suspects:
        g = int(sp["node"][3:])
        for e in sp["evidence"]:
            e["channel"] = f"gpu.{g}." + e["channel"].split(".", 2)[2]
        sp["gpu"] = g
        sp["node"] = None
        out.append(sp)
        result["suspects"].append({"gpu": g, "rank": _identity(ids, g).get("rank"),
                                   "start": sp["start"], "end": sp["end"],
                                   "score": sp["score"],
                                   "channels": [e["channel"] for e in sp["evidence"][:3]]})
    result["compared"] = [_identity(ids, g) for g in gpus]
    return out


def kind_of(channels: list[str]) -> str:
    """What a GPU finding is about, from its evidence (strongest first)."""
    for ch in channels:
        m = GPU_RE.match(ch)
        leaf = m.group(2) if m else ch
        if leaf.startswith("foreign_"):
            return "foreign"
        if leaf.startswith("pcie_link") or leaf == "pcie_replay":
            return "link"
        if leaf.startswith(("throttle_", "capped_", "clock_sm", "sm_clock")) or leaf in (
                "temp", "memory_temp", "power_pct_of_limit"):
            return "throttle"
        if leaf.startswith("nvlink_") and leaf.endswith("errors"):
            return "nvlink"
        if leaf in ("xid_events", "ecc_uncorrected"):
            return leaf.split("_")[0]
    return "slower"


_KIND_TEXT = {"foreign": "shares it with processes that are not the job's",
              "link": "its PCIe link runs slower than its siblings'",
              "throttle": "its clocks are held below its siblings'",
              "nvlink": "NVLink errors", "xid": "XID events", "ecc": "ECC errors",
              "slower": "it behaves unlike its siblings"}


# -- the pipeline's entry point ---------------------------------------------------------------

def _gpus_of(an: dict) -> set[int]:
    out = set()
    for e in an.get("evidence") or []:
        m = GPU_RE.match(str(e.get("channel", "")))
        if m:
            out.add(int(m.group(1)))
    return out


def _overlap(a: dict, s0: float, s1: float) -> float:
    o = min(float(a["end"]), s1) - max(float(a["start"]), s0)
    return max(0.0, o) / max(min(float(a["end"]) - float(a["start"]), s1 - s0), 1e-9)


def findings(P, W, E, cfg: DetectConfig, meta: dict, events: list[dict], anomalies: list[dict],
             out) -> list[dict]:
    """The detector's ``anomalies`` with the GPU invariants and the GPU peer findings added
    (or merged into them), and the anomalies of a phase every GPU shared moved to
    ``out.observations``.  ``out`` is the :class:`pipeline.Detection` (notes, analysis)."""
    from ..batch.boundaries import step_of
    from .hinting import hints_for
    from ..batch.report import host_of

    names, units = P.names, P.units
    gpus = gpu_indices(names)
    if not gpus:
        return anomalies
    t = np.asarray(P.t, np.float64)
    dt = float(np.median(np.diff(t))) if len(t) > 1 else float(P.interval_s or 1.0)
    ids = identities(meta, events, gpus)
    idx = {n: j for j, n in enumerate(names)}
    node = host_of(meta)
    center = np.asarray(E.center, np.float64) if E is not None else None

    def rows_of(s0: float, s1: float) -> np.ndarray:
        return np.nonzero((t >= s0) & (t <= s1))[0]

    def context(an: dict, g: int, f: dict, chans: dict) -> dict:
        return {"channels": chans, "meta": meta, "impact": an.get("impact"),
                "facts": meta.get("facts") or {}, "gpu": {**_identity(ids, g), **f,
                                                          "node": node}}

    def gpu_channels(g: int, rows: np.ndarray, ref: dict[str, float] | None = None) -> dict:
        """Every channel of GPU ``g`` over ``rows``: observed mean, reference (``ref``, else
        the run's normal level), deviation in floored units."""
        from ..batch.features import unit_floor
        ch = {}
        for n, j in idx.items():
            if not n.startswith(f"gpu.{g}.") or not GATHER.match(n):
                continue      # (a streamed analysis keeps only these columns)
            obs = _mean(_col(P.X, j)[rows]) if len(rows) else None
            base = (ref or {}).get(n)
            if base is None and center is not None and j < len(center):
                base = float(center[j]) if np.isfinite(center[j]) else None
            dev = 0.0
            if obs is not None and base is not None:
                dev = (obs - base) / max(unit_floor(n, units[j]), 1e-9)
            ch[n] = {"baseline": attr.num(base) if base is not None else None,
                     "observed": attr.num(obs) if obs is not None else None,
                     "deviation": round(float(np.clip(dev, -50, 50)), 2), "unit": units[j]}
        return ch

    new: list[dict] = []
    # invariants
    for inv in invariant_findings(t, P.X, names, units, dt):
        g = inv["gpu"]
        ev = []
        for j, (base, val) in inv["channels"].items():
            from ..batch.features import unit_floor
            ev.append({"channel": names[j], "deviation": round(float(np.clip(
                (val - base) / max(unit_floor(names[j], units[j]), 1e-9), -50, 50)), 2),
                "baseline": attr.num(base), "observed": attr.num(val), "unit": units[j]})
        ident = _identity(ids, g)
        an = {"id": "", "start": inv["start"], "end": inv["end"], "node": node,
              "step_id": step_of(meta, events, inv["start"]), "subsystem": "gpu",
              "score": round(float(inv["score"]), 2), "evidence": ev, "hints": [],
              "families": ["symptoms"], "invariant": inv["why"], "gpu": ident,
              "kind": inv["kind"], "title": f"{label(ident)}: {inv['why']}"}
        chans = gpu_channels(g, rows_of(inv["start"], inv["end"]))
        for e in ev:
            chans[e["channel"]] = {k: e[k] for k in ("baseline", "observed", "deviation",
                                                      "unit")}
        an["hints"] = hints_for(an, context(an, g, inv["facts"], chans))
        new.append(an)
    # peers
    result: dict = {}
    sus = peer_findings(t, P.X, names, units, W.starts, W.ends, events, ids, result,
                        {"warmup_s": cfg.warmup_s,
                         "cooldown_s": cfg.cooldown_s})
    for sp in sus:
        g = sp["gpu"]
        ident = _identity(ids, g)
        rows = rows_of(sp["start"], sp["end"])
        kind = kind_of([e["channel"] for e in sp["evidence"]])
        peers_info = {"compared": sp.get("peers_compared"), "score": sp["score"],
                      "windows": sp.get("windows"), "kind": kind}
        same = [a for a in new if a["gpu"]["index"] == g and a.get("kind") == kind
                and _overlap(a, sp["start"], sp["end"]) >= 0.5]
        if same:        # an invariant says it already: it also stood out from its siblings
            for a in same:
                a["peers"] = peers_info
            continue
        ref = {e["channel"]: e["peers"] for e in sp["evidence"] if e.get("peers") is not None}
        chans = gpu_channels(g, rows, ref)
        for e in sp["evidence"]:
            if e["channel"] in chans:
                chans[e["channel"]]["deviation"] = e["deviation"]
        ev = [{k: e[k] for k in ("channel", "deviation", "observed", "peers", "unit", "symptom")
               if k in e} | {"baseline": e.get("peers"), "family": "peers"}
              for e in sp["evidence"]]
        n_sib = sp.get("peers_compared") or (len(gpus) - 1)
        an = {"id": "", "start": sp["start"], "end": sp["end"], "node": node,
              "step_id": step_of(meta, events, sp["start"]), "subsystem": "gpu",
              "score": sp["score"], "evidence": ev, "hints": [], "families": ["peers"],
              "gpu": ident, "peers": peers_info, "kind": kind,
              "title": f"{label(ident)} stood out from its {n_sib} sibling GPU"
                       f"{'s' if n_sib != 1 else ''}: {_KIND_TEXT[kind]}",
              "windows": sp.get("windows")}
        if sp.get("impact"):
            an["impact"] = sp["impact"]
        an["hints"] = hints_for(an, context(an, g, facts(t, P.X, names, g, rows, dt), chans))
        new.append(an)
    kept = _judge_detector(anomalies, new, P, W, E, cfg, gpus, ids, out, result)
    out.analysis["gpu_peers"] = result
    for n in result.get("notes") or []:
        if n.startswith("2 GPUs"):
            out.notes.append(n)
    return kept + new


#: Symptoms that are the job's own when every GPU shows them at once (it stopped feeding the
#: GPUs: an eval loop, a checkpoint, a barrier).  Throttling, heat, errors, a slower link on
#: every GPU at once are a node's problem (cooling, power), never a phase.
_PHASE = re.compile(r"^(util_sm|util_mem|power|power_pct_of_limit|pcie_(tx|rx)|nvlink_(tx|rx)|"
                    r"sm_clock_pct_of_max|clock_sm)$")


def _judge_detector(anomalies: list[dict], gpu_found: list[dict], P, W, E, cfg: DetectConfig,
                    gpus: list[int], ids: dict[int, dict], out, result: dict) -> list[dict]:
    """The detector's anomalies whose symptoms are GPU signals only, judged against the GPU
    findings.  What is left once the GPUs named on their own (a GPU finding at the same time)
    are set aside: nothing -- an observation pointing at those findings; activity that every
    other GPU showed alike, in one direction (utilisation, power, traffic) -- the job's own
    phase, an observation and a ``result["shared"]`` episode.  The rest is returned (a
    detector anomaly about one GPU gets its identity)."""
    kept = []
    win = W.win
    mid = np.asarray(win.mid, np.float64)
    center = np.asarray(E.center, np.float64)
    scale = np.asarray(E.scale, np.float64)
    for a in anomalies:
        if a.get("subsystem") != "gpu" or set(a.get("families") or []) - {"symptoms", "impact"}:
            kept.append(a)
            continue
        rows = np.nonzero((mid >= a["start"]) & (mid <= a["end"]) & W.valid)[0]
        if not len(rows):
            kept.append(a)
            continue
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            obs = np.nanmean(np.asarray(W.means[rows], np.float64), axis=0)
        dev = attr.deviations(obs, center, scale)
        dev[W.per_core] = 0.0
        hits = attr.symptom_hits(dev, obs, center, E.symptoms, cfg.min_deviation)
        hit_names = [P.names[j] for j in np.nonzero(hits)[0]]
        if not hit_names or any(not GPU_RE.match(n) for n in hit_names):
            kept.append(a)       # a CPU/memory/network symptom too: the detector's finding
            continue
        moved = sorted({int(GPU_RE.match(n).group(1)) for n in hit_names})
        named = sorted({f["gpu"]["index"] for f in gpu_found if f["gpu"]["index"] in moved
                        and _overlap(f, a["start"], a["end"]) > 0})
        rest = [n for n in hit_names if int(GPU_RE.match(n).group(1)) not in named]
        others = [g for g in gpus if g not in named]
        metric = None
        if rest and len(others) >= 2 and all(_PHASE.match(GPU_RE.match(n).group(2))
                                             for n in rest) and \
                {int(GPU_RE.match(n).group(1)) for n in rest} == set(others):
            # what is left moved on every other GPU: alike, in one direction?
            top = max(rest, key=lambda n: abs(dev[P.names.index(n)]))
            metric = GPU_RE.match(top).group(2)
            cols = [P.names.index(f"gpu.{g}.{metric}") if f"gpu.{g}.{metric}" in P.names
                    else None for g in others]
            mv = np.array([obs[j] - center[j] if j is not None else np.nan for j in cols])
            big = np.nanmax(np.abs(mv)) if np.isfinite(mv).any() else 0.0
            if not (np.isfinite(mv).all() and big > 0 and (np.sign(mv) == np.sign(
                    mv[np.argmax(np.abs(mv))])).all() and np.min(np.abs(mv)) >= 0.5 * big):
                metric = None
        if metric:
            why = (f"every GPU ({len(others)} of {len(gpus)}"
                   + (f", besides {', '.join(f'GPU {g}' for g in named)} named on "
                      "their own" if named else "")
                   + f") moved alike at once ({metric}): the job's own phase (evaluation, "
                   "checkpoint, a barrier), not one GPU")
            out.observations.append(as_observation(a, why, "gpus_alike"))
            result.setdefault("shared", []).append({
                "start": a["start"], "end": a["end"], "metric": metric, "gpus": list(gpus),
                "text": why})
            continue
        if named and not rest:
            why = ("explained by the GPU finding(s) on " + ", ".join(
                f"GPU {g}" for g in named) + ", reported on their own with the GPU named")
            out.observations.append(as_observation(a, why, "gpu_named"))
            continue
        if len(moved) == 1:
            a.setdefault("gpu", _identity(ids, moved[0]))
        kept.append(a)
    return kept


def as_observation(a: dict, why: str, reason: str) -> dict:
    """Anomaly ``a`` as an observation that says ``why`` it is none (``reason``: its code)."""
    return {"start": a["start"], "end": a["end"], "subsystem": a.get("subsystem", "gpu"),
            "score": a.get("score", 0.0), "evidence": (a.get("evidence") or [])[:5],
            "why_not_anomaly": why, "reason": reason}
