"""Where a run's steps start and end: windows there are start-up or teardown, not anomalies."""
from __future__ import annotations

import numpy as np

from ..config import DetectConfig


def boundaries(meta: dict, events: list[dict], t_first: float, t_last: float
               ) -> tuple[list[float], list[float]]:
    """Start and end times of the run and of every step (meta.json and step events)."""
    starts, ends = [t_first], [t_last]
    for s in meta.get("steps") or []:
        if isinstance(s, dict):
            if isinstance(s.get("start"), (int, float)):
                starts.append(float(s["start"]))
            if isinstance(s.get("end"), (int, float)):
                ends.append(float(s["end"]))
    for e in events:
        if e.get("event") == "step_start":
            starts.append(float(e["t"]))
        elif e.get("event") == "step_end":
            ends.append(float(e["t"]))
    return sorted(set(starts)), sorted(set(ends))


def suppressed(ws: np.ndarray, we: np.ndarray, starts: list[float], ends: list[float],
               warmup: float, cooldown: float) -> np.ndarray:
    """Windows (start ``ws``, end ``we``) inside a start-up or teardown grace period."""
    s = np.zeros(len(ws), bool)
    for a in starts:
        s |= (we > a) & (ws < a + warmup)
    for b in ends:
        s |= (we > b - cooldown) & (ws < b)
    return s


def at_edge(s0: float, s1: float, starts: list[float], ends: list[float],
            cfg: DetectConfig) -> bool:
    """An event that begins right where the start-up grace ends (the start-up simply took
    longer), or a short one that ends where the teardown grace begins."""
    slack = cfg.window_s + cfg.stride_s
    for a in starts:
        if a <= s0 <= a + cfg.warmup_s + slack:
            return True
    for b in ends:
        if b - cfg.cooldown_s - slack <= s1 <= b and s1 - s0 <= 15.0:
            return True
    return False


def steady_before(events: list[dict], s0: float, cfg: DetectConfig) -> bool:
    """Iteration markers show training already running steadily before ``s0``: then an event
    that begins near the start-up boundary and slows the iterations is not start-up."""
    its = [float(e["t"]) for e in events if e.get("event") == "iteration" and "t" in e]
    if len(its) < 5:
        return False
    first = min(its)
    return sum(1 for t in its if first < t < s0) >= 3 and first + cfg.window_s < s0


def step_of(meta: dict, events: list[dict], t0: float) -> str | None:
    """The step that was running at ``t0`` (None outside every step)."""
    steps = [s for s in (meta.get("steps") or []) if isinstance(s, dict)]
    for s in steps:
        a, b = s.get("start"), s.get("end")
        if isinstance(a, (int, float)) and a <= t0 and (b is None or t0 <= b):
            return str(s.get("step_id"))
    cur = None
    for e in sorted(events, key=lambda e: e.get("t", 0)):
        if e.get("t", 0) > t0:
            break
        if e.get("event") == "step_start":
            cur = str(e.get("step_id"))
        elif e.get("event") == "step_end" and str(e.get("step_id")) == cur:
            cur = None
    return cur or ((meta.get("run") or {}).get("step_id"))
