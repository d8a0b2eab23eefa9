"""Queueing-discipline statistics of each interface (rtnetlink ``RTM_GETQDISC``).

A shaper or emulator on an interface (``tc qdisc ... tbf|netem|htb``), whether somebody put it
there on purpose or a site's setup left it behind, holds packets back *before* they reach the
wire: ``/proc/net/dev`` then only shows fewer bytes, which the job's own phases also do.  The
qdisc says it directly: packets waiting (``qdisc_backlog``, ``qdisc_qlen``), packets refused
(``qdisc_drops``) and packets delayed because the rate was exceeded (``qdisc_overlimits``).
One dump per read, of the root (egress) and ingress qdisc of every interface in the agent's
network namespace; an ingress policer's drops count with the egress ones.

The netlink messages are parsed here with :mod:`struct` (a dozen fields; no library needed):
``struct tcmsg`` then attributes; the counters come from ``TCA_STATS2``/``TCA_STATS_QUEUE``
(``struct gnet_stats_queue``), else from the legacy ``TCA_STATS`` (``struct tc_stats``).
"""
from __future__ import annotations

import os
import socket
import struct
from typing import Iterator

from ..types import ChannelMeta
from .probe import NAN, Probe

RTM_GETQDISC, RTM_NEWQDISC = 38, 36
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCA_KIND, TCA_STATS, TCA_STATS2 = 1, 3, 7
TCA_STATS_QUEUE = 3
TC_H_ROOT, TC_H_INGRESS = 0xFFFFFFFF, 0xFFFFFFF1
_NLMSG = struct.Struct("=IHHII")
_TCMSG = struct.Struct("=BxxxiIII")
_RTA = struct.Struct("=HH")
#: (field, kind) in the order written per interface
FIELDS = (("qdisc_backlog", "gauge"), ("qdisc_qlen", "gauge"), ("qdisc_drops", "counter"),
          ("qdisc_overlimits", "counter"), ("qdisc_requeues", "counter"))


def _attrs(buf: bytes, off: int, end: int) -> Iterator[tuple[int, bytes]]:
    while off + 4 <= end:
        ln, typ = _RTA.unpack_from(buf, off)
        if ln < 4:
            return
        yield typ & 0x3FFF, buf[off + 4:off + ln]
        off += (ln + 3) & ~3


def parse_dump(chunks: list[bytes]) -> dict[int, dict]:
    """ifindex -> {kind, backlog, qlen, drops, overlimits, requeues} of its root qdisc, with
    the drops and overlimits of its ingress qdisc (policing) added."""
    out: dict[int, dict] = {}
    ingress: dict[int, dict] = {}
    for buf in chunks:
        off = 0
        while off + _NLMSG.size <= len(buf):
            ln, typ, _flags, _seq, _pid = _NLMSG.unpack_from(buf, off)
            if ln < _NLMSG.size:
                break
            if typ == RTM_NEWQDISC and ln >= _NLMSG.size + _TCMSG.size:
                _fam, ifindex, _handle, parent, _info = _TCMSG.unpack_from(buf, off + 16)
                if parent in (TC_H_ROOT, TC_H_INGRESS):
                    q = {"kind": ""}
                    for t, v in _attrs(buf, off + 16 + _TCMSG.size, off + ln):
                        if t == TCA_KIND:
                            q["kind"] = v.split(b"\0", 1)[0].decode("ascii", "replace")
                        elif t == TCA_STATS2:
                            for t2, v2 in _attrs(v, 0, len(v)):
                                if t2 == TCA_STATS_QUEUE and len(v2) >= 20:
                                    (q["qlen"], q["backlog"], q["drops"], q["requeues"],
                                     q["overlimits"]) = struct.unpack_from("=5I", v2)
                        elif t == TCA_STATS and len(v) >= 36 and "qlen" not in q:
                            (_b, _p, q["drops"], q["overlimits"], _bps, _pps, q["qlen"],
                             q["backlog"]) = struct.unpack_from("=QIIIIIII", v)
                            q["requeues"] = 0
                    (out if parent == TC_H_ROOT else ingress)[ifindex] = q
            elif typ in (NLMSG_DONE, NLMSG_ERROR):
                return _merged(out, ingress)
            off += (ln + 3) & ~3
    return _merged(out, ingress)


def _merged(root: dict[int, dict], ingress: dict[int, dict]) -> dict[int, dict]:
    """Ingress / clsact qdiscs: packets policed on the way in count as drops too."""
    for i, q in ingress.items():
        r = root.setdefault(i, {"kind": ""})
        for k in ("drops", "overlimits"):
            r[k] = r.get(k, 0) + q.get(k, 0)
    return root


def dump_raw(sock: socket.socket, seq: int) -> list[bytes]:
    """The datagrams of one qdisc dump, unparsed."""
    req = _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    sock.send(_NLMSG.pack(_NLMSG.size + len(req), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP,
                          seq, 0) + req)
    chunks = []
    for _ in range(64):          # a dump of a few interfaces is one or two datagrams
        buf = sock.recv(1 << 16)
        chunks.append(buf)
        if _done(buf):
            break
    return chunks


def _done(buf: bytes) -> bool:
    off = 0
    while off + _NLMSG.size <= len(buf):
        ln, typ = _NLMSG.unpack_from(buf, off)[:2]
        if typ in (NLMSG_DONE, NLMSG_ERROR) or ln < _NLMSG.size:
            return True
        off += (ln + 3) & ~3
    return False


class QdiscProbe(Probe):
    """``network.<iface>.qdisc_*`` for every interface but loopback (root qdisc)."""

    name = "netlink.qdisc"
    interval_s = 0.5

    def __init__(self) -> None:
        super().__init__()
        self.sock: socket.socket | None = None
        self.seq = 0
        self.ifaces: list[tuple[int, str]] = []

    def open(self) -> None:
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                      socket.NETLINK_ROUTE)
            self.sock.settimeout(0.5)
            self.sock.bind((0, 0))
            found = self._dump()
        except (OSError, AttributeError) as e:
            self.close()
            self._unavailable(f"rtnetlink qdisc dump failed: {e}")
            return
        names = dict(socket.if_nameindex())
        self.ifaces = [(i, names[i]) for i in sorted(found) if names.get(i, "lo") != "lo"]
        if not self.ifaces:
            self.close()
            self._unavailable("no interface with a qdisc")
            return
        self._ready([ChannelMeta(f"network.{n}.{f}", "packets" if f != "qdisc_backlog"
                                 else "bytes", kind, self.name)
                     for _, n in self.ifaces for f, kind in FIELDS])

    def _dump(self) -> dict[int, dict]:
        return parse_dump(self._dump_raw())

    def _dump_raw(self) -> list[bytes]:
        if self.sock is None:
            raise OSError("not open")
        self.seq += 1
        return dump_raw(self.sock, self.seq)

    def sample(self) -> list[float]:
        return self.parse_raw(self.read_raw())

    def read_raw(self) -> list[bytes] | None:
        try:
            return self._dump_raw()
        except OSError:
            return None

    def parse_raw(self, raw: list[bytes] | None) -> list[float]:
        if raw is None:
            return [NAN] * len(self.channels)
        got = parse_dump(raw)
        out: list[float] = []
        for i, _ in self.ifaces:
            q = got.get(i)
            out += ([float(q.get(f.split("_", 1)[1], NAN)) for f, _ in FIELDS] if q
                    else [NAN] * len(FIELDS))
        return out

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None


def qdisc_probes() -> list[Probe]:
    return [QdiscProbe()] if hasattr(socket, "AF_NETLINK") and os.name == "posix" else []
