"""Evidence: foreign load, attribution to a subsystem, GPU findings, remediation hints."""
