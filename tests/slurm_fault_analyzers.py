"""Analyzers that fail on purpose, for the Slurm fault tests (``analyzer = "tests.slurm_fault_
analyzers:boom"`` in the hook configuration; imported by the detached analysis process)."""
import time


def boom(run_dir, config):
    raise RuntimeError(f"injected analysis failure for {run_dir}")


def slow(run_dir, config):
    time.sleep(60)


def hog(run_dir, config):
    """Allocates (and touches) 1.5 GB: far beyond a small analysis memory cap."""
    import numpy as np
    blocks = [np.ones(64 << 20, np.uint8) for _ in range(24)]
    return blocks
