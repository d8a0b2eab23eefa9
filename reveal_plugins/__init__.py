"""Reveal plugins: per-job hardware telemetry, unsupervised anomaly detection and hints.

Data flows one way: sources (slurm, torch_ext, cli) -> agent (probes) -> store (segments)
-> detect (pipeline) -> Report -> sinks (files, otel, slurm).  Every probe, detector, hint
rule and sink is a pluggy plugin; see :mod:`reveal_plugins.hooks.hookspec`.
"""

__version__ = "0.1.0"
