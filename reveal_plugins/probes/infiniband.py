"""InfiniBand / RoCE port counters from ``/sys/class/infiniband/<dev>/ports/<port>/``.

Channels ``network.ib.<dev>_<port>.<counter>``:

- ``counters/*`` (IBA PortCounters): ``port_rcv_data`` / ``port_xmit_data`` are in units of
  **4-byte words** (multiply by 4 for bytes; the unit says so), packets, errors
  (``symbol_error``, ``port_rcv_errors``, ``link_downed``, ``link_error_recovery``...) and
  ``port_xmit_wait`` (ticks the port had data but no credits: congestion).  Legacy 32-bit
  counters saturate instead of wrapping; mlx5 exposes 64-bit ones.
- ``hw_counters/*`` (driver-specific, e.g. mlx5 ``out_of_buffer``, ``rnr_nak_retry_err``,
  ``np_cnp_sent`` for RoCE congestion): every numeric file, as counters.
- ``rate`` (Gb/s), ``state`` (4 = ACTIVE) and ``phys_state`` (5 = LinkUp) as gauges: a link that
  trains down to a lower rate or flaps shows up here.
"""
from __future__ import annotations

import glob
import os

from ..types import ChannelMeta
from .sysfs import SysfsProbe, ValueFile, slug

_WORDS = {"port_rcv_data", "port_xmit_data"}
_PACKETS = {"port_rcv_packets", "port_xmit_packets", "unicast_rcv_packets",
            "unicast_xmit_packets", "multicast_rcv_packets", "multicast_xmit_packets"}


def _unit(counter: str) -> str:
    if counter in _WORDS:
        return "4-byte words"
    if counter in _PACKETS or counter.endswith("_packets"):
        return "packets"
    if counter == "port_xmit_wait":
        return "ticks"
    return "events"


class InfinibandProbe(SysfsProbe):
    name = "infiniband"
    default_root = "/sys/class/infiniband"

    def _open(self) -> None:
        if not os.path.isdir(self.root):
            self._unavailable(f"no {self.root} (no InfiniBand/RDMA device or driver)")
            return
        ports = sorted(glob.glob(os.path.join(self.root, "*", "ports", "*")))
        if not ports:
            self._unavailable(f"no RDMA ports under {self.root}")
            return
        channels: list[ChannelMeta] = []
        for port in ports:
            dev = os.path.basename(os.path.dirname(os.path.dirname(port)))
            pre = f"network.ib.{slug(dev)}_{slug(os.path.basename(port))}."
            for sub in ("counters", "hw_counters"):
                for path in sorted(glob.glob(os.path.join(port, sub, "*"))):
                    c = os.path.basename(path)
                    if not os.path.isfile(path) or c == "lifespan":
                        continue
                    self._add(channels, path, pre + slug(c), _unit(c), "counter",
                              f"{dev} port {os.path.basename(port)} {sub}/{c}")
            self._add(channels, os.path.join(port, "rate"), pre + "rate", "Gb/s", "gauge",
                      "link rate")
            self._add(channels, os.path.join(port, "state"), pre + "state", "state", "gauge",
                      "port state (4 = ACTIVE)")
            self._add(channels, os.path.join(port, "phys_state"), pre + "phys_state", "state",
                      "gauge", "physical state (5 = LinkUp)")
        if not channels:
            self._unavailable(f"no readable port counters under {self.root}")
            return
        self._ready(channels)

    def _add(self, channels, path, name, unit, kind, desc) -> None:
        try:
            f = ValueFile(path)
        except OSError:
            return
        if f.read() != f.read():  # not numeric (or EINVAL on a counter the HW lacks)
            f.close()
            return
        self._files.append(f)
        channels.append(ChannelMeta(name, unit, kind, self.name, desc))
