"""The node's CPU set: which cores the per-core probes count (agent ``--cpus``, config ``cpus``,
env ``REVEAL_CPUS``).

A machine carved into several nodes (one per network namespace and CPU set, or a container
pinned to some cores) must not see its neighbours' cores: with a CPU set, ``/proc/stat`` yields
``cpu.core<N>.*`` for those cores only and ``cpu.all.*`` as their sum, and cpufreq and the
system-wide perf counters cover only them.  Without one, every online core counts, as before.
"""
from __future__ import annotations

import os
from typing import Any

ENV = "REVEAL_CPUS"


def parse_cpulist(text: str, what: str = "cpus") -> list[int]:
    """``"0-3,8,10-11"`` (the kernel's cpulist format) -> sorted core numbers; ValueError naming
    the value when it is not one."""
    out: set[int] = set()
    s = str(text).strip()
    if not s:
        raise ValueError(f"{what} {text!r}: empty CPU list (expected e.g. 0-3,8)")
    for part in s.split(","):
        a, sep, b = part.strip().partition("-")
        try:
            lo, hi = int(a), int(b) if sep else int(a)
        except ValueError:
            raise ValueError(f"{what} {text!r}: {part.strip()!r} is not a core number or "
                             "range (expected e.g. 0-3,8)") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"{what} {text!r}: bad range {part.strip()!r}")
        out.update(range(lo, hi + 1))
    return sorted(out)


def format_cpulist(cpus: list[int]) -> str:
    """Inverse of :func:`parse_cpulist`: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    cpus = sorted(set(cpus))
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def online_cpus() -> list[int]:
    try:
        with open("/sys/devices/system/cpu/online") as f:
            return parse_cpulist(f.read(), "/sys/devices/system/cpu/online")
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))


def resolve(value: Any, what: str = "cpus") -> list[int] | None:
    """A CPU set from a config value (list of ints or a cpulist string; None/"" = all),
    checked against the online cores."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        cpus = parse_cpulist(value, what)
    elif isinstance(value, (list, tuple)) and all(isinstance(c, int) and not isinstance(c, bool)
                                                  and c >= 0 for c in value):
        cpus = sorted(set(value))
    else:
        raise ValueError(f"{what} {value!r}: expected a CPU list such as '0-3,8'")
    missing = sorted(set(cpus) - set(online_cpus()))
    if missing:
        raise ValueError(f"{what} {format_cpulist(cpus)}: core(s) {format_cpulist(missing)} "
                         f"not online (online: {format_cpulist(online_cpus())})")
    return cpus


def from_config(config: dict[str, Any] | None) -> list[int] | None:
    """The CPU set probes honour: config ``cpus`` (already resolved by the agent)."""
    v = (config or {}).get("cpus")
    return list(v) if v else None
