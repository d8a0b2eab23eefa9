"""Built-in analysis plugin: the ``reveal_analyze`` entry point, the built-in detectors, and
what the agent runs while a run goes on (incremental features, live analysis, live peers): the
agent reaches detection only through these hooks."""
from __future__ import annotations

from typing import Any

from ..hooks.hookspec import hookimpl


@hookimpl
def reveal_analyze(run_dir: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """Analyse ``run_dir``; ``config["baseline"]`` (path or dict) enables baseline comparison,
    other keys are detection settings (see ``config.DetectConfig``)."""
    from . import analyze
    from .config import with_site_defaults

    cfg = dict(config or {})
    baseline = cfg.pop("baseline", None)
    if "detect" in cfg:      # the [detect] table: every key must be a detection setting
        det_cfg = cfg["detect"] if isinstance(cfg["detect"], dict) else {}
    else:                    # a run-wide dict: the other rooms' keys are theirs
        from .config import DetectConfig
        det_cfg = {k: v for k, v in cfg.items()
                   if k in DetectConfig.model_fields or k in ("robust_z", "pca", "iforest")}
    return analyze(run_dir, with_site_defaults(det_cfg), baseline)


@hookimpl
def reveal_detectors(config: dict[str, Any]) -> list[Any]:
    from .batch.detectors import builtin_detectors

    return builtin_detectors(config)


@hookimpl
def reveal_run_features(run_dir: str, channels: list, interval_s: float | None,
                        config: dict[str, Any]) -> Any:
    from .longrun.featstore import feature_writer

    return feature_writer(run_dir, channels, interval_s, config)


@hookimpl
def reveal_live_analyzer(channels: list, interval_s: float, config: dict[str, Any]) -> Any:
    from .config import with_site_defaults
    from .live.analyzer import LiveAnalyzer

    live = with_site_defaults({"live": dict((config or {}).get("live") or {})})["live"]
    return LiveAnalyzer(channels, interval_s, {"live": {k: v for k, v in live.items()
                                                        if k != "peers"}})


@hookimpl
def reveal_live_peers(run: Any, config: dict[str, Any]) -> Any:
    from .config import site_detect
    from .live.peers import for_run

    cfg = dict(config or {})
    peers = site_detect()[0].live.peers
    if not peers.enabled:
        return None
    if "live_peers" not in cfg:
        cfg["live_peers"] = peers.model_dump(exclude={"enabled"})
    return for_run(run, cfg)
