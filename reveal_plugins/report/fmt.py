"""Small formatting helpers shared by the text and HTML reports (durations, clock times,
numbers with units, impacts, evidence lines)."""
from __future__ import annotations

import math
import re
import time
from typing import Any

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}

# C0/C1 controls (escape sequences, newlines that fake report lines, BEL, backspace) and the
# bidirectional overrides that reorder what a terminal shows ("Trojan Source").
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` safe for an admin's terminal: every control character shown as ``\\xNN``.

    Job names, commands and step ids come from users; printed raw, ``\\x1b]...`` could retitle
    the terminal, clear it or rewrite the lines above."""
    return _UNPRINTABLE.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                                       else f"\\u{ord(m.group()):04x}"), text)


def printable_tree(obj: Any) -> Any:
    """A copy of a report (dicts, lists, strings) with :func:`printable` applied to strings."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {printable_tree(k): printable_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [printable_tree(v) for v in obj]
    return obj


def duration(s: float | None) -> str:
    """``0.4 s``, ``42 s``, ``3 min 05 s``, ``2 h 01 min``."""
    if s is None or not math.isfinite(s):
        return "?"
    s = max(0.0, float(s))
    if s < 1:
        return f"{s:.2f} s"
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def offset(s: float) -> str:
    """Time since the run started: ``+0:17``, ``+1:02:03``."""
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"+{h}:{m:02d}:{sec:02d}" if h else f"+{m}:{sec:02d}"


def clock(t: float, with_date: bool = False) -> str:
    fmt = "%Y-%m-%d %H:%M:%S %Z" if with_date else "%H:%M:%S"
    return time.strftime(fmt, time.localtime(t))


def number(x: float | None, unit: str = "") -> str:
    """A value with 2-3 significant digits and SI suffixes for large plain counts."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "–"
    a = abs(x)
    suffix = ""
    if unit in ("", "/s", "count", "count/s") and a >= 1e4:
        for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if a >= div:
                x, a, suffix = x / div, a / div, suf
                break
    if a == 0:
        s = "0"
    elif a >= 100:
        s = f"{x:.0f}"
    elif a >= 10:
        s = f"{x:.1f}"
    elif a >= 0.01:
        s = f"{x:.2f}"
    else:
        s = f"{x:.2g}"
    if unit in ("count",):
        unit = ""
    sep = "" if not unit or unit.startswith("/") else " "
    return f"{s}{suffix}{sep}{unit}".strip()


# How a counter's per-second rate reads best: raw unit -> (scale, display unit).
COUNTER_DISPLAY = {"us": (1e-4, "% of time"), "ticks": (1e-2, "cores"),
                   "sectors": (512e-6, "MB/s"), "bytes": (1e-6, "MB/s"), "ms": (0.1, "% busy")}


def unit_scale(unit: str, magnitude: float = 0.0) -> tuple[float, str]:
    """(scale, unit) for a value already in ``unit`` as the analysis reports it (``us/s`` is a
    counter's rate, ``kB`` a gauge)."""
    if unit.endswith("/s") and unit[:-2] in COUNTER_DISPLAY:
        return COUNTER_DISPLAY[unit[:-2]]
    if unit in ("count/s",):
        return 1.0, "/s"
    if unit in ("C", "degC"):
        return 1.0, "°C"
    if unit == "bytes" and magnitude >= 1024 ** 3:
        return 1.0 / 1024 ** 3, "GiB"
    if unit == "kB":
        return (1.0 / 1024 ** 2, "GiB") if magnitude >= 1024 ** 2 else (1.0 / 1024, "MiB")
    return 1.0, unit


def display_scale(channel: str, channels: dict[str, dict] | None) -> tuple[float, str]:
    """(scale, unit) that turn a channel's value as the analysis reports it (counters as
    per-second rates) into what a person reads: µs/s of stall -> % of time, ticks/s -> cores,
    sectors/s -> MB/s."""
    if not channels or channel not in channels:
        return 1.0, ""
    c = channels[channel]
    u = c.get("unit", "") or ""
    if c.get("kind") == "counter":
        if u in COUNTER_DISPLAY:
            return COUNTER_DISPLAY[u]
        return 1.0, "/s" if u in ("", "count") else f"{u}/s"
    if u in ("C", "degC"):
        u = "°C"
    return 1.0, u


def evidence_line(ev: dict, channels: dict[str, dict] | None = None) -> tuple[str, str, str]:
    """(channel, "baseline → observed", "z +14.2") for one evidence item."""
    if ev.get("unit") is not None:
        mag = max(abs(x) for x in (ev.get("baseline"), ev.get("observed"), 0.0)
                  if isinstance(x, (int, float)))
        scale, unit = unit_scale(str(ev["unit"]), mag)
    else:
        scale, unit = display_scale(ev["channel"], channels)
    b, o = ev.get("baseline"), ev.get("observed")
    b = b * scale if isinstance(b, (int, float)) else b
    o = o * scale if isinstance(o, (int, float)) else o
    if b is None and o is None:
        change = ""
    else:
        change = f"{number(b, unit)} → {number(o, unit)}"
    dev = ev.get("deviation")
    z = f"{dev:+.1f}σ" if isinstance(dev, (int, float)) and math.isfinite(dev) else ""
    return ev["channel"], change, z


def impact_text(impact: Any) -> str | None:
    """One line for an anomaly's ``impact`` field (iteration time, throughput) or None.

    Accepts ``{"metric", "unit", "baseline", "observed", "ratio"}`` (ratio derived when absent),
    a ``{"slowdown_pct": N}`` form, or a plain string.
    """
    if impact is None:
        return None
    if isinstance(impact, str):
        return impact
    if not isinstance(impact, dict):
        return str(impact)
    if "iteration_time_s" in impact or "iteration_time_pct" in impact:
        # the detection pipeline's form
        impact = {"metric": "iteration_time", "unit": "s",
                  "baseline": impact.get("iteration_time_baseline_s"),
                  "observed": impact.get("iteration_time_s"),
                  "ratio": (1 + impact["iteration_time_pct"] / 100.0)
                  if isinstance(impact.get("iteration_time_pct"), (int, float)) else None,
                  "iterations": impact.get("iterations"), "text": impact.get("text")}
    metric = str(impact.get("metric", "iteration_time")).replace("_", " ")
    unit = impact.get("unit", "s")
    b, o = impact.get("baseline"), impact.get("observed")
    ratio = impact.get("ratio")
    if ratio is None and isinstance(b, (int, float)) and isinstance(o, (int, float)) and b:
        ratio = o / b
    parts = []
    if isinstance(b, (int, float)) and isinstance(o, (int, float)):
        parts.append(f"{metric} {number(b, unit)} → {number(o, unit)}")
    if isinstance(ratio, (int, float)) and math.isfinite(ratio):
        pct = (ratio - 1) * 100
        if ratio >= 1.05:
            parts.append(f"{pct:+.0f} %, {ratio:.1f}× slower" if "time" in metric
                         else f"{pct:+.0f} %")
        elif ratio <= 0.95:
            parts.append(f"{pct:+.0f} %")
        else:
            parts.append("no measurable change")
    elif "slowdown_pct" in impact:
        parts.append(f"{metric} {float(impact['slowdown_pct']):+.0f} %")
    if impact.get("iterations"):
        parts.append(f"{impact['iterations']} iterations affected")
    if not parts and impact.get("text"):
        parts.append(str(impact["text"]))
    return " · ".join(parts) if parts else None


def unique_hints(anomalies: list[dict]) -> list[tuple[dict, list[int]]]:
    """Hints of all anomalies, the same (title, action) once, with the anomaly numbers (1-based)
    that raised it, most severe first."""
    seen: dict[tuple[str, str], tuple[dict, list[int]]] = {}
    for n, a in enumerate(anomalies, 1):
        for h in a.get("hints") or []:
            key = (h.get("title", ""), h.get("action", ""))
            if key in seen:
                if n not in seen[key][1]:
                    seen[key][1].append(n)
            else:
                seen[key] = (h, [n])
    return sorted(seen.values(), key=lambda hv: (SEVERITY_ORDER.get(hv[0].get("severity"), 3),
                                                 hv[1][0]))


def command_text(cmd: Any) -> str:
    if cmd is None:
        return ""
    if isinstance(cmd, (list, tuple)):
        import shlex
        cmd = " ".join(shlex.quote(str(c)) for c in cmd)
    return " ".join(str(cmd).split())  # one line, even for `python -c '...multi-line...'`


def one_line_summary(report: dict) -> str | None:
    """The report's ``summary`` when it is one line.  The pipeline's summary is its own
    multi-line screen (shown when no renderer is installed) and repeats what the renderers
    show, so it is left out then."""
    summ = (report.get("summary") or "").strip()
    if summ and "\n" not in summ and not summ.startswith("Reveal:"):
        return summ
    return None


def checked_text(report: dict) -> str | None:
    """How much the analysis looked at, so that "no anomalies" can be trusted."""
    an = report.get("analysis") or {}
    if not an.get("windows") or report.get("status") in ("not_analysed", "failed"):
        return None     # nothing was judged: no "checked N windows" to trust
    what = f"checked {an['windows']} windows of {duration(an.get('window_s'))}"
    if an.get("channels_analysed") is not None:
        what += (f" over {an['channels_analysed']} of {an.get('channels_in', '?')} channels"
                 " (the others were constant or empty)")
    if an.get("detectors"):
        what += f" with {', '.join(an['detectors'])}"
    if an.get("baseline"):
        what += " and a baseline of earlier healthy runs"
    return what


def node_labels(reports: list[tuple[dict, str | None]]) -> list[str]:
    """One label per node section: the host name, or the run directory's name when several
    sections share a host (two network namespaces on one machine)."""
    import os
    hosts = [(r["run"].get("nodes") or ["?"])[0] for r, _ in reports]
    if len(set(hosts)) == len(hosts):
        return hosts
    return [os.path.basename(os.path.normpath(d)) if d else h for h, (_, d) in
            zip(hosts, reports)]


def evidence_channels(report: dict) -> list[str]:
    """Every channel an anomaly or an observation of ``report`` names as evidence (what a
    renderer loads from the run's telemetry)."""
    return [e["channel"] for a in (report.get("anomalies") or []) +
            (report.get("observations") or []) for e in a.get("evidence") or []]


def top_evidence(anomaly: dict, channels: dict[str, dict] | None = None,
                 n: int = 3) -> tuple[list[tuple[str, str, str]], int]:
    """The first ``n`` evidence lines and how many more channels moved.

    The pipeline's order is kept: it puts the symptoms and the anomaly's own subsystem first
    (a storage stall leads with I/O pressure, not with the larger CPU swing it caused).  Lines
    that read the same (a partition and its disk, a stall counter and its 10 s average) are
    shown once: the reader learns nothing from the second.
    """
    ev = list(anomaly.get("evidence") or [])
    rows: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for e in ev:
        ch, change, z = evidence_line(e, channels)
        key = (change.replace("% of time", "%"), z)
        if change and key in seen:
            continue
        seen.add(key)
        rows.append((ch, change, z))
    return rows[:n], max(0, len(rows) - n)
