"""Every hook of Reveal plugins, grouped by phase (like pytest's ``hookspec.py``).

Phases, left to right along the data flow:

1. probe registration   -- which probes the agent samples;
2. run lifecycle        -- a run (job, launch, record) starts/ends, steps start/end;
3. analysis             -- the analysis entry point, detectors and hint rules, and what the
                           agent runs while a run goes on (features, live analysis, peers);
4. sinks                -- a finished report (or a live finding) leaves the process.

Built-in probes, detectors, hint rules and sinks are plugins registered through these same
hooks; a site adds its own through the entry-point group ``reveal_plugins`` (see
:mod:`reveal_plugins.hooks.manager`).  Hook implementations must not raise for ordinary
failures: callers isolate them anyway (one broken plugin never stops the others), but a
plugin that wants its failure to be visible should log it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from ..probes.probe import Probe
    from ..types import RunInfo

PROJECT = "reveal_plugins"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- 1. probe registration -------------------------------------------------------------------

@hookspec
def reveal_register_probes(config: dict[str, Any]) -> "list[Probe]":
    """Return the host-level probes this plugin contributes.

    Called once when an agent (or ``reveal probes``) starts.  Each probe reports whether it is
    available and, if not, a human-readable reason; unavailable probes are listed, never
    sampled.  ``config`` is the agent configuration (``interval_s`` ...).
    """


@hookspec
def reveal_register_run_probes(run: "RunInfo", config: dict[str, Any]) -> "list[Probe]":
    """Return probes scoped to one run (its cgroup, its PIDs), sampled only for that run.

    Called when a run registers with the agent.
    """


@hookspec
def reveal_agent_started(agent: Any) -> None:
    """A node agent started sampling.  ``agent.latest()`` returns ``(t, {channel: value})`` of the
    newest host sample and ``agent.runs()`` the registered RunInfo objects; live exporters (OTel
    metrics) attach here.  Must not block."""


@hookspec
def reveal_agent_stopping(agent: Any) -> None:
    """The agent is about to stop (flush and shut down exporters within ~1 s)."""


# -- 2. run lifecycle ------------------------------------------------------------------------

@hookspec
def reveal_run_start(run: "RunInfo") -> None:
    """A run has registered with the agent; its run directory exists."""


@hookspec
def reveal_step_start(run: "RunInfo", step_id: str, t: float) -> None:
    """A step of ``run`` (a Slurm job step, a torchrun restart round) started at unix time ``t``."""


@hookspec
def reveal_step_end(run: "RunInfo", step_id: str, t: float, exit_code: int | None) -> None:
    """A step of ``run`` ended at unix time ``t``."""


@hookspec
def reveal_run_end(run: "RunInfo", exit_code: int | None) -> None:
    """A run unregistered; all its segments are on disk (analysis follows, if configured)."""


# -- 3. analysis -----------------------------------------------------------------------------

@hookspec(firstresult=True)
def reveal_analyze(run_dir: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """Analyse a finished run directory and return a report dict (``reveal.report/1``).

    ``firstresult``: the first plugin that returns a report wins.  Returning None means "no
    analysis available" (then ``reveal record`` only finalizes the run directory).  Unlike the
    other hooks, its exceptions reach the caller (:data:`PROPAGATING`): a bad run directory is
    the user's error to see, and a crashed analysis must become a ``failed`` report, not a
    silent "no analysis".
    """


@hookspec(firstresult=True)
def reveal_run_features(run_dir: str, channels: "list[Any]", interval_s: float | None,
                        config: dict[str, Any]) -> Any:
    """A callable ``writer(segment_path)`` that featurizes each closed segment of a new run
    while it goes on (so the job-end analysis of a long run reads features, not samples), with
    ``close(timeout)`` and ``failed``; None to leave it to the job-end analysis.  One with
    ``takes_rows = True`` is called ``writer(segment_path, rows=(t, values))``: the segment's
    rows as :func:`reveal_plugins.store.store.read_segment` would return them.  The agent
    calls this; the built-in implementation is :func:`reveal_plugins.detect.longrun.featstore.
    feature_writer`, registered by :mod:`reveal_plugins.detect.plugin`."""


@hookspec(firstresult=True)
def reveal_live_analyzer(channels: "list[Any]", interval_s: float, config: dict[str, Any]
                         ) -> Any:
    """A live analyzer for a run in live mode: ``update(t, rows) -> [anomaly]`` on each new
    block of rows, ``horizon()`` for the peers; None when unavailable."""


@hookspec(firstresult=True)
def reveal_live_peers(run: "RunInfo", config: dict[str, Any]) -> Any:
    """The live comparison of a multi-node job's run with its peers (``publish(...)``,
    ``check() -> [suspect]``), or None when the run has no peers or live peers are off."""


#: Hooks whose implementations' exceptions reach the caller; every other hook isolates them.
PROPAGATING = frozenset({"reveal_analyze"})


@hookspec
def reveal_detectors(config: dict[str, Any]) -> list[Any]:
    """Return unsupervised detectors: objects with ``name``, ``fit(X)`` and ``score_samples(X)``.

    ``X`` is a (windows x features) float array, robust-scaled; higher scores mean more
    anomalous.  All returned detectors are fused by the pipeline.
    """


@hookspec
def reveal_hints(anomaly: dict[str, Any], context: dict[str, Any]) -> list[dict[str, Any]]:
    """Return remediation hints for one anomaly (each a dict with ``title``, ``why``,
    ``action``, ``severity`` in info|warning|critical).  Return ``[]`` when the rule does not
    apply.  ``context`` holds run metadata and static facts (e.g. PCIe max link width):
    ``channels`` (every analysed channel's baseline/observed/deviation over the anomaly),
    ``meta``, ``impact`` (iteration-time slowdown, when markers exist), ``facts`` and
    ``foreign`` (what the node did outside the run: ``support`` channels above their bar,
    ``other_runs`` registered on the node then; None when nothing foreign moved).
    """


# -- 4. sinks --------------------------------------------------------------------------------

@hookspec
def reveal_report_ready(report: dict[str, Any], run_dir: str, config: dict[str, Any],
                        budget_s: float | None) -> None:
    """A report was produced for ``run_dir`` (already written to ``report.json``).

    Sinks (OTel, Slurm job summaries, site databases) consume it here, in plugin order, all
    called by :func:`reveal_plugins.analysis.publish`.  ``budget_s`` is the time the caller
    grants each sink: ``None`` at the end of a job, which waits on this hook (a sink keeps to
    its own job-end budget, e.g. ``[otel] budget_s``); seconds from a caller nobody waits on
    (the Slurm Epilog's detached analysis).  A sink that talks to the network bounds its time
    by it.
    """


@hookspec
def reveal_live_finding(run: "RunInfo", anomaly: dict[str, Any]) -> None:
    """Live mode found an anomaly in a run that is still going on."""
