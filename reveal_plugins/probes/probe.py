"""The probe interface and a fast reader for whitespace-separated procfs/sysfs files.

A probe is opened once (it discovers its channels and whether it can work here), then sampled
on every agent tick.  ``sample()`` returns one float per channel (NaN where a value is missing
this time) and should not raise; if it does, the agent logs the error once and fills NaN.
"""
from __future__ import annotations

import os
from operator import itemgetter
from typing import Any, Callable, Sequence

from ..types import ChannelMeta

NAN = float("nan")


class Probe:
    """Base class: set ``name``; implement ``open()`` and ``sample()``."""

    name = "probe"
    #: Slow-moving or costly sources set this (seconds): the agent then reads them every
    #: ``interval_s`` instead of every tick and stores NaN in between (readers interpolate).
    interval_s: float | None = None
    #: Probes that need privileges or hardware say why they cannot work in ``reason``.
    available: bool = False
    reason: str | None = None

    def __init__(self) -> None:
        self.channels: list[ChannelMeta] = []
        self.available = False
        self.reason = "not opened"

    def open(self) -> None:
        """Discover channels and availability.  Must not raise: set ``available``/``reason``."""
        raise NotImplementedError

    def sample(self) -> Sequence[float]:
        """One value per channel, in ``channels`` order."""
        raise NotImplementedError

    def read_raw(self) -> Any:
        """This tick's reading in whatever form is cheapest to take now (bytes of a file);
        :meth:`parse_raw` turns it into ``sample()``'s values later.  The agent calls the pair
        on its sampling thread but parses a second's worth of ticks at once: each 10 Hz wake-up
        then touches only the reads, and the parsing runs with warm caches (on a VM a cold
        parse costs several times a warm one).  Readings are parsed in the order taken.  The
        default reads and parses at once (probes that only implement ``sample()``)."""
        return self.sample()

    def parse_raw(self, raw: Any) -> Sequence[float]:
        """The values of a :meth:`read_raw` reading (the default: it already holds them)."""
        return raw

    def close(self) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name, "available": self.available,
                "reason": None if self.available else self.reason,
                "channels": len(self.channels) if self.available else 0}

    def _unavailable(self, reason: str) -> None:
        self.available, self.reason, self.channels = False, reason, []

    def _ready(self, channels: list[ChannelMeta]) -> None:
        self.channels = channels
        self.available, self.reason = True, None


class TokenFile:
    """Reads a small text file with one ``pread`` and picks numeric tokens by position.

    ``layout(tokens) -> [(token_index, key), ...]`` is computed when the file is opened and again
    whenever the number of tokens changes (a disk or interface appeared); values are returned in
    the order of ``keys`` given at the first layout, NaN for keys that went away.  This keeps the
    per-sample cost at one syscall, one ``split`` and one ``itemgetter`` call, which is what lets
    the host set sample at 10 Hz for a small fraction of a core.
    """

    def __init__(self, path: str, layout: Callable[[list[bytes]], list[tuple[int, str]]],
                 transform: Callable[[bytes], bytes] | None = None, bufsize: int = 1 << 16):
        self.path = path
        self._layout_fn = layout
        self._transform = transform
        self.bufsize = bufsize
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        toks = self._tokens()
        pairs = layout(toks)
        self.keys = [k for _, k in pairs]
        self._set_layout(toks, pairs)

    def raw(self) -> bytes:
        """The file's bytes now (one ``pread``); :meth:`parse` gives their values."""
        data = os.pread(self.fd, self.bufsize, 0)
        while len(data) == self.bufsize:  # file larger than the buffer: grow once, keep it
            self.bufsize *= 4
            data = os.pread(self.fd, self.bufsize, 0)
        return data

    def _tokens(self, data: bytes | None = None) -> list[bytes]:
        if data is None:
            data = self.raw()
        if self._transform is not None:
            data = self._transform(data)
        return data.split()

    def _set_layout(self, toks: list[bytes], pairs: list[tuple[int, str]]) -> None:
        self._ntok = len(toks)
        where = {k: i for i, k in pairs}
        present = [k for k in self.keys if k in where]
        self._complete = len(present) == len(self.keys)
        self._pos = [self.keys.index(k) for k in present]
        idx = [where[k] for k in present]
        self._get = itemgetter(*idx) if len(idx) > 1 else (
            (lambda seq, i=idx[0]: (seq[i],)) if idx else (lambda seq: ()))

    def read(self) -> list[float]:
        return self.parse(self.raw())

    def parse(self, data: bytes) -> list[float]:
        """The values in ``data`` (what :meth:`raw` returned); a changed token count (a disk
        or interface appeared) lays the file out again."""
        toks = self._tokens(data)
        if len(toks) != self._ntok:
            self._set_layout(toks, self._layout_fn(toks))
        vals = list(map(float, self._get(toks)))
        if self._complete:
            return vals
        out = [NAN] * len(self.keys)
        for p, v in zip(self._pos, vals):
            out[p] = v
        return out

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
