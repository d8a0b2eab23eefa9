"""Analysis of a finished run: the ``reveal_analyze`` hook, ``report.json``, then the sinks.

Shared by ``reveal record``, ``reveal analyze``, ``reveal-torchrun`` and the Slurm epilog, so a
report is produced and published the same way whatever the source.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from .hooks import get_plugin_manager, hook
from .store import store
from .store.rundir import write_file

log = logging.getLogger(__name__)


#: The key of a run config by which a caller nobody waits on (the Slurm Epilog's detached
#: analysis, through the ``module:function(run_dir, cfg)`` analyzer interface) grants each
#: sink more time; :func:`analyze_and_publish` takes it out and hands it to :func:`publish`.
SINK_BUDGET_KEY = "sink_budget_s"


class AnalysisUnavailable(RuntimeError):
    """No plugin implements ``reveal_analyze`` (detection not installed or disabled)."""


def analyze_and_publish(run_dir: str, config: dict[str, Any] | None = None,
                        baseline: str | None = None, publish: bool = True) -> dict[str, Any]:
    """Analyse ``run_dir``, write ``report.json`` atomically and hand the report to the sinks.

    Raises :class:`AnalysisUnavailable` when no analysis plugin is present and
    :class:`reveal_plugins.store.store.StoreError` when ``run_dir`` is not a run directory.
    Sink failures are logged, never raised.
    """
    cfg = dict(config or {})
    sink_budget_s = cfg.pop(SINK_BUDGET_KEY, None)
    if baseline:
        cfg["baseline"] = baseline
    meta = store.read_meta(run_dir)  # a clear error for a wrong directory, before any plugin
    pm = get_plugin_manager()
    try:
        report = pm.hook.reveal_analyze(run_dir=run_dir, config=cfg)
    except (store.StoreError, ValueError):
        raise                      # bad input or setting: the caller reports it to the user
    except Exception as e:         # a crashed analysis must never read as a healthy run
        log.exception("analysis plugin failed on %s", run_dir)
        from .detect.batch.report import failed_report
        report = failed_report(meta, f"{type(e).__name__}: {e}")
    if report is None:
        raise AnalysisUnavailable("no analysis plugin is installed (reveal_analyze returned "
                                  "nothing)")
    if report.get("status") not in ("ok", "partial", "failed", "not_analysed"):
        report["status"] = "ok"     # a site analyzer that predates the field
        report.setdefault("status_reason", None)
    _publish(report, run_dir, cfg, sink_budget_s=sink_budget_s, sinks=publish)
    return report


def publish(report: dict[str, Any], run_dir: str, config: dict[str, Any] | None = None, *,
            sink_budget_s: float | None = None, sinks: bool = True) -> None:
    """The one way a report leaves the analysis: written to ``run_dir/report.json`` (atomic,
    symlink-safe, numpy values made plain), then handed to every sink in plugin order, each
    granted ``sink_budget_s`` (``None``: the end of a job, each sink keeps to its own budget).
    A report that cannot be written is still published, with a note saying so; sink failures
    are logged by the plugin manager, never raised."""
    data = json.dumps(report, indent=1, sort_keys=False, default=_json_default).encode()
    try:
        write_file(run_dir, store.REPORT, data)
    except OSError as e:
        log.error("cannot write %s: %s", os.path.join(run_dir, store.REPORT), e)
        report.setdefault("notes", []).append(f"report.json not written: {e}")
    if sinks:
        hook().reveal_report_ready(report=report, run_dir=run_dir, config=dict(config or {}),
                                   budget_s=sink_budget_s)


_publish = publish   # for analyze_and_publish, whose ``publish`` flag shadows the name


def publish_stopped(run_dir: str, reason: str, config: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The report of an analysis stopped from outside before it finished (a memory cap, a
    timeout): ``status: partial`` with ``reason``, no window judged, written and handed to the
    sinks like any report, so the run does not simply vanish."""
    from .detect.batch.report import empty_report
    meta = store.read_meta(run_dir)
    rep = empty_report(meta, [f"analysis stopped before it finished: {reason}"],
                       channels=len(meta.get("channels") or []), status="partial",
                       reason=reason, analysis={"stopped": reason})
    rep["summary"] = (rep["summary"].splitlines()[0] + "\n" +
                      f"ANALYSIS STOPPED ({reason}): no window was judged, so the absence of "
                      "anomalies means nothing. Re-run `reveal analyze DIR` with more memory "
                      "or time.")
    cfg = dict(config or {})
    publish(rep, run_dir, cfg, sink_budget_s=cfg.pop(SINK_BUDGET_KEY, None))
    return rep


def report_for(target: str, reanalyze: bool = False) -> dict[str, Any]:
    """The finished report of a run directory (its report.json, else analysed now, without
    publishing: looking at a report must not publish it) or of a report file.  The renderers
    only ever receive what this returns."""
    from .report import load
    if os.path.isfile(target):
        return load.read_report(target)
    path = os.path.join(target, store.REPORT)
    if os.path.islink(path):    # written by us it never is: someone planted it, do not read it
        log.warning("%s is a symlink; ignored (analysing the run instead)", path)
    elif os.path.isfile(path) and not reanalyze:
        return load.read_report(path)
    try:
        rep = analyze_and_publish(target, publish=False)
    except AnalysisUnavailable as e:
        return load.minimal_report(target, str(e))
    return load.check_report(rep, f"{target} (analysis result)")


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def summary_text(report: dict[str, Any], run_dir: str | None = None,
                 color: bool | None = None) -> str:
    """The one-screen summary: the report renderer when installed, else the report's summary."""
    try:
        from .report.text import render_text
    except ImportError:
        return str(report.get("summary", ""))
    try:
        return render_text(report, color=color, run_dir=run_dir)
    except Exception as e:  # a rendering bug must not hide the findings
        log.warning("text rendering failed (%s: %s); showing the plain summary",
                    type(e).__name__, e)
        return str(report.get("summary", ""))
