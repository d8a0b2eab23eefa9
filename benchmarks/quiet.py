"""The machine's quiet lock, ``/tmp/reveal-quiet.lock``: the benchmarks that record real
telemetry and the tests that judge detection on real recordings (fixture ``quiet_machine``,
``tests/fixtures_quiet.py``) hold it exclusively, so that none measures another's load as a
neighbour.  Benchmarks without their own option take it from the shell: ``flock -x
/tmp/reveal-quiet.lock python benchmarks/...``."""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Iterator

QUIET_LOCK = "/tmp/reveal-quiet.lock"


def take(path: str = QUIET_LOCK) -> int:
    """Hold ``path`` exclusively (waits for the current holder); returns the descriptor to
    close to release it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def hold(path: str = QUIET_LOCK) -> Iterator[str]:
    """``with hold():`` the quiet lock for the block."""
    fd = take(path)
    try:
        yield path
    finally:
        os.close(fd)


class QuietLock:
    """The lock held across consecutive runs for at most ``hold_s`` (each acquisition waits
    behind the other users' holds: per run would mean 20 waits), released between holds so
    nobody waits longer than that."""

    def __init__(self, path: str = QUIET_LOCK, hold_s: float = 540.0):
        self.path, self.hold_s = path, hold_s
        self.fd: int | None = None
        self.since = 0.0
        self.longest = 0.0

    def take(self) -> None:
        now = time.monotonic()
        if self.fd is not None and now - self.since + self.longest > self.hold_s:
            self.release()
        if self.fd is None:
            self.fd = take(self.path)
            self.since = time.monotonic()

    def ran(self, wall: float) -> None:
        self.longest = max(self.longest, wall)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
