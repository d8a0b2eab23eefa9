"""Importers: telemetry recorded by other tools -> run directories the analysis reads."""
