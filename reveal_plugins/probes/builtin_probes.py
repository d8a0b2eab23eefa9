"""The built-in probes, registered through the same hooks a site plugin uses."""
from __future__ import annotations

import importlib
import logging
from typing import Any

from ..hooks import hookimpl
from ..types import RunInfo
from . import cpuset
from .procfs import PROCFS_PROBES, CpuStatProbe
from .psi import psi_probes

log = logging.getLogger(__name__)


def _optional(module: str, factory: str, *args: Any, **kwargs: Any) -> list:
    """Probes whose module may not exist yet or needs an optional library."""
    try:
        mod = importlib.import_module(f"reveal_plugins.probes.{module}")
    except ImportError as e:
        if (e.name or "").startswith("reveal_plugins"):
            raise     # our own module missing is a bug, not an optional library
        log.debug("probe module %s not loaded: %s", module, e)
        return []
    f = getattr(mod, factory, None)
    if f is None:
        return []
    made = f(*args, **kwargs)
    return list(made) if isinstance(made, (list, tuple)) else [made]


@hookimpl
def reveal_register_probes(config: dict[str, Any]) -> list:
    cpus = cpuset.from_config(config)   # the node's CPU set: per-core files count only it
    probes = [cls(cpus=cpus) if cls is CpuStatProbe else cls() for cls in PROCFS_PROBES]
    probes += psi_probes()
    probes += _optional("qdisc", "qdisc_probes")    # shapers holding packets back
    probes += _optional("nodeprocs", "node_procs_probes", cpus,   # a node sharing a kernel
                        config.get("host_proc"))
    # hardware probes (issue 2, probes part 2): each one reports why it is unavailable here
    probes += _optional("perf", "perf_host_probes", cpus=cpus)
    probes += _optional("cpufreq", "CpufreqProbe", cpus=cpus)
    probes += _optional("hwmon", "HwmonProbe")
    probes += _optional("infiniband", "InfinibandProbe")
    probes += _optional("nvml", "NvmlProbe", gpus=config.get("gpus"))
    return probes


@hookimpl
def reveal_register_run_probes(run: RunInfo, config: dict[str, Any]) -> list:
    probes: list = []
    if run.cgroup or run.pids:
        probes += _optional("cgroup", "CgroupProbe", run)
    elif run.source == "slurm" and run.job_id:
        # registered by job id only (SPANK plugin): the agent finds the job's cgroup or
        # slurmstepd process trees itself, step after step
        probes += _optional("jobscope", "JobScopeProbe", run)
    probes += _optional("perf", "perf_run_probes", run.pids)  # [] when counted system-wide
    if run.gpus != []:  # [] = the run was given no GPU (or none could be resolved)
        probes += _optional("gpu_procs", "GpuForeignProbe", run)
    return probes
