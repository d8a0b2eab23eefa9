"""Attribution: which channels moved during an event, by how much, and which subsystem it is.

Deviation of a channel = (observed mean over the event - reference level) / reference spread,
where the reference is the run's own normal windows (or a baseline) and the spread is floored
at a practical minimum (:func:`reveal_plugins.detect.batch.features.unit_floor`).

Subsystem choice: every subsystem scores the mean of log(1+|deviation|) of its two strongest
channels.  CPU time is the common carrier of almost any disturbance (a process that thrashes a
disk or allocates memory also burns CPU), so CPU must win clearly to be chosen: its score is
discounted by ``CPU_CARRIER``.
"""
from __future__ import annotations

import re

import numpy as np

from ..batch.features import robust_center_scale

CPU_CARRIER = 0.7
#: Discount for subsystems whose channels rarely cause a slowdown by themselves.
DISCOUNT = {"cpu": CPU_CARRIER, "system": 0.6}


#: Symptoms: channels whose move in the given direction means the job is being held back
#: (pressure, stalls, loss, throttling), as opposed to mere activity (more bytes moved, more
#: pages written).  An event needs at least one symptom to be reported as an anomaly; the
#: others become observations.  (regex, direction +1 up / -1 down, minimum absolute change in
#: the channel's prepared unit, or -r for "down to at most (1-r) of the reference").
SYMPTOMS: list[tuple[str, int, float]] = [
    (r"^(cpu|memory|storage)\.psi\..*_total$", +1, 100_000.0),    # +10 % of the time stalled
    # (not the avg10/60/300 gauges: exponential averages of the same stall time that lag
    # it by tens of seconds, so an episode would seem to last long after it ended)
    (r"^cpu\.procs_running$", +1, 1.5), (r"^system\.nr_running$", +1, 1.5),
    (r"^cpu\.all\.steal_pct$", +1, 5.0), (r"^cpu\.all\.iowait_pct$", +1, 5.0),
    (r"^cpu\..*freq", -1, -0.1),
    # (the job's own CPU share falling is no symptom: its own phases do that; when something
    # holds it back, that something shows -- foreign load, pressure, iowait, a slower link)
    (r"^cpu\.run\.throttled_time$", +1, 0.05),
    (r"^cpu\.run\.nr_throttled$", +1, 1.0),
    (r"^storage\.procs_blocked$", +1, 1.0),
    (r"^storage\.[^.]+\.(weighted_io_ms|read_ms|write_ms|flush_ms)$", +1, 500.0),
    (r"^storage\.[^.]+\.in_flight$", +1, 1.0),
    (r"^memory\.(run\.)?MemAvailable$", -1, 1024 * 1024.0),        # 1 GiB (kB)
    (r"^memory\.(run\.)?used_pct$", +1, 4.0),
    (r"^memory\.run\.(usage|anon|rss)$", +1, 512 * 1048576.0),
    (r"^memory\.vm\.(pgmajfault|pswpin|pswpout)$", +1, 20.0),
    (r"^memory\.vm\.(allocstall|pgscan_direct|pgsteal_direct)", +1, 1.0),
    (r"^memory\.run\.(failcnt|oom|oom_kill|high|major_faults)$", +1, 1.0),
    (r"^network\.(tcp|tcpext)\.(RetransSegs|TCPLostRetransmit|TCPTimeouts|TCPSynRetrans|"
     r"TCPFastRetrans|TCPSlowStartRetrans|TCPLossProbes)$", +1, 5.0),
    (r"^network\.(?!lo\.)[^.]+\.(rx|tx)_(errs|drop|fifo|frame|carrier)$", +1, 1.0),
    # a qdisc (shaper, emulator) holding packets back: a standing queue, refusals, rate limits
    (r"^network\.[^.]+\.qdisc_(drops|overlimits)$", +1, 10.0),
    (r"^network\.[^.]+\.qdisc_backlog$", +1, 16384.0),
    (r"^network\.[^.]+\.qdisc_qlen$", +1, 10.0),
    (r"^network\.[^.]+\.(rx|tx)_bytes$", -1, -0.5),      # halved (and >= 1 MiB/s, below)
    (r"^network\.[^.]+\.(rx|tx)_packets$", -1, -0.5),    # (and >= 500 packets/s)
    (r"^network\.ib\..*(err|discard|xmit_wait|symbol|link_down)", +1, 1.0),
    (r"^gpu\.\d+\.throttle_(?!idle|sync_boost)", +1, 0.5),
    (r"^gpu\.\d+\.(clock_sm|sm_clock_pct_of_max)$", -1, -0.1),
    (r"^gpu\.\d+\.(temp|memory_temp)$", +1, 5.0),
    (r"^gpu\.\d+\.(ecc_|xid|pcie_replay|remap|retired)", +1, 0.5),
    (r"^gpu\.\d+\.util_sm$", -1, 20.0), (r"^gpu\.\d+\.pcie_link_(gen|width)$", -1, 0.5),
    # violation counters (share of the time the clocks were held down), NVLink errors, a lost
    # GPU, processes on the job's GPU that are not the job's
    (r"^gpu\.\d+\.capped_(power|thermal|board|reliability)_s$", +1, 0.1),
    (r"^gpu\.\d+\.nvlink_\w+_errors$", +1, 0.5), (r"^gpu\.\d+\.nvml_status$", +1, 0.5),
    (r"^gpu\.\d+\.foreign_procs$", +1, 0.5), (r"^gpu\.\d+\.foreign_sm$", +1, 5.0),
    (r"^gpu\.\d+\.foreign_mem$", +1, 256 * 1048576.0),
    (r"^cpu\.(run\.)?perf\.ipc$", -1, -0.15),
    (r"^cpu\.(run\.)?perf\.(cache_miss_pct)$", +1, 5.0),
    (r"^cpu\.(run\.)?perf\.(l3_stall_ratio)$", +1, 0.05),
]
_SYMPTOM_RX = None


#: Relative symptoms also need an absolute drop (a link idling at 2 KiB/s that halves is not a
#: network problem; a loopback that carried a rank's all-reduce at 30 MiB/s and collapses is).
_REL_ABS = ((r"_bytes$", 1048576.0), (r"_packets$", 500.0))


def symptom_mask(names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(is_symptom, direction, minimum change, absolute minimum of relative ones) per channel."""
    global _SYMPTOM_RX
    if _SYMPTOM_RX is None:
        _SYMPTOM_RX = [(re.compile(p), d, m) for p, d, m in SYMPTOMS]
    is_s = np.zeros(len(names), bool)
    dirn = np.zeros(len(names))
    mins = np.zeros(len(names))
    absm = np.zeros(len(names))
    for i, n in enumerate(names):
        for rx, d, m in _SYMPTOM_RX:
            if rx.search(n):
                is_s[i], dirn[i], mins[i] = True, d, m
                if m < 0:
                    for pat, v in _REL_ABS:
                        if re.search(pat, n):
                            absm[i] = v
                break
    return is_s, dirn, mins, absm


def symptom_hits(dev: np.ndarray, observed: np.ndarray, center: np.ndarray,
                 mask: tuple, min_dev: float) -> np.ndarray:
    """Boolean per channel: a symptom moved ``min_dev`` spreads in its harmful direction and by
    its practical minimum (absolute, or relative when the minimum is negative)."""
    is_s, dirn, mins, absm = mask
    delta = np.nan_to_num((observed - center) * dirn, nan=0.0)
    rel = mins < 0
    big = np.where(rel, (delta >= -mins * np.abs(center)) & (delta >= absm),
                   delta >= mins)
    return is_s & (dev * dirn >= min_dev) & big


def symptom_strength(dev: np.ndarray, observed: np.ndarray, center: np.ndarray,
                     mask: tuple, min_dev: float
                     ) -> np.ndarray:
    """Per channel: how many times its practical minimum a symptom moved (0 when it is not a
    symptom or did not reach ``min_dev`` spreads).  A throughput that fell to 1 % of its level
    is a strong finding even when the level itself fluctuates a lot."""
    is_s, dirn, mins, _ = mask
    delta = np.nan_to_num((observed - center) * dirn, nan=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(mins < 0, delta / (-mins * np.abs(center)), delta / np.abs(mins))
    k = np.nan_to_num(k, nan=0.0, posinf=0.0, neginf=0.0)
    ok = symptom_hits(dev, observed, center, mask, min_dev)
    return np.where(ok, k, 0.0)


def symptoms(dev: np.ndarray, names: list[str], min_dev: float, observed: np.ndarray,
             center: np.ndarray) -> list[int]:
    """Indices of symptom channels that moved, strongest first."""
    hit = symptom_hits(dev, observed, center, symptom_mask(names), min_dev)
    idx = np.nonzero(hit)[0]
    return [int(i) for i in idx[np.argsort(-np.abs(dev[idx]))]]


def reference(means: np.ndarray, rows: np.ndarray, floors: np.ndarray,
              rel: float | np.ndarray = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """Reference level and spread of every channel over the given (normal) windows."""
    if rows.sum() < 3:
        rows = np.ones(len(means), bool)
    return robust_center_scale(means[rows].astype(np.float64), floors, rel)


def deviations(observed: np.ndarray, center: np.ndarray, scale: np.ndarray) -> np.ndarray:
    d = (observed - center) / scale
    return np.where(np.isfinite(d), d, 0.0)


#: Channels whose name prefix is not the subsystem they speak for.
_SUBSYSTEM_OF = (("memory.vm.pgpgin", "storage"), ("memory.vm.pgpgout", "storage"),
                 ("cpu.perf.page_faults", "memory"), ("cpu.perf.major_faults", "memory"),
                 ("cpu.run.perf.page_faults", "memory"), ("cpu.run.perf.major_faults", "memory"),
                 ("cpu.all.iowait", "storage"), ("storage.run.", "storage"),
                 ("system.ctxt", "cpu"), ("system.intr", "system"), ("system.nr_running", "cpu"))
#: The job's own CPU use: when it drops, the job is being held back (by CPU contention, a slow
#: disk, a slow network...), so it counts as a symptom but does not vote for a subsystem.
JOB_SHARE = re.compile(r"^cpu\.run\.(usage|user|system)$")
#: Weight of a channel that moved without being a harmful symptom (activity).
ACTIVITY_WEIGHT = 0.6
#: A GPU doing less (utilisation, power, memory traffic down): what a job shows when its input
#: or its collectives stall.  When a cause moved with it (a symptom of the network, storage,
#: CPU or memory), the GPU is the consequence and votes as weakly as the job's own CPU share;
#: the GPU's own faults (throttling, clocks, errors, foreign processes) stay causes.
_GPU_LESS = __import__("re").compile(r"^gpu\.\d+\.(util_sm|util_mem|power|power_usage|"
                                     r"power_draw|sm_active|sm_occupancy|tensor_active|"
                                     r"dram_active|mem_bw\w*)$")
CAUSES = ("network", "storage", "cpu", "memory")


def consequences(dev: np.ndarray, names: list[str], hits: np.ndarray | None) -> np.ndarray:
    """Per channel: a GPU doing less while a symptom of a cause subsystem fired."""
    less = np.array([bool(dev[i] < 0 and _GPU_LESS.match(n)) for i, n in enumerate(names)],
                    bool)
    if hits is None or not less.any():
        return np.zeros(len(names), bool)
    cause = any(hits[i] and not less[i] and subsystem_of(n) in CAUSES
                for i, n in enumerate(names))
    return less if cause else np.zeros(len(names), bool)


#: The run's own block I/O: bytes its processes (or its cgroup) read from and wrote to storage.
RUN_IO = re.compile(r"^storage\.run\.(read|write)_bytes$")
#: Symptoms the run's own I/O causes by itself on its device: queueing and latency, tasks
#: blocked on I/O, I/O pressure, iowait.
_IO_SYMPTOM = re.compile(r"^(storage\.|cpu\.all\.iowait_pct$)")
#: The least rise of the run's own I/O (bytes/s) that makes an event an I/O phase of its own.
RUN_IO_MIN = 1048576.0


def own_io(dev: np.ndarray, observed: np.ndarray, center: np.ndarray, names: list[str],
           hits: np.ndarray, min_dev: float) -> str | None:
    """What the run itself read or wrote, when its own I/O explains the event: its I/O rose
    (``min_dev`` spreads and ``RUN_IO_MIN``) and every symptom that fired is one that this
    I/O causes on its device (or its GPUs idling meanwhile).  A checkpoint written and synced,
    a dataset read at start: the job's own phase, not the machine.  The caller makes sure no
    process outside the run took part (no foreign support).  None otherwise."""
    rose = [j for j, n in enumerate(names) if RUN_IO.match(n) and dev[j] >= min_dev
            and observed[j] - center[j] >= RUN_IO_MIN]
    if not rose:
        return None
    for j in np.nonzero(hits)[0]:
        n = names[j]
        if not (_IO_SYMPTOM.match(n) or (dev[j] < 0 and _GPU_LESS.match(n))):
            return None
    return ", ".join(f"{names[j]} {center[j] / 1048576:.1f} → {observed[j] / 1048576:.1f} "
                     "MiB/s" for j in rose)


def subsystem_of(name: str) -> str:
    for prefix, sub in _SUBSYSTEM_OF:
        if name.startswith(prefix):
            return sub
    return name.split(".", 1)[0]


def subsystem_scores(dev: np.ndarray, names: list[str], min_dev: float = 3.0,
                     hits: np.ndarray | None = None) -> dict[str, float]:
    subs: dict[str, list[float]] = {}
    conseq = consequences(dev, names, hits)
    for i, (d, n) in enumerate(zip(np.abs(dev), names)):
        if d >= min_dev:
            w = 1.0 if hits is None or hits[i] else ACTIVITY_WEIGHT
            if (dev[i] < 0 and JOB_SHARE.match(n)) or conseq[i]:
                # the job doing less is a consequence of whatever held it back: only a weak
                # vote for CPU contention, the most common cause, when nothing else speaks
                w = 0.5 * ACTIVITY_WEIGHT
            # capped: one channel that went from ~0 to anything must not outvote the rest
            subs.setdefault(subsystem_of(n), []).append(float(np.log1p(min(d, 50.0))) * w)
    out = {}
    for s, vals in subs.items():
        vals.sort(reverse=True)
        out[s] = float(np.mean(vals[:2])) * DISCOUNT.get(s, 1.0)
    return out


def choose_subsystem(dev: np.ndarray, names: list[str], hits: np.ndarray | None = None
                     ) -> tuple[str, dict[str, float]]:
    """Subsystem with the strongest evidence; ``hits`` (symptom channels that fired) weigh
    fully, other channels that moved count as activity (``ACTIVITY_WEIGHT``)."""
    scores = subsystem_scores(dev, names, hits=hits)
    if not scores:
        scores = subsystem_scores(dev, names, min_dev=0.0, hits=hits)
    if not scores:
        return "system", {}
    best = max(scores, key=scores.get)
    return best, scores


def evidence(dev: np.ndarray, observed: np.ndarray, center: np.ndarray, names: list[str],
             units: list[str], top: int = 8, min_dev: float = 2.0,
             prefer: str | None = None, hits: np.ndarray | None = None) -> list[dict]:
    """The channels that moved most, strongest first (at least one entry); symptom channels
    (``hits``) rank as if they had moved 1/ACTIVITY_WEIGHT times further."""
    rank = np.abs(dev) * (np.where(hits, 1.0, ACTIVITY_WEIGHT) if hits is not None else 1.0)
    order = np.argsort(-rank)
    out = []
    for i in order[:max(top * 3, top)]:
        if len(out) >= top:
            break
        if abs(dev[i]) < min_dev and out:
            break
        out.append({"channel": names[i], "deviation": round(float(dev[i]), 2),
                    "baseline": num(center[i]), "observed": num(observed[i]),
                    "unit": units[i]})
    if prefer and out and not any(subsystem_of(e["channel"]) == prefer for e in out[:3]):
        # Put the chosen subsystem's strongest channel first so the summary reads naturally.
        for i in order:
            if subsystem_of(names[i]) == prefer:
                e = {"channel": names[i], "deviation": round(float(dev[i]), 2),
                     "baseline": num(center[i]), "observed": num(observed[i]),
                     "unit": units[i]}
                out = [e] + [x for x in out if x["channel"] != names[i]][:top - 1]
                break
    return out


def num(x: float) -> float | None:
    x = float(x)
    if not np.isfinite(x):
        return None
    return float(f"{x:.6g}")


def iteration_impact(events: list[dict], start: float, end: float,
                     anomalous: list[tuple[float, float]]) -> dict | None:
    """Mean iteration time inside [start, end] vs outside every anomaly, when markers exist.

    Time per iteration = time spent / iterations done (events carry ``n`` merged steps): a
    plain median over events would let the many events of fast stretches outvote the few of a
    slow one."""
    its = [(float(e["t"]), float(e["dt"]), float(e.get("n") or 1)) for e in events
           if e.get("event") == "iteration" and isinstance(e.get("dt"), (int, float))
           and e["dt"] > 0]
    if len(its) < 4:
        return None
    t = np.array([a for a, _, _ in its])
    dt = np.array([b for _, b, _ in its])
    n = np.array([c for _, _, c in its])
    inside = (t >= start) & (t <= end + 1.0)
    outside = np.ones(len(t), bool)
    for a, b in anomalous:
        outside &= ~((t >= a - 1.0) & (t <= b + 2.0))
    if inside.sum() < 1 or outside.sum() < 3:
        return None
    base = float(np.sum(dt[outside] * n[outside]) / np.sum(n[outside]))
    obs = float(np.sum(dt[inside] * n[inside]) / np.sum(n[inside]))
    if base <= 0:
        return None
    pct = 100.0 * (obs - base) / base
    # the run's own iteration-time noise (robust spread of the per-event times outside any
    # anomaly): a slowdown must stand out of it to count as evidence
    per = dt[outside] / n[outside]
    noise = 100.0 * 1.4826 * float(np.median(np.abs(per - np.median(per)))) / base
    # broad: the typical step slowed, not one long pause between steps (an eval loop, a
    # checkpoint -- the job's own phases)
    med_pct = 100.0 * (float(np.median(dt[inside] / n[inside])) - float(np.median(per))) / max(
        float(np.median(per)), 1e-12)
    return {"iteration_time_pct": round(pct, 1), "noise_pct": round(noise, 1),
            "typical_step_pct": round(med_pct, 1),
            "iteration_time_s": round(obs, 6),
            "iteration_time_baseline_s": round(base, 6), "iterations": int(n[inside].sum()),
            "text": f"iteration time {pct:+.0f}% during this anomaly "
                    f"({obs:.3g} s vs {base:.3g} s typical)"}


def slowed(impact: dict | None, min_pct: float) -> bool:
    """The iterations slowed: by ``min_pct`` and 3 x the run's own iteration-time noise, in
    total *and* for the typical step (one long pause between steps -- an eval loop, a
    checkpoint -- is the job's own).  False without markers (``impact`` None)."""
    if not impact:
        return False
    bar = max(min_pct, 3.0 * impact.get("noise_pct", 0.0))
    return bool(impact["iteration_time_pct"] >= bar and impact.get("typical_step_pct", bar) >= bar)
