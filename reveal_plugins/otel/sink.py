"""The built-in OpenTelemetry sink plugin (listed in ``hooks/manager.py:BUILTIN_PLUGINS``).

* ``reveal_report_ready``: sends the finished run as one trace when OTLP export is configured
  (see :mod:`.config`); the caller (Slurm epilog, ``reveal record``, ``reveal-torchrun``) waits at
  most ``budget_s`` (default 1 s) whatever the backend does.  A caller that grants more time
  passes the hook's ``budget_s`` (the Slurm Epilog's detached analysis, which nobody waits
  on); the export then takes up to that, at most ``timeout_s``.
* ``reveal_agent_started`` / ``reveal_agent_stopping`` / ``reveal_live_finding``: optional live
  metrics from the node agent (``[otel] metrics = true`` or ``REVEAL_OTEL_METRICS=1``).

This module imports no OpenTelemetry package at import time: every ``reveal`` process loads
the plugin, and export is off on most of them.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ..hooks.hookspec import hookimpl
from .config import OtelConfigError, load_config

log = logging.getLogger(__name__)
_live: Any = None          # the LiveMetrics of this process's agent, if any
_prom: Any = None          # its Prometheus endpoint, if any
_config_warned = False


def _config(config: dict[str, Any] | None):
    """Effective config, or None (off, or broken: logged once)."""
    global _config_warned
    overrides = (config or {}).get("otel") if isinstance(config, dict) else None
    try:
        cfg = load_config(overrides=overrides if isinstance(overrides, dict) else None)
    except OtelConfigError as e:
        if not _config_warned:
            log.warning("OpenTelemetry export off: %s", e)
            _config_warned = True
        return None
    return cfg if cfg.enabled else None


@hookimpl
def reveal_report_ready(report: dict[str, Any], run_dir: str, config: dict[str, Any],
                        budget_s: float | None) -> None:
    """Export ``report`` as a trace; never raises, never waits longer than the caller's
    ``budget_s`` (at most ``timeout_s``) or, at the end of a job, ``[otel] budget_s``."""
    t0 = time.monotonic()
    cfg = _config(config)
    if cfg is None:
        return None
    try:
        from .export import export_report, read_meta
        limit = cfg.budget_s if budget_s is None else min(float(budget_s), cfg.timeout_s)
        budget = limit - (time.monotonic() - t0)
        outcome = export_report(report, read_meta(run_dir), cfg, budget_s=budget, run_dir=run_dir)
        if outcome.ok:
            log.info("run exported to %s as trace %s (%d spans, %.3f s)", outcome.endpoint,
                     outcome.trace_id, outcome.spans, outcome.seconds)
    except Exception as e:  # a malformed report, a missing optional package
        log.warning("OpenTelemetry export of %s skipped: %s: %s", run_dir, type(e).__name__,
                    cfg.redact(str(e)))
    return None


def _start_prometheus(agent: Any) -> None:
    """The /metrics endpoint when [prometheus] (or REVEAL_PROMETHEUS) asks for it; refused
    settings are logged and nothing listens (prometheus.py says why)."""
    global _prom
    if _prom is not None:
        return
    # standard library only at import; the exporter is imported when an endpoint is asked for
    from .prometheus import PrometheusConfigError, PrometheusEndpoint, load_prometheus_config
    try:
        pcfg = load_prometheus_config()
        if pcfg is None:
            return
        from .config import OtelConfig
        try:
            ocfg = load_config()
        except OtelConfigError:
            ocfg = OtelConfig(headers={}, resource_attributes={})
        _prom = PrometheusEndpoint(agent, pcfg, ocfg)
        _prom.start()
    except ImportError as e:
        log.warning("Prometheus endpoint not started: %s (pip install "
                    "'reveal-plugins[prometheus]')", e)
        _prom = None
    except (PrometheusConfigError, OSError) as e:
        log.warning("Prometheus endpoint not started: %s", e)
        _prom = None


@hookimpl
def reveal_agent_started(agent: Any) -> None:
    """Start live metrics when configured (non-blocking: the first export happens later)."""
    global _live
    _start_prometheus(agent)
    cfg = _config(None)
    if cfg is None or not cfg.metrics or _live is not None:
        return None
    try:
        from .metrics import LiveMetrics
        _live = LiveMetrics(agent, cfg)
        _live.start()
    except Exception as e:
        log.warning("OpenTelemetry live metrics not started: %s: %s", type(e).__name__, e)
        _live = None
    return None


@hookimpl
def reveal_agent_stopping(agent: Any) -> None:
    """Flush and stop live metrics within ~1 s."""
    global _live, _prom
    prom, _prom = _prom, None
    if prom is not None:
        prom.stop()
    live, _live = _live, None
    if live is not None:
        live.stop(timeout_s=1.0)
    return None


@hookimpl
def reveal_live_finding(run: Any, anomaly: dict[str, Any]) -> None:
    """Feed the live anomaly score gauge; a multi-node job's live peer suspect (it carries
    ``peers_compared``) is also sent as a span event in the job's trace when export is on."""
    if _live is not None:
        _live.record_finding(anomaly)
    if isinstance(anomaly, dict) and "peers_compared" in anomaly:
        cfg = _config(None)
        if cfg is not None:
            try:
                from .export import send_spans
                from .trace import build_peer_spans
                info = run.to_dict() if hasattr(run, "to_dict") else dict(run or {})
                send_spans(build_peer_spans(anomaly, info, cfg), cfg, budget_s=cfg.budget_s)
            except Exception as e:   # the live loop must go on whatever the backend does
                log.warning("OpenTelemetry peer suspect not sent: %s: %s", type(e).__name__,
                            cfg.redact(str(e)))
    return None
