"""The batch stages: prepare, windows, features, detectors, baseline, events, report."""
