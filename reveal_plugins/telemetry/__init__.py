"""Telemetry: probes, the sampling agent, the segment store and channel metadata."""
