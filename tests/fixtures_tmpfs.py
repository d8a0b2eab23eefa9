"""A small real tmpfs for disk-full tests (root only; the test is skipped where it can't mount)."""
import contextlib
import os
import shutil
import subprocess
import tempfile

import pytest


@contextlib.contextmanager
def mounted_tmpfs(options: str, prefix: str = "reveal-tmpfs-"):
    """Yield the path of a fresh tmpfs mounted with ``options`` (e.g. ``size=1m``)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    base = tempfile.mkdtemp(prefix=prefix)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", base],
                       capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(base)
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield base
    finally:
        subprocess.run(["umount", "-l", base], capture_output=True)
        os.rmdir(base)
