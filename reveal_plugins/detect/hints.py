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

from ..hooks.hookspec import hookimpl

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
                   "network_errors": "network", "gpu_throttling": "gpu", "gpu_pcie_link": "gpu",
                   "gpu_ecc_xid": "gpu", "gpu_input_bound": "gpu"}


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
    return [_hint(
        title,
        f"{'; '.join(_change(n, c) for n, c in sig[:3])}. Gradient all-reduce and data "
        "loading wait on the slowest link; retransmissions mean loss or a queue that drops."
        + _impact_text(context),
        f"Inspect the path: `ip -s link show {iface}`, `ethtool {iface}` (speed/duplex), "
        f"`ethtool -S {iface} | grep -iE 'err|drop'`, `tc qdisc show dev {iface}` (a shaper "
        "left behind?), `ss -tin` (retrans, rtt). Make collectives use the fast interface: "
        "`NCCL_SOCKET_IFNAME=<iface>` / `GLOO_SOCKET_IFNAME=<iface>`, for InfiniBand "
        "`NCCL_IB_HCA=mlx5_0`; `NCCL_DEBUG=INFO` shows the transport chosen.",
        _severity(anomaly, context), "network_degradation")]


@hookimpl(specname="reveal_hints")
def network_errors(anomaly: dict, context: Ctx) -> list[dict]:
    m = _moved(context, r"^network\..*(err|drop|symbol|link_down|discard|crc)", 2, +1)
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

@hookimpl(specname="reveal_hints")
def gpu_throttling(anomaly: dict, context: Ctx) -> list[dict]:
    m = (_moved(context, r"^gpu\.\d+\.(throttle|clocks_event)_(?!idle|sync_boost)", 2, +1)
         + _moved(context, r"^gpu\.\d+\..*(sm_clock_pct_of_max|clock_sm|sm_clock)", 3, -1)
         + _moved(context, r"^gpu\.\d+\..*(temp)", 3, +1))
    if not m:
        return []
    names = " ".join(n for n, _ in m)
    kind = ("thermal" if "temp" in names or "thermal" in names else
            "power" if "power" in names else "hardware")
    return [_hint(
        f"GPU clocks throttled ({kind})",
        f"{'; '.join(_change(n, c) for n, c in m[:3])}. A throttled GPU runs every kernel "
        "slower and, in data parallel training, slows all ranks to its pace."
        + _impact_text(context),
        "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER` shows the active throttle reasons. "
        "Thermal: check fans/airflow and inlet temperature; power: check `nvidia-smi -pl` and "
        "the PSU/power capping policy; HW slowdown: inspect the node (PSU, board) and drain it "
        "(`scontrol update nodename=<node> state=drain reason=gpu-slowdown`).",
        _severity(anomaly, context), "gpu_throttling")]


@hookimpl(specname="reveal_hints")
def gpu_pcie_link(anomaly: dict, context: Ctx) -> list[dict]:
    chans = context.get("channels") or {}
    bad = []
    for n, c in chans.items():
        mm = re.match(r"^(gpu\.\d+)\.pcie_link_(gen|width)$", n)
        if not mm:
            continue
        mx = chans.get(f"{mm.group(1)}.pcie_link_{mm.group(2)}_max")
        if mx and c.get("observed") is not None and mx.get("observed") is not None \
                and c["observed"] < mx["observed"]:
            bad.append(f"{n} {c['observed']:.0f} < max {mx['observed']:.0f}")
    if not bad:
        return []
    return [_hint(
        "GPU PCIe link below its maximum generation/width",
        f"{'; '.join(bad[:3])}. A degraded link cuts host<->GPU bandwidth (data loading, "
        "NCCL over PCIe)." + _impact_text(context),
        "Check `nvidia-smi -q | grep -A3 -i 'link'` and `lspci -vv | grep -E 'LnkCap|LnkSta'` "
        "under load; reseat the GPU/riser, set the slot to Gen4/Gen5 (not Auto/Gen1) in the "
        "BIOS, disable PCIe ASPM; drain the node if it persists.",
        "warning", "gpu_pcie_link")]


@hookimpl(specname="reveal_hints")
def gpu_ecc_xid(anomaly: dict, context: Ctx) -> list[dict]:
    m = _moved(context, r"^gpu\.\d+\..*(ecc|xid|retired|remapped)", 1, +1)
    if not m:
        return []
    return [_hint(
        "GPU memory errors (ECC) / XID events",
        f"{'; '.join(_change(n, c) for n, c in m[:3])}. Uncorrectable ECC errors and XIDs "
        "crash or silently corrupt training.",
        "`nvidia-smi -q -d ECC,PAGE_RETIREMENT`, `dmesg | grep -i xid`; drain the node "
        "(`scontrol update nodename=<node> state=drain reason=gpu-ecc`), reset the GPU "
        "(`nvidia-smi -r`) and RMA it if errors recur.",
        "critical", "gpu_ecc_xid")]


@hookimpl(specname="reveal_hints")
def gpu_input_bound(anomaly: dict, context: Ctx) -> list[dict]:
    idle = _moved(context, r"^gpu\.\d+\.(util|utilization|gpu_util|sm_active)", 3, -1)
    busy = _moved(context, r"^cpu\..*busy_pct$", 2, +1) + _moved(context, r"^cpu\.psi\.", 3, +1)
    if not (idle and busy):
        return []
    return [_hint(
        "GPU idle while the CPU is saturated: input-bound",
        f"{_change(*idle[0])} while {_change(*busy[0])}. The GPU waits for batches the CPU "
        "cannot prepare fast enough." + _impact_text(context),
        "Raise DataLoader `num_workers` (and `persistent_workers=True`, `pin_memory=True`, "
        "`prefetch_factor`), move decoding/augmentation to the GPU (NVIDIA DALI, torchvision "
        "v2 on CUDA), request more CPU cores per GPU (Slurm `--cpus-per-gpu`).",
        _severity(anomaly, context), "gpu_input_bound")]


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
