"""Host probes from procfs: per-core CPU, memory, vmstat, disks, network interfaces, TCP/IP
counters, load and process counts.  Each reads one file with one ``pread`` per sample.

Sampling schedule: /proc/stat, /proc/net/dev and PSI are read every tick (100 ms); the slower
sources set ``interval_s = 1.0`` and are read once a second (see ``Probe.interval_s``).  At
10 Hz a Python collector pays ~130 µs per wake-up in this class of VM before reading anything,
and each procfs read costs 25-70 µs of kernel time, so reading all eleven files every tick
would cost ~0.7 % of a core instead of ~0.4 %.
"""
from __future__ import annotations

import os
from typing import Callable

from ..types import ChannelMeta
from .probe import Probe, TokenFile

PROC = os.environ.get("REVEAL_PROC", "/proc")

CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest",
              "guest_nice")


class TokenFileProbe(Probe):
    """A probe backed by one :class:`TokenFile`; subclasses give the path, layout and metadata."""

    path = ""
    bufsize = 1 << 14

    def layout(self, toks: list[bytes]) -> list[tuple[int, str]]:
        raise NotImplementedError

    def meta(self, key: str) -> ChannelMeta:
        raise NotImplementedError

    transform: Callable[[bytes], bytes] | None = None

    def open(self) -> None:
        try:
            self.file = TokenFile(os.path.join(PROC, self.path), self.layout, self.transform,
                                  self.bufsize)
        except OSError as e:
            self._unavailable(f"cannot read {os.path.join(PROC, self.path)}: {e.strerror}")
            return
        if not self.file.keys:
            self._unavailable(f"{os.path.join(PROC, self.path)} holds no values to sample")
            return
        self._ready([self.meta(k) for k in self.file.keys])

    def sample(self) -> list[float]:
        return self.parse_raw(self.read_raw())

    def read_raw(self) -> bytes:
        return self.file.raw()

    def parse_raw(self, raw: bytes) -> list[float]:
        return self.file.parse(raw)

    def close(self) -> None:
        if getattr(self, "file", None):
            self.file.close()


class CpuStatProbe(TokenFileProbe):
    """/proc/stat: per-core and total CPU time by state (ticks), context switches, interrupts,
    forks, runnable and blocked task counts."""

    name = "procfs.stat"
    path = "stat"

    def __init__(self, cpus: list[int] | None = None):
        """``cpus``: the node's CPU set (:mod:`.cpuset`); only those cores are read and
        ``cpu.all.*`` becomes their sum, so a neighbour node's cores never count here."""
        super().__init__()
        self.cpus = sorted(set(cpus)) if cpus else None
        self._sum: list[list[int]] = []   # per cpu.all.<field>: positions of its core values

    def open(self) -> None:
        super().open()
        if not self.available or self.cpus is None:
            return
        keys = self.file.keys
        seen = {int(k.split(".")[1][4:]) for k in keys if k.startswith("cpu.core")}
        missing = [c for c in self.cpus if c not in seen]
        if missing:
            self.close()
            self._unavailable(f"cpus {missing} not in {os.path.join(PROC, self.path)}")
            return
        self._sum = []
        extra = []
        for f in CPU_FIELDS:
            pos = [i for i, k in enumerate(keys)
                   if k.startswith("cpu.core") and k.endswith("." + f)]
            if pos:
                self._sum.append(pos)
                extra.append(self.meta(f"cpu.all.{f}"))
        self.channels = self.channels + extra

    def parse_raw(self, raw: bytes) -> list[float]:
        vals = self.file.parse(raw)
        if self._sum:
            vals += [sum(vals[i] for i in pos) for pos in self._sum]
        return vals

    @staticmethod
    def transform(data: bytes) -> bytes:
        """Keep only the total of the ``intr`` line: its hundreds of per-IRQ counts would
        triple the cost of splitting the file."""
        i = data.find(b"\nintr ")
        if i < 0:
            return data
        j = data.find(b" ", i + 6)
        k = data.find(b"\n", i + 1)
        return data[:j] + data[k:] if j > 0 and k > j else data

    def layout(self, toks):
        out = []
        for i, tok in enumerate(toks):
            if tok.startswith(b"cpu"):
                who = "all" if tok == b"cpu" else "core" + tok[3:].decode()
                if self.cpus is not None and (who == "all" or int(tok[3:]) not in self.cpus):
                    continue   # cpu.all.* is summed over the node's cores in sample()
                for j, f in enumerate(CPU_FIELDS):
                    if i + 1 + j < len(toks) and toks[i + 1 + j].isdigit():
                        out.append((i + 1 + j, f"cpu.{who}.{f}"))
            elif tok in (b"ctxt", b"processes", b"procs_running", b"procs_blocked", b"intr"):
                out.append((i + 1, {b"ctxt": "system.ctxt", b"processes": "system.forks",
                                    b"procs_running": "cpu.procs_running",
                                    b"procs_blocked": "storage.procs_blocked",
                                    b"intr": "system.intr"}[tok]))
        return out

    def meta(self, key):
        if key.startswith("cpu.") and key.count(".") == 2 and key != "cpu.procs_running":
            return ChannelMeta(key, "ticks", "counter", self.name,
                               "CPU time in this state (USER_HZ ticks)")
        if key in ("cpu.procs_running", "storage.procs_blocked"):
            return ChannelMeta(key, "tasks", "gauge", self.name,
                               "runnable tasks (run queue)" if "running" in key
                               else "tasks blocked in uninterruptible (I/O) wait")
        return ChannelMeta(key, "count", "counter", self.name)


class MeminfoProbe(TokenFileProbe):
    """/proc/meminfo: every field, in kB (page counts for HugePages_*)."""

    name = "procfs.meminfo"
    path = "meminfo"
    interval_s = 1.0   # memory levels move over seconds; PSI memory (10 Hz) catches stalls

    def layout(self, toks):
        return [(i + 1, "memory." + t[:-1].decode().replace("(", "_").replace(")", ""))
                for i, t in enumerate(toks) if t.endswith(b":")]

    def meta(self, key):
        unit = "pages" if "HugePages_" in key else "kB"
        return ChannelMeta(key, unit, "gauge", self.name)


# The vmstat/netstat fields that tell about paging, reclaim, swapping, faults, NUMA and TCP loss.
# The files hold ~200 and ~150 mostly idle fields; sampling only these keeps the 10 Hz cost low.
VMSTAT_PREFIXES = (b"pgpg", b"pswp", b"pgfault", b"pgmajfault", b"pgscan_", b"pgsteal_",
                   b"allocstall", b"compact_stall", b"oom_kill", b"workingset_refault",
                   b"thp_fault_alloc", b"numa_hit", b"numa_miss", b"numa_foreign",
                   b"nr_dirty", b"nr_writeback", b"nr_free_pages", b"pgrefill", b"drop_",
                   b"nr_dirtied", b"nr_written")
#: ``nr_*`` fields that count events since boot (the others are gauges of pages now).
VMSTAT_NR_COUNTERS = ("nr_dirtied", "nr_written")
NETSTAT_KEEP = {"TCPTimeouts", "TCPLostRetransmit", "TCPFastRetrans", "TCPSlowStartRetrans",
                "TCPRetransFail", "TCPSynRetrans", "ListenDrops", "ListenOverflows",
                "TCPBacklogDrop", "TCPRcvQDrop", "TCPZeroWindowDrop", "TCPOFOQueue",
                "DelayedACKs", "TCPSpuriousRTOs", "TCPAbortOnTimeout", "PruneCalled", "RcvPruned",
                "TCPMemoryPressures", "TCPLossProbes", "TCPDSACKRecv", "InOctets", "OutOctets",
                "InNoRoutes", "InDiscards", "InCsumErrors"}


class VmstatProbe(TokenFileProbe):
    """/proc/vmstat: paging, swapping, reclaim and fault counters (``nr_*`` are gauges)."""

    name = "procfs.vmstat"
    path = "vmstat"
    interval_s = 1.0   # ~45 µs of kernel time per read; paging trends need no 10 Hz

    def layout(self, toks):
        return [(i + 1, "memory.vm." + toks[i].decode()) for i in range(0, len(toks) - 1, 2)
                if toks[i].startswith(VMSTAT_PREFIXES)]

    def meta(self, key):
        k = key.rsplit(".", 1)[1]
        gauge = (k.startswith("nr_") and k not in VMSTAT_NR_COUNTERS
                 and not k.startswith("nr_unaccepted") or k.endswith("_high"))
        return ChannelMeta(key, "pages" if gauge else "count", "gauge" if gauge else "counter",
                           self.name)


DISK_FIELDS = ("reads", "reads_merged", "read_sectors", "read_ms", "writes", "writes_merged",
               "write_sectors", "write_ms", "in_flight", "io_ms", "weighted_io_ms",
               "discards", "discards_merged", "discard_sectors", "discard_ms", "flushes",
               "flush_ms")
DISK_SKIP = ("loop", "ram", "zram", "sr", "fd")


class DiskstatsProbe(TokenFileProbe):
    """/proc/diskstats: per block device I/O counts, sectors, time spent, queue depth."""

    name = "procfs.diskstats"
    path = "diskstats"
    interval_s = 1.0   # per-second I/O rates suffice; PSI io and procs_blocked stay at 10 Hz

    def layout(self, toks):
        out = []
        # Lines are "major minor name f1..fN"; N is 11, 15 or 17 depending on the kernel.
        # Find line starts as positions where tokens i, i+1 are digits and i+2 is a name.
        i = 0
        n = len(toks)
        while i + 3 < n:
            name = toks[i + 2].decode()
            j = i + 3
            while j < n and toks[j].isdigit() and not (
                    j + 2 < n and toks[j + 1].isdigit() and not toks[j + 2].isdigit()
                    and j - i - 3 >= 11):
                j += 1
            nfields = j - (i + 3)
            if nfields < 11:
                break
            if not name.startswith(DISK_SKIP):
                for k in range(min(nfields, len(DISK_FIELDS))):
                    out.append((i + 3 + k, f"storage.{name}.{DISK_FIELDS[k]}"))
            i = j
        return out

    def meta(self, key):
        f = key.rsplit(".", 1)[1]
        if f == "in_flight":
            return ChannelMeta(key, "requests", "gauge", self.name, "I/Os in flight")
        unit = "ms" if f.endswith("_ms") else ("sectors" if f.endswith("sectors") else "count")
        return ChannelMeta(key, unit, "counter", self.name)


NETDEV_FIELDS = ("rx_bytes", "rx_packets", "rx_errs", "rx_drop", "rx_fifo", "rx_frame",
                 "rx_compressed", "rx_multicast", "tx_bytes", "tx_packets", "tx_errs", "tx_drop",
                 "tx_fifo", "tx_colls", "tx_carrier", "tx_compressed")


class NetDevProbe(TokenFileProbe):
    """/proc/net/dev: per interface bytes, packets, errors and drops."""

    name = "procfs.netdev"
    path = "net/dev"

    @staticmethod
    def transform(data: bytes) -> bytes:  # "eth0:123" has no space on some kernels
        return data.replace(b":", b": ")

    def layout(self, toks):
        out = []
        for i, t in enumerate(toks):
            if t.endswith(b":") and i + 16 < len(toks):
                name = t[:-1].decode()
                for k, f in enumerate(NETDEV_FIELDS):
                    out.append((i + 1 + k, f"network.{name}.{f}"))
        return out

    def meta(self, key):
        f = key.rsplit(".", 1)[1]
        return ChannelMeta(key, "bytes" if f.endswith("bytes") else "count", "counter",
                           self.name)


SNMP_GAUGES = {"Forwarding", "DefaultTTL", "RtoAlgorithm", "RtoMin", "RtoMax", "MaxConn",
               "CurrEstab"}
SNMP_KEEP = {"Ip", "Tcp", "Udp", "TcpExt", "IpExt", "Icmp"}


class _PairedHeaderProbe(TokenFileProbe):
    """Files made of "Proto: name name ..." / "Proto: value value ..." line pairs."""

    bufsize = 1 << 15

    def layout(self, toks):
        out = []
        # Walk tokens; a prefix token like b"Tcp:" starts a header or a value line.
        starts = [i for i, t in enumerate(toks) if t.endswith(b":")]
        k = 0
        while k + 1 < len(starts):
            h, v = starts[k], starts[k + 1]
            if toks[h] == toks[v]:
                proto = toks[h][:-1].decode()
                end = starts[k + 2] if k + 2 < len(starts) else len(toks)
                names = toks[h + 1:v]
                if proto in SNMP_KEEP:
                    for n, name in enumerate(names):
                        if v + 1 + n < end and self.keep(name.decode()):
                            out.append((v + 1 + n, f"network.{proto.lower()}.{name.decode()}"))
                k += 2
            else:
                k += 1
        return out

    def keep(self, name: str) -> bool:
        return True

    def meta(self, key):
        f = key.rsplit(".", 1)[1]
        if f in SNMP_GAUGES:
            return ChannelMeta(key, "count", "gauge", self.name)
        return ChannelMeta(key, "count", "counter", self.name)


class SnmpProbe(_PairedHeaderProbe):
    """/proc/net/snmp: IP, TCP (incl. RetransSegs), UDP, ICMP counters."""

    name = "procfs.snmp"
    path = "net/snmp"
    interval_s = 1.0   # TCP/IP totals: retransmit bursts show at 1 Hz (netdev stays at 10 Hz)


class NetstatProbe(_PairedHeaderProbe):
    """/proc/net/netstat: TcpExt (timeouts, retransmit kinds, drops) and IpExt counters."""

    name = "procfs.netstat"
    path = "net/netstat"
    interval_s = 1.0   # the costliest file (~70 µs of kernel time per read)

    def keep(self, name: str) -> bool:
        return name in NETSTAT_KEEP


class LoadavgProbe(TokenFileProbe):
    """/proc/loadavg: load averages and process/thread counts."""

    name = "procfs.loadavg"
    path = "loadavg"
    interval_s = 1.0   # the kernel recomputes load averages every 5 s

    @staticmethod
    def transform(data: bytes) -> bytes:
        return data.replace(b"/", b" ")

    def layout(self, toks):
        keys = ["cpu.load1", "cpu.load5", "cpu.load15", "system.nr_running", "system.nr_threads"]
        return list(zip(range(len(keys)), keys)) if len(toks) >= 5 else []

    def meta(self, key):
        return ChannelMeta(key, "tasks", "gauge", self.name)


PROCFS_PROBES = (CpuStatProbe, MeminfoProbe, VmstatProbe, DiskstatsProbe, NetDevProbe, SnmpProbe,
                 NetstatProbe, LoadavgProbe)
