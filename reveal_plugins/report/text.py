"""The one-screen text summary (``reveal report --format text``, printed by ``reveal record``).

Reads like ``jobstats``: who/where/when/how long/exit code, utilization bars per node and GPU,
then each anomaly (when, how long, subsystem, the channels that moved from baseline to
observed, the iteration-time impact when markers exist) and what to do about it.
"""
from __future__ import annotations

import math
import os
import shutil
import sys

from . import fmt, views
from .load import RunView, load_view

BAR = 24
MAX_ANOMALIES = 6
MAX_EVIDENCE = 3
MAX_OBSERVATIONS = 3
#: What explains an observation, by its ``reason`` code (``detect.batch.stages.judge`` and
#: ``detect.evidence.gpu``); the full sentence is in the JSON and HTML reports.
OBSERVATION_REASONS = {
    "own_activity": "the job's own activity: nothing outside it moved, no stall, no loss",
    "own_io": "the job's own I/O phase (a checkpoint, data loading)",
    "edge": "start-up or teardown of the run",
    "brief": "too brief to hold a job back, and the iterations did not slow",
    "gpus_alike": "every GPU moved alike: the job's own phase",
    "gpu_named": "part of a GPU finding above",
}
SUBSYSTEM_NAMES = {"cpu": "CPU", "gpu": "GPU", "memory": "memory", "network": "network",
                   "storage": "storage", "system": "system"}


class Style:
    """ANSI styling, or none at all (pipes, files, NO_COLOR)."""

    CODES = {"bold": "1", "dim": "2", "red": "31", "yellow": "33", "green": "32", "cyan": "36",
             "magenta": "35"}

    def __init__(self, on: bool):
        self.on = on

    def __call__(self, text: str, *styles: str) -> str:
        if not self.on or not styles:
            return text
        codes = ";".join(self.CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"


def want_color(stream=None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    stream = stream or sys.stdout
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def bar(pct: float | None, width: int = BAR) -> str:
    if pct is None or not math.isfinite(pct):
        return "·" * width
    full = max(0.0, min(1.0, pct / 100.0)) * width
    n = int(full)
    eighths = " ▏▎▍▌▋▊▉"
    rest = eighths[int((full - n) * 8)] if n < width else ""
    return ("█" * n + rest.strip()).ljust(width, "░")


def _severity_style(sev: str) -> tuple[str, ...]:
    return {"critical": ("bold", "red"), "warning": ("bold", "yellow")}.get(sev, ("cyan",))


def _header(rep: dict, s: Style, node_label: str | None = None) -> list[str]:
    run = rep["run"]
    tel = rep.get("telemetry", {})
    who = run.get("user") or "?"
    nodes = [node_label] if node_label else (run.get("nodes") or ["?"])
    where = nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes ({', '.join(nodes[:4])}" + (
        ", …)" if len(nodes) > 4 else ")")
    ident = []
    if run.get("job_id"):
        ident.append(f"job {run['job_id']}" + (f".{run['step_id']}" if run.get("step_id")
                                               not in (None, "") else ""))
    ident.append(f"{who}@{where}")
    ec = run.get("exit_code")
    exit_s = "exit ?" if ec is None else f"exit {ec}"
    exit_styled = s(exit_s, "bold", "red") if ec not in (None, 0) else s(exit_s, "green")
    title = s("Reveal report", "bold") + "  " + " · ".join(ident) + " · " + exit_styled
    out = [title]
    cmd = fmt.command_text(run.get("command"))
    if cmd:
        out.append(f"  {'command':<10}{cmd if len(cmd) <= 110 else cmd[:107] + '…'}")
    start, end = run.get("start"), run.get("end")
    out.append(f"  {'when':<10}{fmt.clock(start, True)} → {fmt.clock(end)}  "
               f"({fmt.duration(end - start)})  source: {run.get('source', '?')}")
    steps = run.get("steps") or []
    if len(steps) > 1:
        out.append(f"  {'steps':<10}" + ", ".join(
            f"{st['step_id']} {fmt.offset(st['start'] - start)}" for st in steps[:8]))
    probes = tel.get("probes") or []
    missing = [p for p in probes if not p.get("available")]
    tline = (f"{tel.get('samples', 0)} samples · {tel.get('channels', 0)} channels · every "
             f"{fmt.number(tel.get('interval_s'), 's')}")
    if tel.get("bytes_stored"):
        tline += f" · {fmt.number(tel['bytes_stored'] / 1e6, 'MB')} stored"
    if probes:
        tline += f" · {len(probes) - len(missing)}/{len(probes)} probes"
    out.append(f"  {'telemetry':<10}{tline}")
    if missing:
        names = ", ".join(p["name"] for p in missing)
        if len(missing) == 1:
            names += f" ({missing[0].get('reason') or 'unavailable'})"
        else:
            names += " (why: reveal report --format json, or the HTML page)"
        out.append(s(f"  {'':<10}not read: {names}", "dim"))
    return out


def _utilization(view: RunView, node: str, s: Style) -> list[str]:
    u = views.utilization(view.frame)
    lines: list[str] = []
    label = node[:12]
    pad = " " * len(label)
    first = True

    def row(name: str, pct: float | None, tail: str) -> None:
        nonlocal first
        lines.append(f"  {label if first else pad}  {name:<5}{s(bar(pct), 'green')} {tail}")
        first = False

    if u["cpu"]:
        c = u["cpu"]
        extra = []
        if c.get("cores"):
            extra.append(f"{c['cores']} cores")
        if c.get("runq") is not None:
            extra.append(f"run queue {c['runq']:.1f}")
        row("CPU", c["mean"], f"{c['mean']:3.0f} % mean  {c['p95']:3.0f} % p95"
            + (f"   {' · '.join(extra)}" if extra else ""))
    if u["memory"]:
        m = u["memory"]
        pct = 100.0 * m["used_mean"] / m["total"] if m["total"] else None
        row("mem", pct, f"{m['used_mean']:.1f} of {m['total']:.1f} GiB in use "
            f"(peak {m['used_max']:.1f})")
    for g in u["gpus"]:
        tail = []
        if g["util_mean"] is not None:
            tail.append(f"{g['util_mean']:3.0f} % mean  {g['util_p95']:3.0f} % p95")
        else:
            tail.append("utilization not read")
        if g["mem_used"] is not None:
            tail.append(f"mem {g['mem_used']:.1f}" + (f"/{g['mem_total']:.0f} GiB"
                                                      if g["mem_total"] else " GiB"))
        if g["power"] is not None:
            tail.append(f"{g['power']:.0f} W")
        if g["temp"] is not None:
            tail.append(f"{g['temp']:.0f} °C")
        row(f"GPU{g['index']}", g["util_mean"], "   ".join(tail))
    if not lines:
        lines.append(f"  {label}  (no CPU, memory or GPU samples recorded)")
    return lines


def _anomaly(n: int, a: dict, rep: dict, view: RunView | None, s: Style) -> list[str]:
    start0 = rep["run"]["start"]
    length = rep["run"]["end"] - start0
    dur = a["end"] - a["start"]
    share = f", {100 * dur / length:.0f} % of run" if length > 0 else ""
    sub = SUBSYSTEM_NAMES.get(a["subsystem"], a["subsystem"])
    where = []
    if a.get("node") and len(rep["run"].get("nodes") or []) > 1:
        where.append(a["node"])
    if a.get("step_id") not in (None, ""):
        where.append(f"step {a['step_id']}")
    score = a.get("score")
    head = (f" {s(f'#{n}', 'bold')} {s(f'{sub:<8}', 'bold', 'magenta')} "
            f"{fmt.offset(a['start'] - start0)} → {fmt.offset(a['end'] - start0)} "
            f"({fmt.clock(a['start'])}–{fmt.clock(a['end'])}, {fmt.duration(dur)}{share})"
            + (f"  score {score:.1f}" if isinstance(score, (int, float)) else "")
            + (f"  [{', '.join(where)}]" if where else ""))
    out = [head]
    if a.get("title"):
        out.append(f"    {a['title']}")
    if a.get("gpu"):
        from .peers_view import gpu_identity
        out.append(f"    {'gpu':<9}{gpu_identity(a['gpu'])}")
    impact = a.get("impact")
    if impact is None and view is not None:
        impact = views.iteration_impact(view.events, a["start"], a["end"])
    it = fmt.impact_text(impact)
    if it:
        out.append(f"    {'impact':<9}{s(it, 'bold')}")
    rows, more = fmt.top_evidence(a, view.channels if view else None, MAX_EVIDENCE)
    if rows:
        w1 = max(len(r[0]) for r in rows)
        w2 = max(len(r[1]) for r in rows)
        for i, (ch, change, z) in enumerate(rows):
            lab = "evidence" if i == 0 else ""
            out.append(f"    {lab:<9}{ch:<{w1}}  {change:<{w2}}  {s(z, 'dim')}".rstrip())
        if more:
            out.append(s(f"    {'':<9}… {more} more channel(s) moved", "dim"))
    return out


def _hints(rep: dict, s: Style, width: int) -> list[str]:
    hints = fmt.unique_hints(rep["anomalies"])
    if not hints:
        return []
    out = ["", s("What to do", "bold")]
    import textwrap
    for h, nums in hints:
        sev = h.get("severity", "info")
        refs = ", ".join(f"#{n}" for n in nums)
        out.append(f" {s('●', *_severity_style(sev))} {s(sev.upper(), *_severity_style(sev))}"
                   f"  {s(h.get('title', ''), 'bold')}  ({refs})")
        for lab, key in (("why", "why"), ("do", "action")):
            text = h.get(key)
            if not text:
                continue
            wrapped = textwrap.wrap(str(text), width=max(40, width - 12)) or [""]
            out.append(f"     {lab + ':':<5}{wrapped[0]}")
            out.extend(f"     {'':<5}{w}" for w in wrapped[1:])
    return out


def _observations(report: dict, view: RunView | None, s: Style) -> list[str]:
    """The strongest changes judged not to be anomalies, one line each: a person who reads
    "No anomalies" next to a run that did slow down sees what was seen and why it was let
    go."""
    obs = report.get("observations") or []
    if not obs:
        return []
    start0 = report["run"]["start"]
    top = sorted(obs, key=lambda o: -(o.get("score") or 0))[:MAX_OBSERVATIONS]
    out = ["", s(f"Seen, not anomalies ({len(obs)})", "bold")
           + s("  changes that the run itself explains", "dim")]
    for o in sorted(top, key=lambda o: o["start"]):
        sub = SUBSYSTEM_NAMES.get(o.get("subsystem"), o.get("subsystem") or "?")
        why = OBSERVATION_REASONS.get(o.get("reason")) or str(
            o.get("why_not_anomaly") or "").split(":")[0][:80]
        rows, _ = fmt.top_evidence(o, view.channels if view else None, 1)
        ev = f"  ({rows[0][0]} {rows[0][1]})".rstrip() if rows else ""
        out.append(f"  {fmt.offset(o['start'] - start0)} → {fmt.offset(o['end'] - start0)} "
                   f"{sub:<8} {why}" + s(ev, "dim"))
    if len(obs) > MAX_OBSERVATIONS:
        out.append(s(f"  … {len(obs) - MAX_OBSERVATIONS} more; see --format json", "dim"))
    return out


def _footnotes(report: dict, s: Style) -> list[str]:
    out = []
    checked = fmt.checked_text(report)
    if checked:
        out.append(s(f"  {checked}", "dim"))
    elif not report.get("anomalies") and fmt.one_line_summary(report):
        out.append(s(f"  {fmt.one_line_summary(report)}", "dim"))
    for n in (report.get("notes") or [])[:3]:
        out.append(s(f"  note: {n}", "dim"))
    return out


def render_text(report: dict, color: bool | None = None, run_dir: str | None = None,
                view: RunView | None = None, width: int | None = None,
                node_label: str | None = None) -> str:
    """Render one run's report as a screenful of text.

    ``color``: None = only when stdout is a terminal.  ``run_dir`` (or an already loaded
    ``view``) adds the utilization bars, channel units and the iteration-time impact computed
    from the run's own telemetry and markers.
    """
    s = Style(want_color() if color is None else color)
    width = width or min(shutil.get_terminal_size((100, 24)).columns, 120)
    report = fmt.printable_tree(report)  # user-controlled strings never reach the terminal raw
    node_label = fmt.printable(node_label) if node_label else node_label
    if view is None and run_dir is not None:
        view = load_view(run_dir, fmt.evidence_channels(report))
    out = _header(report, s, node_label)
    nodes = report["run"].get("nodes") or ["?"]
    tel = report.get("telemetry", {})
    if view is not None and len(view.frame.t):
        out += ["", s("Utilization", "bold") + s(f"  (whole node, {fmt.duration(view.frame.t[-1] - view.frame.t[0])} of samples)", "dim")]
        from .load import host_of
        out += _utilization(view, node_label or fmt.printable(host_of(view.meta)), s)
    if report.get("efficiency"):
        from ..detect.batch.efficiency import efficiency_lines
        out += ["", s("Job efficiency", "bold") + s("  (the job's own processes; the node "
                                                     "figures above include others' load)",
                                                     "dim")]
        out += ["  " + (s(x, "yellow") if x.startswith("note:") else x)
                for x in efficiency_lines(report["efficiency"])]
    from .peers_view import gpu_text_lines
    out += gpu_text_lines(report, s)
    anomalies = report.get("anomalies") or []
    out.append("")
    analysed = report.get("analysed", True)
    if (report.get("analysis") or {}).get("stopped"):   # a memory cap or timeout stopped it
        out.append(s("✗ Analysis stopped", "bold", "red") + f" ({report.get('status_reason')})"
                   ": no window was judged; the absence of anomalies means nothing.")
        out.append("  Re-run `reveal analyze DIR` with more memory or time; the telemetry is "
                   "kept.")
    elif report.get("status") == "not_analysed" and "unreadable" in str(
            report.get("status_reason")):
        out.append(s("⚠ Telemetry unreadable", "bold", "yellow")
                   + f" ({report.get('status_reason')}): it was recorded but cannot be read; "
                   "nothing was judged.")
    elif not tel.get("samples") and not (view is not None and len(view.frame.t)):
        out.append(s("No telemetry was recorded for this run", "bold", "yellow")
                   + f" (it lasted {fmt.duration(report['run']['end'] - report['run']['start'])};"
                   f" the first sample comes after {fmt.number(tel.get('interval_s'), 's')}, "
                   "and a report needs a few seconds of samples to compare against).")
    elif report.get("status") == "failed":
        out.append(s("✗ Analysis failed", "bold", "red") + f" ({report.get('status_reason')}): "
                   "nothing can be said about this run; the absence of anomalies means nothing.")
        out.append("  Re-run `reveal analyze DIR`; the telemetry is kept.")
    elif not analysed:
        out.append(s(report.get("summary", "Not analysed."), "bold", "yellow"))
        out.append("  Run `reveal analyze DIR` once the detection plugin is installed.")
    elif report.get("status") == "not_analysed":
        out.append(s("⚠ Not analysed", "bold", "yellow") + f" ({report.get('status_reason')}):"
                   " no window was judged; the absence of anomalies means nothing.")
    elif not anomalies and report.get("status") == "partial":
        out.append(s("⚠ No anomalies found by the part of the analysis that ran", "bold",
                     "yellow"))
    elif not anomalies:
        out.append(s("✓ No anomalies", "bold", "green") + ": the hardware and OS signals stayed "
                   "within what this run itself showed as normal.")
    else:
        out.append(s(f"Anomalies ({len(anomalies)})", "bold") + (
            f"  {fmt.one_line_summary(report)}" if fmt.one_line_summary(report) else ""))
        # numbered by time, so "#2" means the same anomaly in the hints and in the HTML
        shown = sorted(anomalies, key=lambda a: a["start"])
        top = {id(a) for a in sorted(shown, key=lambda a: -(a.get("score") or 0))[:MAX_ANOMALIES]}
        for n, a in enumerate(shown, 1):
            if id(a) in top:
                out += _anomaly(n, a, report, view, s)
        if len(anomalies) > MAX_ANOMALIES:
            out.append(s(f"  … {len(anomalies) - MAX_ANOMALIES} lower-scored anomalies not "
                         "shown; see --format html or json", "dim"))
        out += _hints({"anomalies": shown}, s, width)
    if report.get("status") == "partial":
        out.append(s(f"  (partial analysis: {report.get('status_reason')})", "yellow"))
    out += _observations(report, view, s)
    out += _footnotes(report, s)
    return "\n".join(out) + "\n"


def render_job_text(reports: list[tuple[dict, str | None]], job_id: str | None,
                    color: bool | None = None, peers: dict | None = None) -> str:
    """Several nodes of one job: a job line, the peer comparison (one line per node, the
    suspect marked), then one section per node separated by a rule."""
    s = Style(want_color() if color is None else color)
    nodes = fmt.node_labels(reports)
    sections = [render_text(rep, color=s.on, run_dir=d, node_label=n)
                for (rep, d), n in zip(reports, nodes)]
    if len(sections) <= 1:
        return "".join(sections)
    found = sum(len(rep.get("anomalies") or []) for rep, _ in reports)
    nodes = [fmt.printable(n) for n in nodes]
    head = s(f"Job {fmt.printable(str(job_id))}" if job_id else "Runs", "bold") + (
        f": {len(reports)} nodes ({', '.join(nodes)}), {found} anomal"
        f"{'y' if found == 1 else 'ies'} in all\n\n")
    from .peers_view import text_block
    return head + text_block(peers, s) + ("\n" + "─" * 72 + "\n\n").join(sections)
