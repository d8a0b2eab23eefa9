"""Built-in remediation hint rules.

Every rule is its own implementation of the ``reveal_hints`` hook (pluggy ``specname``), so a
site adds rules exactly the same way: a plugin module with ``@hookimpl def reveal_hints(anomaly,
context)`` returning ``[{"title", "why", "action", "severity"}]`` or ``[]``.

``context`` (built by the pipeline for each anomaly):

* ``channels``: ``{name: {"baseline", "observed", "deviation", "unit"}}`` for every analysed
  channel over the anomaly (deviation in robust-spread units, signed);
* ``meta``: the run's ``meta.json``; ``impact``: iteration-time impact if markers exist;
* ``facts``: static facts about the node (from ``meta["facts"]``: cores, PCIe max link ...).

The fallback rules (``trylast``) return a hint marked ``"fallback": True``; the pipeline drops
fallbacks when a specific rule fired.
"""
from __future__ import annotations

import re
from typing import Any

from ...hooks.hookspec import hookimpl

Ctx = dict[str, Any]


def _moved(ctx: Ctx, pattern: str, min_dev: float = 3.0, sign: int = 0) -> list[tuple[str, dict]]:
    """Channels matching ``pattern`` whose deviation is at least ``min_dev`` (``sign`` +1 = up,
    -1 = down, 0 = either), strongest first."""
    rx = re.compile(pattern)
    out = []
    for name, c in (ctx.get("channels") or {}).items():
        d = c.get("deviation") or 0.0
        if not rx.search(name):
            continue
        if (sign > 0 and d >= min_dev) or (sign < 0 and d <= -min_dev) or \
                (sign == 0 and abs(d) >= min_dev):
            out.append((name, c))
    out.sort(key=lambda x: -abs(x[1].get("deviation") or 0.0))
    return out


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "?"
    v = float(v)
    u = unit or ""
    if u in ("B/s", "bytes/s"):
        return f"{v / 1048576:.1f} MiB/s"
    if u in ("kB", "kiB"):
        return f"{v / 1048576:.2f} GiB"
    if u.startswith("us/s"):
        return f"{v / 1e4:.0f}% of the time"
    if u == "%":
        return f"{v:.0f}%"
    a = abs(v)
    s = f"{v:.0f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"
    return f"{s} {u}".strip()


def _change(name: str, c: dict) -> str:
    u = c.get("unit", "")
    return f"{name} {_fmt(c.get('baseline'), u)} -> {_fmt(c.get('observed'), u)}"


def _severity(anomaly: dict, ctx: Ctx, base: str = "warning") -> str:
    imp = (ctx.get("impact") or {}).get("iteration_time_pct")
    if imp is not None and imp >= 30:
        return "critical"
    if imp is not None and imp < 3 and base == "warning":
        return "info"
    return base


_RULE_SUBSYSTEM = {"cpu_contention": "cpu", "cpu_steal": "cpu", "cpu_frequency": "cpu",
                   "memory_pressure": "memory", "memory_bandwidth": "memory",
                   "storage_stall": "storage", "network_degradation": "network",
                   "network_errors": "network", "network_shaped": "network",
                   "gpu_throttling": "gpu", "gpu_pcie_link": "gpu",
                   "gpu_ecc_xid": "gpu", "gpu_nvlink": "gpu", "gpu_lost": "gpu",
                   "gpu_foreign": "gpu", "gpu_input_bound": "cpu"}


def _hint(title: str, why: str, action: str, severity: str, rule: str, **extra: Any) -> dict:
    h = {"title": title, "why": why, "action": action, "severity": severity, "rule": rule,
         **extra}
    if rule in _RULE_SUBSYSTEM:
        h["subsystem"] = _RULE_SUBSYSTEM[rule]
    return h


def _impact_text(ctx: Ctx) -> str:
    imp = ctx.get("impact")
    return f" Measured effect: {imp['text']}." if imp and imp.get("text") else ""


# -- foreign load (any subsystem) -------------------------------------------------------------

_FOREIGN_WHAT = {
    "cpu.foreign.cores": ("used {v} of CPU", "cores"),
    "memory.foreign.used": ("held {v} of memory", "bytes"),
    "memory.foreign.cache_growth": ("filled the page cache at {v}", "bytes/s"),
    "storage.foreign.read_bytes": ("read {v} from the disks", "bytes/s"),
    "storage.foreign.write_bytes": ("wrote {v} to the disks", "bytes/s"),
    "storage.foreign.dirtied_bytes": ("wrote {v} into files that the page cache did not keep "
                                      "(rewritten, or deleted before reaching the disk)",
                                      "bytes/s"),
}


def _amount(v: float, unit: str) -> str:
    if unit == "cores":
        return f"{v:.2f} core{'s' if abs(v) >= 1.995 else ''}"
    if unit == "bytes":
        return f"{v / 1048576:.0f} MiB"
    return f"{v / 1048576:.1f} MiB/s"


@hookimpl(specname="reveal_hints")
def foreign_load(anomaly: dict, context: Ctx) -> list[dict]:
    """Processes outside the run took CPU, memory or I/O while it ran."""
    fo = context.get("foreign") or anomaly.get("foreign")
    if not fo or not fo.get("support"):
        return []
    parts = []
    for f in fo["support"][:3]:
        what, unit = _FOREIGN_WHAT.get(f["channel"], ("moved {v}", ""))
        if f.get("absolute") or f.get("since_start"):
            # the run's own level is no "before" when the neighbour was there all along
            lvl = f" (clean runs stay below {_amount(f['level'], unit)})" if f.get("level") \
                else ""
            parts.append(what.format(v=_amount(f["observed"], unit)) + (
                ", present from the start of the run" if f.get("since_start") else "") + lvl)
        else:
            parts.append(what.format(v=_amount(f["observed"] - f["baseline"], unit)) +
                         f" more than usual ({_amount(f['baseline'], unit)} before)")
    ch = context.get("channels") or {}
    sys_c, usr_c = (ch.get("cpu.foreign.system_cores") or {}), (ch.get("cpu.foreign.user_cores")
                                                              or {})
    if sys_c.get("observed") is not None and usr_c.get("observed") is not None:
        d_sys = sys_c["observed"] - (sys_c.get("baseline") or 0.0)
        d_usr = usr_c["observed"] - (usr_c.get("baseline") or 0.0)
        if d_sys > 0.2 and d_sys > d_usr:   # the neighbour lives in the kernel
            parts.append(f"mostly in the kernel ({d_sys:.2f} cores of system time: a process "
                         "making system calls at a high rate -- file create/stat/unlink "
                         "storms, small I/O, network or page-fault churn)")
    others = fo.get("other_runs") or []
    if others:
        names = ", ".join(f"job {o['job_id']}" if o.get("job_id") else f"run {o['run_id']}"
                          for o in others[:3])
        who = f"Another registered run on this node ({names})"
        act = ("On a shared node, request `--exclusive` (or whole-core/-socket allocations: "
               "`--cpus-per-task` with `ConstrainCores=yes`, `--mem` with `ConstrainRAMSpace=yes`"
               " in cgroup.conf) so a neighbour cannot take what your job needs; operators: "
               "check that the node's cgroup limits are enforced (`scontrol show node`, "
               "`systemd-cgls`).")
    else:
        who = "Processes in no registered run (a stray, leftover or system process)"
        act = ("On a shared node request `--exclusive`. Operators: look for leftover or system "
               "processes: `ps -eo pid,user,pcpu,rss,etime,comm --sort=-pcpu | head`, "
               "`iotop -obP`, and processes of users with no job on the node; an Epilog that "
               "kills stray user processes (`pam_slurm_adopt`, `ProctrackType=proctrack/cgroup`)"
               " keeps them from coming back.")
    sub = fo.get("subsystem") or anomaly.get("subsystem")
    h = _hint(
        "Foreign load: something outside your job competed for the node",
        f"{who} " + "; ".join(parts) + ", while your job's own use did not explain it. "
        "Whatever it takes is missing for your job." + _impact_text(context),
        act, _severity(anomaly, context), "foreign_load")
    h["subsystem"] = sub
    return [h]


# -- CPU -------------------------------------------------------------------------------------

@hookimpl(specname="reveal_hints")
def cpu_contention(anomaly: dict, context: Ctx) -> list[dict]:
    sig = (_moved(context, r"^cpu\.psi\.", 3, +1) + _moved(context, r"^cpu\.(procs_running|load)",
                                                           3, +1))
    run_down = _moved(context, r"^cpu\.run\.", 3, -1)
    if anomaly.get("subsystem") != "cpu" and not (sig and len(sig) >= 2):
        return []
    if not sig and not run_down and not _moved(context, r"^cpu\..*busy_pct$", 3, +1):
        return []
    seen = "; ".join(_change(n, c) for n, c in (sig + run_down)[:3]) or "CPU busy rose"
    return [_hint(
        "CPU contention: the job's threads wait for a core",
        f"Runnable threads exceeded the cores available ({seen}). Work that competes for the "
        "same cores (another job, a stray process, too many data-loader or OpenMP threads) "
        "stretches every step." + _impact_text(context),
        "Find the competitor: `ps -eo pid,user,pcpu,nlwp,comm --sort=-pcpu | head`, "
        "`cat /proc/pressure/cpu`. Give the job its own cores: Slurm `--exclusive` or "
        "`--cpus-per-task=N` with `TaskPlugin=task/affinity,task/cgroup` and `ConstrainCores=yes`"
        " in cgroup.conf; keep OMP_NUM_THREADS / `torch.set_num_threads()` plus DataLoader "
        "`num_workers` at or below the cores you own.",
        _severity(anomaly, context), "cpu_contention")]


@hookimpl(specname="reveal_hints")
def cpu_steal(anomaly: dict, context: Ctx) -> list[dict]:
    m = _moved(context, r"^cpu\..*steal", 3, +1)
    if not m:
        return []
    return [_hint(
        "CPU steal: the hypervisor ran other guests on this VM's vCPUs",
        f"{_change(*m[0])}. Steal time is CPU time this VM was entitled to but did not get."
        + _impact_text(context),
        "Confirm with `mpstat -P ALL 1` (%steal). Move the job to dedicated/bare-metal or a "
        "larger instance type, or ask the provider about CPU overcommit on the host.",
        _severity(anomaly, context), "cpu_steal")]


@hookimpl(specname="reveal_hints")
def cpu_frequency(anomaly: dict, context: Ctx) -> list[dict]:
    m = _moved(context, r"^cpu\..*(freq|mhz|clock)", 3, -1)
    gov = (context.get("facts") or {}).get("cpu_governor")
    if not m and gov not in ("powersave", "conservative", "schedutil"):
        return []
    why = (f"{_change(*m[0])}: the cores ran below their nominal clock." if m else
           f"The CPU frequency governor is '{gov}'.")
    return [_hint(
        "CPU frequency below nominal",
        why + " Thermal limits, power capping or a power-saving governor slow every "
        "instruction." + _impact_text(context),
        "Check `cpupower frequency-info` and `turbostat --interval 1`; set "
        "`cpupower frequency-set -g performance`; in the BIOS choose the 'Maximum Performance' "
        "power profile (disable C-states/power capping); check cooling and `dmesg | grep -i "
        "thermal`.",
        _severity(anomaly, context), "cpu_frequency")]


# -- memory ----------------------------------------------------------------------------------

@hookimpl(specname="reveal_hints")
def memory_pressure(anomaly: dict, context: Ctx) -> list[dict]:
    m = (_moved(context, r"^memory\.(run\.)?used_pct$", 3, +1)
         + _moved(context, r"^memory\.(run\.)?MemAvailable$", 3, -1)
         + _moved(context, r"^memory\.psi\.", 3, +1)
         + _moved(context, r"^memory\.(vm\.)?(pgmajfault|pswp|swap)", 3, +1)
         + _moved(context, r"^memory\.(run\.)?(rss|usage|anon)", 3, +1))
    if not m:
        return []
    swap = any(re.search(r"pswp|swap|pgmajfault", n) for n, _ in m)
    return [_hint(
        "Memory pressure" + (": the system is swapping / faulting pages in" if swap else
                             ": available memory shrank"),
        f"{'; '.join(_change(n, c) for n, c in m[:3])}. When free memory runs out the kernel "
        "reclaims page cache and swaps, stalling the job; the OOM killer may end it."
        + _impact_text(context),
        "Find the consumer: `ps -eo pid,user,rss,comm --sort=-rss | head`, `vmstat 1` (si/so),"
        " `cat /proc/pressure/memory`. Request and enforce memory per job (Slurm `--mem=`, "
        "`ConstrainRAMSpace=yes`); lower the batch size or DataLoader `num_workers` (each worker "
        "holds a copy of the dataset); look for a leak if the usage only grows.",
        _severity(anomaly, context), "memory_pressure")]


@hookimpl(specname="reveal_hints")
def memory_bandwidth(anomaly: dict, context: Ctx) -> list[dict]:
    m = _moved(context, r"(cache_miss_pct|l3_stall_ratio|llc|mem_bw|membw|dram)", 3, +1)
    ipc = _moved(context, r"\.ipc$", 3, -1)
    if not (m or ipc) and anomaly.get("subsystem") != "memory":
        return []
    if not (m or ipc):
        return []
    sig = m + ipc
    return [_hint(
        "Memory-bandwidth / cache contention",
        f"{'; '.join(_change(n, c) for n, c in sig[:3])}. A co-located memory-bound workload "
        "evicts this job's cache lines and saturates DRAM bandwidth, so each instruction waits "
        "longer." + _impact_text(context),
        "Confirm with `perf stat -e cycles,instructions,LLC-load-misses -a sleep 5`; bind the "
        "job to one NUMA node (`numactl --cpunodebind=0 --membind=0`, Slurm `--mem-bind=local "
        "--cpu-bind=cores`), run it `--exclusive`, or cap neighbours with Intel RDT "
        "(`pqos -e 'mba:1=50'`).",
        _severity(anomaly, context), "memory_bandwidth")]


# -- storage ---------------------------------------------------------------------------------

@hookimpl(specname="reveal_hints")
def storage_stall(anomaly: dict, context: Ctx) -> list[dict]:
    m = (_moved(context, r"^storage\.psi\.", 3, +1)
         + _moved(context, r"^cpu\.all\.iowait_pct$", 3, +1)
         + _moved(context, r"^storage\.procs_blocked$", 3, +1)
         + _moved(context, r"^storage\.[^.]+\.(io_ms|weighted_io_ms|read_ms|write_ms|flush_ms|"
                           r"io_ticks|time_in_queue|in_flight|await|util)", 3, +1)
         + _moved(context, r"^storage\.[^.]+\.(read|write)", 3, +1))
    if not m or (anomaly.get("subsystem") != "storage" and len(m) < 2):
        return []
    dev = sorted({n.split(".")[1] for n, _ in m if n.startswith("storage.")
                  and n.split(".")[1] not in ("psi", "all", "run", "foreign")})
    where = f" on {', '.join(dev[:3])}" if dev else ""
    return [_hint(
        f"Storage stall{where}: I/O requests queue up",
        f"{'; '.join(_change(n, c) for n, c in m[:3])}. Tasks blocked on I/O leave the job "
        "waiting for input batches or checkpoints." + _impact_text(context),
        "See who does I/O: `pidstat -d 1`, `iostat -x 1` (await, %util), "
        "`cat /proc/pressure/io`. Stage the dataset to local NVMe or `/dev/shm` before the "
        "job, raise DataLoader `num_workers`/`prefetch_factor`, write checkpoints "
        "asynchronously (`torch.distributed.checkpoint.async_save`) and less often; on Slurm "
        "use `--gres`/burst-buffer staging or a separate scratch filesystem.",
        _severity(anomaly, context), "storage_stall")]


# -- network ---------------------------------------------------------------------------------

@hookimpl(specname="reveal_hints")
def network_degradation(anomaly: dict, context: Ctx) -> list[dict]:
    retrans = _moved(context, r"^network\.tcp(ext)?\.(RetransSegs|TCPLostRetransmit|TCPTimeouts|"
                              r"TCPSynRetrans|TCPFastRetrans|TCPSlowStartRetrans|TCPLossProbes)",
                     3, +1)
    collapse = _moved(context, r"^network\.[^.]+\.(rx|tx)_(bytes|packets)$", 3, -1)
    if not (retrans or (collapse and anomaly.get("subsystem") == "network")):
        return []
    ifaces = sorted({n.split(".")[1] for n, _ in collapse if n.split(".")[1] != "lo"}) or \
        sorted({n.split(".")[1] for n, _ in collapse})
    iface = ifaces[0] if ifaces else "<iface>"
    sig = retrans + collapse
    title = ("Network slowdown: TCP retransmissions" if retrans else
             f"Network throughput collapsed on {', '.join(ifaces[:3])}")
    # the GPU idling with it is the consequence: say so, the cause is the network
    starved = _moved(context, r"^gpu\.\d+\.(util_sm|util|utilization|gpu_util|sm_active|"
                              r"power|power_usage|power_draw)$", 3, -1)
    lead = ""
    if starved:
        title = ("GPU starved while the network retransmitted" if retrans else
                 "GPU starved while the network throughput collapsed")
        lead = (f"{'; '.join(_change(n, c) for n, c in starved[:2])}: the GPU waited for "
                "data and collectives that the network delivered late. ")
    return [_hint(
        title,
        f"{lead}{'; '.join(_change(n, c) for n, c in sig[:3])}. Gradient all-reduce and data "
        "loading wait on the slowest link; retransmissions mean loss or a queue that drops."
        + _impact_text(context),
        f"Inspect the path: `ip -s link show {iface}`, `ethtool {iface}` (speed/duplex), "
        f"`ethtool -S {iface} | grep -iE 'err|drop'`, `tc qdisc show dev {iface}` (a shaper "
        "left behind?), `ss -tin` (retrans, rtt). Make collectives use the fast interface: "
        "`NCCL_SOCKET_IFNAME=<iface>` / `GLOO_SOCKET_IFNAME=<iface>`, for InfiniBand "
        "`NCCL_IB_HCA=mlx5_0`; `NCCL_DEBUG=INFO` shows the transport chosen.",
        _severity(anomaly, context), "network_degradation")]


@hookimpl(specname="reveal_hints")
def network_shaped(anomaly: dict, context: Ctx) -> list[dict]:
    """A qdisc holding the job's packets back: a shaper or policer (tbf, htb, netem, an
    ingress police) that somebody set or a site's setup left behind."""
    m = _moved(context, r"^network\.[^.]+\.qdisc_(overlimits|backlog|qlen|drops)$", 3, +1)
    if not m:
        return []
    ifaces = sorted({n.split(".")[1] for n, _ in m})
    iface = ifaces[0]
    return [_hint(
        f"Traffic shaped on {', '.join(ifaces[:3])}: its qdisc holds packets back",
        f"{'; '.join(_change(n, c) for n, c in m[:3])}. A queueing discipline with a rate "
        "limit (a tbf/htb shaper, a policer, netem) delays or drops packets before they reach "
        "the wire, so all-reduce and data loading run at its rate, not the link's."
        + _impact_text(context),
        f"`tc -s qdisc show dev {iface}` (and `tc -s filter show dev {iface} ingress`) shows "
        "the qdisc, its rate and its counters; if nobody meant it (a test left behind, a "
        f"wrong site default), remove it with `tc qdisc del dev {iface} root` and find what "
        "sets it (node image, NetworkManager/systemd-networkd, a prolog).",
        _severity(anomaly, context), "network_shaped")]


@hookimpl(specname="reveal_hints")
def network_errors(anomaly: dict, context: Ctx) -> list[dict]:
    m = [(n, c) for n, c in
         _moved(context, r"^network\..*(err|drop|symbol|link_down|discard|crc)", 2, +1)
         if ".qdisc_" not in n]      # a qdisc's drops are its shaping (network_shaped)
    if not m:
        return []
    ib = any(".ib" in n or "mlx" in n or "infiniband" in n for n, _ in m)
    action = ("`ibstat`, `perfquery -x`, `ibqueryerrors`; reseat or replace the cable/port "
              "showing symbol errors, check the switch port; drain the node if errors keep "
              "rising." if ib else
              "`ip -s link`, `ethtool -S <iface> | grep -iE 'err|drop|crc'`; check cable, "
              "transceiver and switch port; raise ring buffers (`ethtool -G`) if drops are "
              "rx_missed/fifo.")
    return [_hint(
        "Interface errors" + (" on InfiniBand" if ib else ""),
        f"{'; '.join(_change(n, c) for n, c in m[:3])}. Link errors force retransmissions "
        "and can degrade or drop the link." + _impact_text(context),
        action, "critical" if ib else _severity(anomaly, context), "network_errors")]


# -- GPU -------------------------------------------------------------------------------------
#
# GPU findings of the pipeline (:mod:`reveal_plugins.detect.evidence.gpu`: invariants, GPU peers) carry
# ``context["gpu"]``: the GPU's identity (index, uuid, pci_bus_id, name, rank), the node, and
# what it did over the finding (``capped``/``throttle`` shares of the time per clock limit,
# clocks, ``link``, error ``counts``, ``xid_last``, ``remap_*``, ``foreign``, ``lost``).  The
# detector's own anomalies have channels only; every rule reads both.

_LIMIT = {"capped_power_s": "power", "throttle_power_cap": "power",
          "capped_thermal_s": "thermal", "throttle_sw_thermal": "thermal",
          "throttle_hw_thermal": "hw_thermal", "throttle_hw_slowdown": "hw_slowdown",
          "throttle_hw_power_brake": "power_brake", "capped_board_s": "board",
          "capped_reliability_s": "reliability"}
_LIMIT_TEXT = {"power": "the power cap", "thermal": "the thermal limit",
               "hw_thermal": "hardware thermal slowdown", "hw_slowdown": "hardware slowdown",
               "power_brake": "the hardware power brake", "board": "a board limit",
               "reliability": "the reliability (voltage) limit"}
_LIMIT_KIND = {"power": "power cap", "thermal": "thermal", "hw_thermal": "thermal",
               "hw_slowdown": "hardware slowdown", "power_brake": "hardware slowdown",
               "board": "board limit", "reliability": "reliability limit"}
#: XID codes: what they mean and whether the application usually caused them.
_XID = {13: ("graphics engine exception", True), 31: ("GPU memory page fault", True),
        43: ("GPU stopped processing after an application fault", True),
        45: ("preemptive cleanup after an earlier error", True),
        48: ("double-bit ECC error", False), 61: ("internal micro-controller breakpoint", False),
        62: ("internal micro-controller halt", False),
        63: ("row remapping / page retirement event", False),
        64: ("row remapping failure", False), 74: ("NVLink error", False),
        79: ("GPU has fallen off the bus", False), 92: ("high single-bit ECC error rate", False),
        94: ("contained uncorrectable ECC error", False),
        95: ("uncontained uncorrectable ECC error", False), 119: ("GSP RPC timeout", False),
        120: ("GSP error", False)}


def _gpu(anomaly: dict, ctx: Ctx, chans: list[str] = ()) -> dict:
    """The finding's GPU: identity and facts (context, else the anomaly's ``gpu``, else the
    index in its channel names), with ``label`` and ``sel`` (what ``nvidia-smi -i`` takes)."""
    g = dict(ctx.get("gpu") or {})
    ident = anomaly.get("gpu")
    if isinstance(ident, dict):
        for k, v in ident.items():
            g.setdefault(k, v)
    if g.get("index") is None:
        for n in list(chans) + [e.get("channel", "") for e in anomaly.get("evidence") or []]:
            m = re.match(r"^gpu\.(\d+)\.", str(n))
            if m:
                g["index"] = int(m.group(1))
                break
    i = g.get("index")
    extra = [f"rank {g['rank']}"] if g.get("rank") is not None else []
    extra += [str(g[k]) for k in ("uuid",) if g.get(k)]
    g["label"] = (f"GPU {i}" if i is not None else "the GPU") + (
        f" ({', '.join(extra)})" if extra else "")
    g["sel"] = str(g.get("uuid") or (i if i is not None else "<gpu>"))
    g["node"] = g.get("node") or anomaly.get("node") or "<node>"
    return g


def _drain(g: dict, reason: str) -> str:
    i = g.get("index")
    what = f"gpu{i} {reason}" if i is not None else f"gpu {reason}"
    return f"`scontrol update nodename={g['node']} state=drain reason=\"{what}\"`"


def _about(anomaly: dict, pattern: str) -> bool:
    """The finding's evidence (or its invariant) is about channels matching ``pattern``: the
    facts in ``context["gpu"]`` describe the whole GPU, so a rule speaks from them only when
    the finding is about what the rule covers."""
    rx = re.compile(pattern)
    return any(rx.search(str(e.get("channel", ""))) for e in anomaly.get("evidence") or [])


def _secs(x: float) -> str:
    return f"{x:.0f} s" if x < 120 else f"{x / 60:.1f} min"


@hookimpl(specname="reveal_hints")
def gpu_throttling(anomaly: dict, context: Ctx) -> list[dict]:
    """Clocks held below their maximum: by which limit, for how much of the time."""
    m_flag = _moved(context, r"^gpu\.\d+\.(throttle|clocks_event)_(?!idle|sync_boost)", 2, +1)
    m_cap = _moved(context, r"^gpu\.\d+\.capped_(power|thermal|board|reliability)_s$", 2, +1)
    m_clock = _moved(context, r"^gpu\.\d+\..*(sm_clock_pct_of_max|clock_sm|sm_clock)", 3, -1)
    m_temp = _moved(context, r"^gpu\.\d+\..*(temp)", 3, +1)
    g = _gpu(anomaly, context, [n for n, _ in m_flag + m_cap + m_clock + m_temp])
    shares: dict[str, float] = {}
    source = "clock-event flags"
    if _about(anomaly, r"\.(throttle_|capped_|clock_sm|sm_clock|temp|power)"):
        if g.get("capped"):
            shares = {k: f for k, f in g["capped"].items() if f >= 0.05}
            source = "NVML violation counters"
        for k, f in (g.get("throttle") or {}).items():
            if f >= 0.05:
                shares.setdefault(k, f)
    for n, c in m_cap + m_flag:
        k = _LIMIT.get(n.split(".", 2)[2])
        if k and c.get("observed") is not None:
            shares.setdefault(k, max(0.0, min(1.0, float(c["observed"]))))
    if not (shares or m_clock or m_temp):
        return []
    dur = max(float(anomaly.get("end", 0)) - float(anomaly.get("start", 0)), 0.0)
    order = sorted(shares.items(), key=lambda kv: -kv[1])
    main = order[0][0] if order else ("thermal" if m_temp else None)
    kind = _LIMIT_KIND.get(main, "clocks below max") if main else "clocks below max"
    held = "; ".join(
        f"held down by {_LIMIT_TEXT[k]} {100 * f:.0f}% of the time"
        + (f" ({_secs(f * dur)} of {_secs(dur)})" if dur > 0 else "") for k, f in order[:3])
    seen = []
    if g.get("clock_sm") is not None and g.get("clock_sm_max"):
        seen.append(f"SM clock {g['clock_sm']:.0f} MHz of its maximum {g['clock_sm_max']:.0f} "
                    f"MHz ({100 * g['clock_sm'] / g['clock_sm_max']:.0f}%)")
    seen += [_change(n, c) for n, c in ((m_temp if seen else m_clock + m_temp))[:2]]
    what = f"{g['label']}: " + "; ".join(x for x in [held] + seen if x)
    if held:
        what += f" (from the {source})"
    acts = [f"`nvidia-smi -q -d PERFORMANCE,CLOCK -i {g['sel']}` lists the active clock-event "
            "reasons and the clocks against their maximum."]
    if kind == "power cap":
        acts.append(f"Power cap: `nvidia-smi -q -d POWER -i {g['sel']}` shows the enforced, "
                    "default and maximum limits; a limit lowered by an admin, a DCGM/site power "
                    "policy or a rack/PSU cap holds the GPU back -- restore the default "
                    "(`nvidia-smi -pl <default W>`, root) or fix the policy. A GPU that needs "
                    "more power than its siblings for the same clocks runs hot: check its "
                    "cooling too.")
    elif kind == "thermal":
        acts.append(f"Thermal: `nvidia-smi -q -d TEMPERATURE -i {g['sel']}` (GPU and HBM "
                    "against the slowdown thresholds); check fans, airflow, inlet temperature, "
                    "blanking panels and the heatsink -- one hot GPU of a node is often a "
                    "failed fan or a blocked duct.")
    elif kind in ("hardware slowdown", "board limit", "reliability limit"):
        acts.append("Hardware slowdown / board limits are asserted by the board or an external "
                    "signal (PSU, over-current, the BMC): read the BMC event log "
                    "(`ipmitool sel list`) and run the vendor diagnostics (`dcgmi diag -r 3`).")
    acts.append(f"If it persists, drain the node: {_drain(g, kind.replace(' ', '-'))}, fix it, "
                "then `state=resume`.")
    return [_hint(
        f"GPU clocks throttled ({kind})",
        f"{what}. A throttled GPU runs every kernel slower and, in data-parallel training, "
        "holds every rank to its pace." + _impact_text(context),
        " ".join(acts), _severity(anomaly, context), "gpu_throttling")]


@hookimpl(specname="reveal_hints")
def gpu_pcie_link(anomaly: dict, context: Ctx) -> list[dict]:
    """The PCIe link below its maximum generation/width under load, and replays."""
    chans = context.get("channels") or {}
    bad = []
    for n, c in chans.items():
        mm = re.match(r"^(gpu\.\d+)\.pcie_link_(gen|width)$", n)
        if not mm:
            continue
        mx = chans.get(f"{mm.group(1)}.pcie_link_{mm.group(2)}_max")
        if mx and c.get("observed") is not None and mx.get("observed") is not None \
                and c["observed"] < mx["observed"] - 0.25:
            bad.append(f"{n} {c['observed']:.0f} < max {mx['observed']:.0f}")
    g = _gpu(anomaly, context, [b.split()[0] for b in bad])
    about = _about(anomaly, r"\.pcie_(link|replay)")
    link = g.get("link") or {}
    if about and not bad:
        for w in ("gen", "width"):
            if link.get(w) is not None and link.get(f"{w}_max") is not None \
                    and link[w] < link[f"{w}_max"]:
                bad.append(f"PCIe link {w} {link[w]:g} < max {link[f'{w}_max']:g}")
    replays = (g.get("counts") or {}).get("pcie_replay", 0.0) if about else 0.0
    rep_m = _moved(context, r"^gpu\.\d+\.pcie_replay$", 2, +1)
    if not bad and not replays and not rep_m:
        return []
    seen = list(bad[:2])
    if replays:
        seen.append(f"{replays:.0f} PCIe replays")
    elif rep_m:
        seen.append(_change(*rep_m[0]))
    bus = str(g.get("pci_bus_id") or "")
    lspci = f"`lspci -vv -s {bus[-12:]} | grep -E 'LnkCap|LnkSta'`" if bus else \
        "`lspci -vv | grep -E 'LnkCap|LnkSta'`"
    title = ("GPU PCIe link below its maximum generation/width" if bad else
             "GPU PCIe replays: link errors retried")
    return [_hint(
        title,
        f"{g['label']}: {'; '.join(seen)} while the GPU was busy. A downtrained link cuts "
        "host<->GPU bandwidth (data loading, checkpoints, NCCL over PCIe)"
        + ("; replays are transfers resent after bit errors on the link." if
           replays or rep_m else ".") + _impact_text(context),
        f"Under load a healthy link runs at its maximum (it only drops speed when idle): "
        f"confirm with `nvidia-smi -q -i {g['sel']} | grep -A12 'GPU Link Info'` (current vs "
        f"max, replays) and {lspci}. Reseat the GPU, its riser or cable and check the slot is "
        "set to its generation (not Auto/Gen1) in the BIOS; if the link stays downtrained or "
        f"replays keep rising, drain the node ({_drain(g, 'pcie-link')}) and RMA the GPU or "
        "riser.",
        "warning", "gpu_pcie_link")]


@hookimpl(specname="reveal_hints")
def gpu_nvlink(anomaly: dict, context: Ctx) -> list[dict]:
    """NVLink CRC, replay or recovery errors."""
    m = _moved(context, r"^gpu\.\d+\.nvlink_\w+_errors$", 1, +1)
    g = _gpu(anomaly, context, [n for n, _ in m])
    counts = {k: v for k, v in (g.get("counts") or {}).items()
              if k.startswith("nvlink_") and v > 0} if _about(anomaly, r"\.nvlink_\w+_errors") \
        else {}
    if not m and not counts:
        return []
    seen = [f"{k} {v:.0f}" for k, v in counts.items()] or [_change(n, c) for n, c in m[:3]]
    recov = any("recovery" in k for k in counts) or any("recovery" in n for n, _ in m)
    return [_hint(
        "GPU NVLink errors",
        f"{g['label']}: {'; '.join(seen)}. CRC errors and replays are resent at the link layer "
        "(bandwidth lost on every all-reduce); a recovery retrains the link and can stall or "
        "fail NCCL collectives." + _impact_text(context),
        f"`nvidia-smi nvlink -e -i {g['sel']}` (error counters per link), `nvidia-smi nvlink -s "
        f"-i {g['sel']}` (link state and speed), `nvidia-smi topo -m`; if the counters keep "
        f"rising or a link recovers, drain the node ({_drain(g, 'nvlink-errors')}), run "
        "`dcgmi diag -r 3`, reseat the NVLink bridge or have the vendor check the baseboard/"
        "NVSwitch, and RMA on recurrence.",
        "critical" if recov else "warning", "gpu_nvlink")]


@hookimpl(specname="reveal_hints")
def gpu_ecc_xid(anomaly: dict, context: Ctx) -> list[dict]:
    """Uncorrected ECC, XIDs, a pending or failed row remap: the GPU's memory or state is
    not to be trusted."""
    m = _moved(context, r"^gpu\.\d+\..*(ecc|xid|retired|remapped|remap_)", 1, +1)
    g = _gpu(anomaly, context, [n for n, _ in m])
    about = _about(anomaly, r"\.(ecc_|xid_|remap_|retired_)")
    cnt = g.get("counts") or {}
    leafs = {n.split(".", 2)[2]: c for n, c in m}
    failure = (about and g.get("remap_failure")) or "remap_failure" in leafs
    pending = (about and (g.get("remap_pending") or g.get("retired_pages_pending"))) or \
        "remap_pending" in leafs or "retired_pages_pending" in leafs
    ecc = (about and cnt.get("ecc_uncorrected", 0) > 0) or "ecc_uncorrected" in leafs
    xid_n = cnt.get("xid_events", 0) if about else 0
    xid = xid_n > 0 or "xid_events" in leafs
    code = g.get("xid_last") if about else None
    if code is None and "xid_last" in leafs and leafs["xid_last"].get("observed"):
        code = int(leafs["xid_last"]["observed"])
    if not (failure or pending or ecc or xid or m):
        return []
    out = []
    if failure:
        out.append(_hint(
            "GPU row remapping failed: replace the GPU",
            f"{g['label']}: remap_failure is set -- an uncorrectable memory row could not be "
            "remapped, so the GPU's memory can return wrong data and the failure does not go "
            "away with a reset.",
            f"Drain the node now ({_drain(g, 'row-remap-failure')}); confirm with `nvidia-smi "
            f"-q -d ROW_REMAPPER -i {g['sel']}` ('Remapping Failure Occurred: Yes'); collect "
            "`nvidia-bug-report.sh` and RMA the GPU.",
            "critical", "gpu_ecc_xid"))
    if pending:
        out.append(_hint(
            "GPU memory row remap pending: reset the GPU",
            f"{g['label']}: a row remap (or page retirement) waits for a GPU reset -- the bad "
            "memory row stays in use until then and uncorrectable errors can recur.",
            f"`nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT -i {g['sel']}`; drain the node "
            f"({_drain(g, 'remap-pending')}), and once no job runs on it reset the GPU "
            f"(`nvidia-smi -r -i {g['sel']}`, root) or reboot, then `state=resume`.",
            "critical", "gpu_ecc_xid"))
    if ecc or xid or (m and not (failure or pending)):
        what, app = _XID.get(int(code), (None, False)) if code else (None, False)
        seen = []
        if ecc:
            n_ecc = cnt.get("ecc_uncorrected")
            seen.append(f"{n_ecc:.0f} uncorrected ECC error(s)" if n_ecc else
                        "uncorrected ECC errors rose")
        if xid:
            seen.append((f"{xid_n:.0f} XID event(s)" if xid_n else "XID events") +
                        (f", last XID {code}" + (f" ({what})" if what else "") if code else ""))
        if not seen:
            seen = [_change(n, c) for n, c in m[:3]]
        app_only = xid and not ecc and app
        why = (f"{g['label']}: {'; '.join(seen)}. " +
               ("This XID is usually raised by the application itself (an illegal memory "
                "access or a kernel fault): check the job's own error output first; the same "
                "XID on other jobs of this GPU points at the hardware." if app_only else
                "Uncorrectable ECC errors and hardware XIDs crash or silently corrupt "
                "training; the GPU is not to be trusted until it is checked."))
        out.append(_hint(
            "GPU memory errors (ECC) / XID events", why,
            f"`nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER -i {g['sel']}`, "
            "`dmesg -T | grep -i xid`; drain the node "
            f"({_drain(g, 'xid' if xid and not ecc else 'ecc')}), reset the GPU "
            f"(`nvidia-smi -r -i {g['sel']}`) once it is idle, run `dcgmi diag -r 3`, and RMA "
            "it if the errors recur.",
            "warning" if app_only else "critical", "gpu_ecc_xid"))
    return out


@hookimpl(specname="reveal_hints")
def gpu_lost(anomaly: dict, context: Ctx) -> list[dict]:
    """The GPU stopped answering NVML (GPU_IS_LOST): fell off the bus."""
    g = _gpu(anomaly, context)
    ch = _moved(context, r"^gpu\.\d+\.nvml_status$", 1, +1)
    lost = bool(g.get("lost")) or any(
        (c.get("observed") or 0) >= 0.5 and (c.get("baseline") or 0) < 0.5
        and (c.get("observed") or 0) < 1.5 for _, c in ch)
    if not lost:
        return []
    g = _gpu(anomaly, context, [n for n, _ in ch])
    return [_hint(
        "GPU fell off the bus (lost)",
        f"{g['label']} stopped answering the driver (NVML: GPU is lost) during the run: its "
        "work is gone and every rank of the job stalls or fails; the kernel log has XID 79. "
        "A lost GPU does not come back without a reset or a reboot.",
        "`dmesg -T | grep -iE 'xid|fallen off'` (XID 79), `nvidia-smi -q` (the GPU shows an "
        f"error or is missing); drain the node now ({_drain(g, 'fell-off-the-bus')}), reboot "
        "it; if it happens again reseat the GPU, check its power cables and riser, and RMA it.",
        "critical", "gpu_lost")]


def _gib(b: float | None) -> str:
    return "?" if b is None else f"{b / 2 ** 30:.1f} GiB"


@hookimpl(specname="reveal_hints")
def gpu_foreign(anomaly: dict, context: Ctx) -> list[dict]:
    """Processes on the job's GPU that are not the job's (counts and sizes only: the job's
    user must not learn other users' PIDs or commands)."""
    m = _moved(context, r"^gpu\.\d+\.foreign_(procs|mem|sm)$", 1, +1)
    g = _gpu(anomaly, context, [n for n, _ in m])
    fo = g.get("foreign") if _about(anomaly, r"\.foreign_") else None
    procs = (fo or {}).get("procs") or 0
    if not procs:
        pc = [c for n, c in m if n.endswith("foreign_procs")]
        procs = round(float(pc[0]["observed"])) if pc and pc[0].get("observed") else 0
    if procs < 1:
        return []
    mem = (fo or {}).get("mem")
    sm = (fo or {}).get("sm")
    for n, c in m:
        if n.endswith("foreign_mem") and mem is None:
            mem = c.get("observed")
        if n.endswith("foreign_sm") and sm is None:
            sm = c.get("observed")
    secs = (fo or {}).get("seconds")
    seen = (f"{procs} process(es) that are not this job's ran on it"
            + (f" for {_secs(secs)}" if secs else "")
            + (f", holding {_gib(mem)} of GPU memory" if mem else "")
            + (f" and {sm:.0f}% of its SMs" if sm else ""))
    return [_hint(
        "Foreign GPU work: processes that are not the job's on its GPU",
        f"{g['label']}: {seen}. They take SM time, memory bandwidth and memory from the job "
        "(a leftover of an earlier job, another job on a GPU it was not given, a tool that "
        "opens a context)." + _impact_text(context),
        f"As root: `nvidia-smi --query-compute-apps=pid,used_memory --format=csv -i "
        f"{g['sel']}` names them. Confine jobs to their GPUs: `ConstrainDevices=yes` in "
        "Slurm's cgroup.conf (with `ProctrackType=proctrack/cgroup`), so a job cannot open a "
        "GPU it was not given; set exclusive-process compute mode (`nvidia-smi -c "
        "EXCLUSIVE_PROCESS`, e.g. in the Prolog) so a second process cannot share it; kill "
        "leftover GPU processes in the Epilog.",
        _severity(anomaly, context), "gpu_foreign")]


@hookimpl(specname="reveal_hints")
def gpu_input_bound(anomaly: dict, context: Ctx) -> list[dict]:
    """The GPU idles while the job's CPUs are saturated or taken by others: the cause is the
    CPU side (too few cores per GPU, too few loader workers, a neighbour)."""
    idle = _moved(context, r"^gpu\.\d+\.(util|utilization|gpu_util|sm_active)", 3, -1)
    if not idle:
        return []
    ch = context.get("channels") or {}
    sat = []
    use, lim = ch.get("cpu.run.usage") or {}, ch.get("cpu.run.limit_cores") or {}
    if use.get("observed") is not None and lim.get("observed"):
        if use["observed"] >= 0.9 * lim["observed"]:
            sat.append(f"the job used {use['observed']:.1f} of its {lim['observed']:.0f} "
                       "cores")
    sat += [_change(n, c) for n, c in _moved(context, r"^cpu\.run\.(throttled_time|"
                                                      r"nr_throttled)$", 2, +1)[:1]]
    sat += [_change(n, c) for n, c in (_moved(context, r"^cpu\..*busy_pct$", 2, +1)
                                       + _moved(context, r"^cpu\.psi\.", 3, +1))[:1]]
    foreign = [(n, c) for n, c in _moved(context, r"^cpu\.foreign\.cores$", 3, +1)
               if (c.get("observed") or 0) >= 0.25]
    if not (sat or foreign):
        return []
    g = _gpu(anomaly, context, [n for n, _ in idle])
    several = sorted({n.split(".")[1] for n, _ in idle})
    who = (f"{len(several)} GPUs ({', '.join(several[:8])})" if len(several) > 1 else
           g["label"] if g.get("index") is not None else "The GPU")
    seen = f"{_change(*idle[0])} while " + "; ".join(
        sat[:2] + [f"other processes took {c['observed']:.2f} cores" for _, c in foreign[:1]])
    act = ("Give each GPU enough cores: Slurm `--cpus-per-gpu=N` (or `--cpus-per-task`); "
           "set DataLoader `num_workers` to about the cores per GPU minus one, with "
           "`persistent_workers=True`, `pin_memory=True` and a `prefetch_factor`; move "
           "decoding/augmentation to the GPU (NVIDIA DALI, torchvision v2 on CUDA).")
    if foreign:
        act += (" Other processes run on the job's cores: find them (`ps -eo pid,user,pcpu,psr,"
                "comm --sort=-pcpu | head`), and keep them off with `--exclusive` or "
                "`ConstrainCores=yes` in cgroup.conf.")
    h = _hint(
        "GPU idle while the CPU is saturated: input-bound" if sat else
        "GPU idle while other processes take the job's CPUs: input-bound",
        f"{who}: {seen}. The GPU waits "
        "for batches the CPU side cannot prepare fast enough: the cause is the CPU, not the "
        "GPU." + _impact_text(context),
        act, _severity(anomaly, context), "gpu_input_bound")
    h["cause"] = "cpu"
    return [h]


# -- fallbacks -------------------------------------------------------------------------------

_FALLBACK = {
    "cpu": ("Unusual CPU activity", "`top`, `pidstat -u 1`, `cat /proc/pressure/cpu`"),
    "memory": ("Unusual memory activity", "`free -h`, `vmstat 1`, `cat /proc/pressure/memory`"),
    "storage": ("Unusual storage activity", "`iostat -x 1`, `pidstat -d 1`"),
    "network": ("Unusual network activity", "`ip -s link`, `ss -tin`, `nstat -az`"),
    "gpu": ("Unusual GPU behaviour", "`nvidia-smi -q`, `nvidia-smi dmon -s pucvmet`"),
    "system": ("Unusual system behaviour", "`dmesg -T | tail`, `journalctl -k --since -10min`"),
}


@hookimpl(specname="reveal_hints", trylast=True)
def fallback(anomaly: dict, context: Ctx) -> list[dict]:
    sub = anomaly.get("subsystem", "system")
    title, cmds = _FALLBACK.get(sub, _FALLBACK["system"])
    ev = anomaly.get("evidence") or []
    seen = "; ".join(f"{e['channel']} moved {e['deviation']:+.1f} spreads" for e in ev[:3])
    return [_hint(
        title, f"{seen}. No specific rule matched this pattern." + _impact_text(context),
        f"Look at the channels above around the anomaly's time with {cmds}; compare with a "
        "healthy run (`reveal baseline fit`).", "info", "fallback", fallback=True)]
