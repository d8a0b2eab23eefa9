"""Build the ``reveal.report/1`` dict (★ shared/report.schema.json) and its one-screen summary."""
from __future__ import annotations

import math
import time
from typing import Any

SCHEMA = "reveal.report/1"
SUBSYSTEMS = ("cpu", "gpu", "memory", "network", "storage", "system")


def _num(x: Any) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _str(x: Any) -> str | None:
    return None if x is None else str(x)


def host_of(meta: dict) -> str | None:
    """The node a run's telemetry came from (``meta.json``'s host, else the run's)."""
    return meta.get("host") or (meta.get("run") or {}).get("host")


def run_section(meta: dict, t_first: float | None, t_last: float | None) -> dict:
    run = meta.get("run") or {}
    source = run.get("source", "local")
    if source not in ("local", "slurm", "torchrun"):
        source = "local"
    now = time.time()
    start = _num(meta.get("start")) or t_first or now
    end = _num(meta.get("end")) or t_last or start
    if end < start:
        end = start
    steps = []
    for s in meta.get("steps") or []:
        if not isinstance(s, dict) or _num(s.get("start")) is None:
            continue
        steps.append({"step_id": str(s.get("step_id", "")), "start": _num(s["start"]),
                      "end": _num(s.get("end")), "exit_code": s.get("exit_code")})
    exit_code = meta.get("exit_code")
    if not isinstance(exit_code, int) or isinstance(exit_code, bool):
        exit_code = None
    cmd = run.get("command")
    if not (cmd is None or isinstance(cmd, (str, list))):
        cmd = str(cmd)
    host = host_of(meta) or "unknown"
    return {"source": source, "run_id": _str(run.get("run_id")), "job_id": _str(run.get("job_id")),
            "step_id": _str(run.get("step_id")), "user": _str(run.get("user")),
            "command": cmd, "exit_code": exit_code, "start": float(start), "end": float(end),
            "nodes": [str(host)], "steps": steps}


def telemetry_section(meta: dict, samples: int, channels: int, bytes_stored: int,
                      interval_s: float | None) -> dict:
    probes = []
    for p in meta.get("probes") or []:
        if isinstance(p, dict) and "name" in p:
            probes.append({"name": str(p["name"]), "available": bool(p.get("available", False)),
                           "reason": _str(p.get("reason")),
                           "channels": int(p.get("channels") or 0)})
    iv = _num(meta.get("interval_s")) or interval_s or 1.0
    if iv <= 0:
        iv = 1.0
    return {"interval_s": float(iv), "samples": int(samples), "channels": int(channels),
            "bytes_stored": int(max(bytes_stored, 0)), "probes": probes}


STATUSES = ("ok", "partial", "failed", "not_analysed")


def verdict_status(notes: list[str], samples: int) -> tuple[str, str | None]:
    """``(status, status_reason)`` of a finished detection from its notes: ``failed`` when no
    detector ran, ``not_analysed`` when no window could be judged (too short, too gappy, no
    or unreadable telemetry), ``partial`` when part of the input or analysis was lost."""
    from .model import NO_DETECTOR
    if NO_DETECTOR in notes:
        return "failed", NO_DETECTOR
    unreadable = [n.split(": skipped unreadable segment")[0] for n in notes
                  if "skipped unreadable segment" in n]
    if samples == 0:
        if unreadable:
            return "not_analysed", (f"telemetry unreadable: {len(unreadable)} segment(s) could "
                                    f"not be read ({unreadable[0]}"
                                    + (", ..." if len(unreadable) > 1 else "") + ")")
        return "not_analysed", "no telemetry samples were recorded"
    short = next((n for n in notes if "nothing to analyse" in n), None)
    if short:
        return "not_analysed", short
    reason = partial_reason(notes)
    return ("partial" if reason else "ok"), reason


def empty_report(meta: dict, notes: list[str], samples: int = 0, channels: int = 0,
                 bytes_stored: int = 0, t_first: float | None = None,
                 t_last: float | None = None, analysis: dict | None = None,
                 status: str = "ok", reason: str | None = None) -> dict:
    rep = {"schema": SCHEMA, "status": status, "status_reason": reason,
           "run": run_section(meta, t_first, t_last),
           "telemetry": telemetry_section(meta, samples, channels, bytes_stored, None),
           "anomalies": [], "notes": list(notes), "analysis": analysis or {}}
    rep["summary"] = summary(rep)
    return rep


def failed_report(meta: dict, reason: str, notes: list[str] | None = None, **kw: Any) -> dict:
    """What a crashed analysis leaves: ``status: failed`` so that no reader (text, OTel, Slurm
    summary) can take the missing anomalies for a healthy run."""
    return empty_report(meta, list(notes or []) + [f"analysis failed: {reason}"],
                        status="failed", reason=reason, **kw)


#: Notes that mean part of the data or of the analysis was lost.
_PARTIAL = (("skipped unreadable segment", "unreadable telemetry segment(s) skipped"),
            ("ignored unfinished segment", "the last segment was never finished"),
            ("detector ", "a detector failed"), ("gap(s) in the samples", "gaps in the samples"))


def partial_reason(notes: list[str]) -> str | None:
    """``status_reason`` for a report whose analysis finished on incomplete input."""
    why = []
    for n in notes:
        for key, text in _PARTIAL:
            if key in n and (key != "detector " or " failed" in n) and text not in why:
                why.append(text)
    return "; ".join(why) or None


def _hms(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def summary(rep: dict, max_anomalies: int = 5) -> str:
    """One screen: what was found, the evidence, what to do."""
    run = rep["run"]
    tel = rep["telemetry"]
    who = run.get("job_id") and f"job {run['job_id']}" + (f".{run['step_id']}" if run.get(
        "step_id") else "") or run.get("run_id") or "run"
    dur = run["end"] - run["start"]
    lines = [f"Reveal: {who} on {', '.join(run['nodes'])}, {dur:.0f} s, "
             f"{tel['samples']} samples x {tel['channels']} channels"
             + (f", exit code {run['exit_code']}" if run.get("exit_code") is not None else "")]
    an = rep["anomalies"]
    if rep.get("status") == "failed":
        lines.append(f"ANALYSIS FAILED ({rep.get('status_reason')}): no conclusion about this "
                     "run; the absence of anomalies means nothing. Re-run `reveal analyze DIR`.")
    elif rep.get("status") == "not_analysed":
        lines.append(f"NOT ANALYSED ({rep.get('status_reason')}): no window was judged, so "
                     "nothing can be said about this run.")
    elif not an and rep.get("status") == "partial":
        lines.append("No anomalies found by the part of the analysis that ran.")
    elif not an:
        lines.append("No anomalies found: the machine behaved consistently during this run.")
    else:
        lines.append(f"{len(an)} anomal{'y' if len(an) == 1 else 'ies'} found "
                     f"(strongest first):")
    if rep.get("status") == "partial":
        lines.append(f"(partial analysis: {rep.get('status_reason')})")
    for a in sorted(an, key=lambda a: -a["score"])[:max_anomalies]:
        d = a["end"] - a["start"]
        imp = (a.get("impact") or {}).get("text")
        lines.append(f"[{a['id']}] {_hms(a['start'])}-{_hms(a['end'])} UTC "
                     f"(+{a['start'] - run['start']:.0f} s, {d:.0f} s)  {a['subsystem'].upper()}"
                     f"  score {a['score']:.1f}" + (f"  {imp}" if imp else "")
                     + ("  [vs baseline]" if a.get("baseline") else ""))
        ev = "; ".join(f"{e['channel']} {_v(e.get('baseline'))}->{_v(e.get('observed'))} "
                       f"({e['deviation']:+.1f})" for e in a["evidence"][:3])
        lines.append(f"    evidence: {ev}")
        for h in a["hints"][:2]:
            lines.append(f"    -> [{h['severity']}] {h['title']}")
            act = h["action"]
            lines.append(f"       do: {act if len(act) <= 300 else act[:297] + '...'}")
    if len(an) > max_anomalies:
        lines.append(f"... and {len(an) - max_anomalies} more in report.json")
    for n in (rep.get("notes") or [])[:4]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _v(x: Any) -> str:
    if x is None:
        return "?"
    x = float(x)
    a = abs(x)
    if a >= 1e9:
        return f"{x / 1e9:.2f}G"
    if a >= 1e6:
        return f"{x / 1e6:.2f}M"
    if a >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:.3g}"
