"""Pressure stall information (/proc/pressure/{cpu,memory,io}): the share of time tasks waited.

``total`` (µs, counter) gives the exact stall fraction per interval once turned into a rate;
``avg10`` (%) is kept because it is what operators know from ``cat /proc/pressure/*``.
"""
from __future__ import annotations

import os

from ..types import ChannelMeta
from .procfs import PROC, TokenFileProbe

RESOURCE_SUBSYSTEM = {"cpu": "cpu", "memory": "memory", "io": "storage"}


class PsiProbe(TokenFileProbe):
    def __init__(self, resource: str) -> None:
        super().__init__()
        self.resource = resource
        self.name = f"psi.{resource}"
        self.path = os.path.join("pressure", resource)

    @staticmethod
    def transform(data: bytes) -> bytes:
        return data.replace(b"=", b" ")

    def open(self) -> None:
        if not os.path.exists(os.path.join(PROC, "pressure")):
            self._unavailable("kernel without PSI (/proc/pressure missing; boot with psi=1)")
            return
        super().open()

    def layout(self, toks):
        out = []
        sub = RESOURCE_SUBSYSTEM[self.resource]
        kind = None
        for i, t in enumerate(toks):
            if t in (b"some", b"full"):
                kind = t.decode()
            elif t in (b"avg10", b"total") and kind:
                out.append((i + 1, f"{sub}.psi.{kind}_{t.decode()}"))
        return out

    def meta(self, key):
        if key.endswith("_total"):
            return ChannelMeta(key, "us", "counter", self.name,
                               f"time with {self.resource} pressure stalls (cumulative)")
        return ChannelMeta(key, "%", "gauge", self.name, "10 s average stall share")


def psi_probes() -> list[PsiProbe]:
    return [PsiProbe(r) for r in ("cpu", "memory", "io")]
