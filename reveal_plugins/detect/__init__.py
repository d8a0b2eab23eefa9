"""Unsupervised detection, attribution and hints: ``analyze(run_dir) -> report dict``.

See ``docs/detection.md``.  The pipeline lives in :mod:`~reveal_plugins.detect.pipeline`; each step is its own module
(prepare, windows, features, prune, detectors, events, attribution, hints, report, baseline,
live).
"""
from __future__ import annotations

from typing import Any


def analyze(run_dir: str, config: dict | None = None, baseline: Any = None) -> dict:
    """Analyse a finished run directory; returns a ``reveal.report/1`` dict.

    ``baseline`` is a baseline file path or a loaded baseline dict (``reveal baseline fit``).
    """
    from .pipeline import analyze as _analyze

    return _analyze(run_dir, config, baseline)


__all__ = ["analyze"]
