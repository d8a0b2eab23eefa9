"""The machine's quiet lock for tests that record real telemetry and judge detection on it.

The benchmarks take the same lock (``benchmarks/peers/run.py --lock``; ``flock -x
/tmp/reveal-quiet.lock python benchmarks/...`` for the others): while a benchmark records, or
another such test runs, a recording test waits instead of measuring the other's load as a
neighbour (and the benchmark does not record the test's)."""
import contextlib
import fcntl
import os

import pytest

QUIET_LOCK = "/tmp/reveal-quiet.lock"


@contextlib.contextmanager
def hold_quiet_lock(path: str = QUIET_LOCK):
    """Hold ``path`` exclusively (waits for the current holder)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)


@pytest.fixture
def quiet_machine():
    """Hold ``QUIET_LOCK`` for the test (bounded by the test's own timeout)."""
    with hold_quiet_lock() as path:
        yield path
