"""Temperatures and fan speeds from ``/sys/class/hwmon`` (lm-sensors' kernel side).

CPU package/core sensors (chips ``coretemp``, ``k10temp``, ``zenpower``) become
``cpu.temp.<label>`` (``cpu.temp.package_id_0``, ``cpu.temp.core_3``, ``cpu.temp.tctl``); all
other chips ``system.hwmon.<chip>_<label>`` (temperatures, degC) and
``system.hwmon.<chip>_fan<N>`` (RPM).  Two chips with the same name (two sockets) get their
hwmon index appended.  Most VMs expose no hwmon at all: then the probe is unavailable.
"""
from __future__ import annotations

import glob
import os
import re

from ..types import ChannelMeta
from .sysfs import SysfsProbe, ValueFile, read_text, slug

CPU_CHIPS = {"coretemp", "k10temp", "zenpower", "cpu_thermal"}


class HwmonProbe(SysfsProbe):
    name = "hwmon"
    default_root = "/sys/class/hwmon"

    def _open(self) -> None:
        if not os.path.isdir(self.root):
            self._unavailable(f"no {self.root} (no hardware sensors exposed; usual in VMs)")
            return
        chips = sorted(glob.glob(os.path.join(self.root, "hwmon*")),
                       key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0))
        names = [read_text(os.path.join(c, "name")) or os.path.basename(c) for c in chips]
        channels: list[ChannelMeta] = []
        seen: set[str] = set()
        for chip, cname in zip(chips, names):
            tag = slug(cname) + (f"{os.path.basename(chip)[5:]}" if names.count(cname) > 1 else "")
            # attributes live in the hwmon dir, or under device/ on old drivers
            base = chip if glob.glob(os.path.join(chip, "*_input")) else os.path.join(chip, "device")
            for inp in sorted(glob.glob(os.path.join(base, "temp*_input"))):
                n = os.path.basename(inp)[4:-6]
                label = read_text(os.path.join(base, f"temp{n}_label")) or f"temp{n}"
                if cname in CPU_CHIPS:
                    ch = f"cpu.temp.{slug(label)}" + (f"_{tag}" if names.count(cname) > 1 else "")
                else:
                    ch = f"system.hwmon.{tag}_{slug(label)}"
                self._add(channels, seen, inp, ch, "degC", 1e-3, f"{cname} {label}")
            for inp in sorted(glob.glob(os.path.join(base, "fan*_input"))):
                n = os.path.basename(inp)[3:-6]
                label = read_text(os.path.join(base, f"fan{n}_label")) or f"fan{n}"
                self._add(channels, seen, inp, f"system.hwmon.{tag}_{slug(label)}", "RPM", 1.0,
                          f"{cname} {label}")
        if not channels:
            self._unavailable(f"no temperature or fan sensors under {self.root}")
            return
        self._ready(channels)

    def _add(self, channels, seen, path, name, unit, scale, desc) -> None:
        if name in seen:
            return
        try:
            f = ValueFile(path, scale)
        except OSError:
            return
        if f.read() != f.read():  # NaN: sensor present but unreadable (EIO on some boards)
            f.close()
            return
        seen.add(name)
        self._files.append(f)
        channels.append(ChannelMeta(name, unit, "gauge", self.name, desc))
