"""Built-in analysis plugin: the ``reveal_analyze`` entry point and the built-in detectors."""
from __future__ import annotations

from typing import Any

from ..hooks.hookspec import hookimpl


@hookimpl
def reveal_analyze(run_dir: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """Analyse ``run_dir``; ``config["baseline"]`` (path or dict) enables baseline comparison,
    other keys are detection settings (see ``pipeline.DEFAULTS``)."""
    from . import analyze

    cfg = dict(config or {})
    baseline = cfg.pop("baseline", None)
    det_cfg = cfg.get("detect", cfg)
    return analyze(run_dir, det_cfg if isinstance(det_cfg, dict) else {}, baseline)


@hookimpl
def reveal_detectors(config: dict[str, Any]) -> list[Any]:
    from .detectors import builtin_detectors

    return builtin_detectors(config)
