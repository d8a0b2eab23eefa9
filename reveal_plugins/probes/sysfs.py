"""Small helpers shared by the sysfs probes (hwmon, cpufreq, InfiniBand)."""
from __future__ import annotations

import os
import re

from .probe import NAN, Probe

_BAD = re.compile(r"[^a-z0-9]+")


def slug(s: str) -> str:
    """A channel-name component: lower case, runs of other characters become ``_``."""
    return _BAD.sub("_", s.strip().lower()).strip("_") or "x"


class ValueFile:
    """One sysfs attribute kept open and re-read with ``pread`` (sysfs regenerates the text on
    every read at offset 0), parsed as the first number in it."""

    __slots__ = ("path", "fd", "scale")

    def __init__(self, path: str, scale: float = 1.0):
        self.path = path
        self.scale = scale
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self) -> float:
        try:
            tok = os.pread(self.fd, 64, 0).split(None, 1)
            return float(tok[0].rstrip(b":")) * self.scale if tok else NAN
        except (OSError, ValueError):
            return NAN

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


class SysfsProbe(Probe):
    """A probe made of sysfs attribute files under ``root`` (a parameter, so tests can point it
    at a fake tree).  Subclasses implement ``_open()`` filling ``self._files`` and calling
    ``_ready``/``_unavailable``; any exception there makes the probe unavailable, never raised.
    """

    default_root = "/sys"

    def __init__(self, root: str | None = None):
        super().__init__()
        self.root = root or self.default_root
        self._files: list[ValueFile] = []

    def open(self) -> None:
        try:
            self._open()
        except Exception as e:  # open() never raises
            self.close()
            self._unavailable(f"{self.name}: {type(e).__name__}: {e}")

    def _open(self) -> None:
        raise NotImplementedError

    def sample(self) -> list[float]:
        return [f.read() for f in self._files]

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []
