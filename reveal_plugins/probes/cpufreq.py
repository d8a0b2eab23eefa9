"""Per-core CPU frequency from ``/sys/devices/system/cpu/cpu*/cpufreq``.

Channels: ``cpu.core<N>.freq`` (``scaling_cur_freq``, MHz) per core, plus ``cpu.freq_max``
(``cpuinfo_max_freq``) and, where the driver publishes it, ``cpu.freq_nominal``
(``base_frequency``, intel_pstate) — a core running well below nominal under load points at
power or thermal capping.  The governor(s) go into the probe's ``note`` (``powersave`` on a
compute node is a classic hint).  VMs usually have no cpufreq: the probe is then unavailable.
"""
from __future__ import annotations

import glob
import os
import re

from ..types import ChannelMeta
from .sysfs import SysfsProbe, ValueFile, read_text


class CpufreqProbe(SysfsProbe):
    name = "cpufreq"
    default_root = "/sys/devices/system/cpu"

    def __init__(self, root: str | None = None, cpus: list[int] | None = None):
        super().__init__(root)
        self.cpus = set(cpus) if cpus else None   # the node's CPU set (.cpuset)
        self.note = ""
        self.governors: dict[str, list[int]] = {}
        self._static: list[float] = []

    def _open(self) -> None:
        cpus = []
        for d in glob.glob(os.path.join(self.root, "cpu[0-9]*")):
            m = re.fullmatch(r"cpu(\d+)", os.path.basename(d))
            if m and (self.cpus is None or int(m.group(1)) in self.cpus) \
                    and os.path.isdir(os.path.join(d, "cpufreq")):
                cpus.append((int(m.group(1)), os.path.join(d, "cpufreq")))
        if not cpus:
            self._unavailable(f"no cpufreq under {self.root}/cpu*/cpufreq (VM, or no cpufreq "
                              f"driver loaded)")
            return
        channels: list[ChannelMeta] = []
        fmax = nominal = None
        for n, d in sorted(cpus):
            path = os.path.join(d, "scaling_cur_freq")
            try:
                self._files.append(ValueFile(path, 1e-3))  # kHz → MHz
            except OSError:
                continue
            channels.append(ChannelMeta(f"cpu.core{n}.freq", "MHz", "gauge", self.name,
                                        f"current frequency of core {n}"))
            gov = read_text(os.path.join(d, "scaling_governor"))
            if gov:
                self.governors.setdefault(gov, []).append(n)
            fmax = fmax or read_text(os.path.join(d, "cpuinfo_max_freq"))
            nominal = nominal or read_text(os.path.join(d, "base_frequency"))
        if not channels:
            self._unavailable(f"scaling_cur_freq not readable under {self.root}")
            return
        for key, val, desc in (("cpu.freq_max", fmax, "maximum (turbo) frequency"),
                               ("cpu.freq_nominal", nominal, "nominal (base) frequency")):
            if val and val.isdigit():
                channels.append(ChannelMeta(key, "MHz", "gauge", self.name, desc))
                self._static.append(int(val) * 1e-3)
        self.note = "governor " + ", ".join(
            f"{g} on {len(c)} core{'s' if len(c) > 1 else ''}" for g, c in self.governors.items())
        self._ready(channels)

    def sample(self) -> list[float]:
        return [f.read() for f in self._files] + self._static

    def describe(self) -> dict:
        d = super().describe()
        if self.available and self.governors:
            d["note"] = self.note
        return d
