"""The Slurm sink: a short per-job summary next to the report, for ``reveal report JOBID``.

Registered as a built-in plugin (hooks/manager.py).  Only acts on reports of Slurm runs; writes
``summary.txt`` into the run directory through the symlink-safe writer, so it can run as root.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ..hooks.hookspec import hookimpl

log = logging.getLogger("reveal.slurm.sink")
SUMMARY = "summary.txt"


def _dur(a: Any, b: Any) -> str:
    try:
        s = float(b) - float(a)
    except (TypeError, ValueError):
        return "?"
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def render_summary(report: dict[str, Any], max_anomalies: int = 5) -> str:
    """Plain-text job summary (what ``jobstats`` users expect: short, actionable)."""
    from ..report.fmt import printable_tree
    report = printable_tree(report)  # step ids and names are the user's: no raw controls
    run = report.get("run", {})
    tel = report.get("telemetry", {})
    lines = [f"Reveal summary of Slurm job {run.get('job_id')} "
             f"(user {run.get('user')}, node(s) {', '.join(run.get('nodes') or [])})",
             f"  ran {_dur(run.get('start'), run.get('end'))} from "
             f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(run.get('start') or 0))}, "
             f"exit code {run.get('exit_code')}",
             f"  telemetry: {tel.get('samples', 0)} samples of {tel.get('channels', 0)} channels "
             f"every {tel.get('interval_s', '?')} s"]
    steps = run.get("steps") or []
    if steps:
        lines.append("  steps: " + ", ".join(
            f"{s.get('step_id')} ({_dur(s.get('start'), s.get('end'))}"
            + (f", exit {s['exit_code']}" if s.get("exit_code") is not None else "") + ")"
            for s in steps))
    if report.get("efficiency"):
        from ..detect.batch.efficiency import efficiency_lines
        lines += ["  job efficiency (this node):"] + [
            "    " + x for x in efficiency_lines(report["efficiency"])]
    anomalies = sorted(report.get("anomalies") or [], key=lambda a: -float(a.get("score", 0)))
    if report.get("status") == "failed":
        lines.append(f"  ANALYSIS FAILED ({report.get('status_reason')}): no conclusion; "
                     "re-run `reveal analyze` on the run directory")
    elif report.get("status") == "not_analysed":
        lines.append(f"  NOT ANALYSED ({report.get('status_reason')}): no conclusion")
    elif (report.get("analysis") or {}).get("stopped"):
        lines.append(f"  ANALYSIS STOPPED ({report.get('status_reason')}): no conclusion; "
                     "re-run `reveal analyze` on the run directory with more memory or time")
    elif not anomalies:
        lines.append("  no anomalies found")
    else:
        lines.append(f"  {len(anomalies)} anomal{'y' if len(anomalies) == 1 else 'ies'}:")
        t0 = float(run.get("start") or 0)
        for a in anomalies[:max_anomalies]:
            ev = ", ".join(e.get("channel", "?") for e in (a.get("evidence") or [])[:3])
            lines.append(f"  - {a.get('subsystem')} at +{float(a.get('start', t0)) - t0:.0f} s "
                         f"for {_dur(a.get('start'), a.get('end'))}"
                         + (f" in step {a['step_id']}" if a.get("step_id") else "")
                         + f" (score {float(a.get('score', 0)):.2f}; {ev})")
            for h in (a.get("hints") or [])[:2]:
                lines.append(f"      [{h.get('severity')}] {h.get('title')}: {h.get('action')}")
    if report.get("summary"):
        lines.append("")
        lines.append(str(report["summary"]).strip())
    return "\n".join(lines) + "\n"


@hookimpl
def reveal_report_ready(report: dict[str, Any], run_dir: str, config: dict[str, Any]) -> None:
    if (report.get("run") or {}).get("source") != "slurm":
        return
    from ..store.rundir import write_file
    try:
        write_file(run_dir, SUMMARY, render_summary(report).encode())
    except OSError as e:
        log.warning("cannot write %s/%s: %s", run_dir, SUMMARY, e)
