"""Probes: every source of telemetry (a new source goes here)."""
