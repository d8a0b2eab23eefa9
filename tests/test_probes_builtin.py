"""The built-in probe plugin finds every probe module of the package: an optional probe is one
whose *library* may be missing (pynvml), never one of ours under a wrong name (after the move
out of ``telemetry/`` the old name silently dropped perf, cpufreq, hwmon, qdisc and the run's
process-tree accounting)."""
import os

import pytest

from reveal_plugins.probes import builtin_probes
from reveal_plugins.types import RunInfo


def test_host_and_run_probes_come_from_their_modules():
    host = builtin_probes.reveal_register_probes(config={})
    mods = {type(p).__module__ for p in host}
    assert {"reveal_plugins.probes.procfs", "reveal_plugins.probes.cpufreq",
            "reveal_plugins.probes.hwmon", "reveal_plugins.probes.infiniband"} <= mods, mods
    run = RunInfo(run_id="t", run_dir="/nonexistent", pids=[os.getpid()])
    runp = builtin_probes.reveal_register_run_probes(run=run, config={})
    assert "reveal_plugins.probes.cgroup" in {type(p).__module__ for p in runp}, runp


def test_a_missing_module_of_ours_is_an_error_not_an_absent_probe():
    with pytest.raises(ImportError):
        builtin_probes._optional("no_such_probe_module", "X")


def test_vmstat_dirtied_and_written_are_counters_of_this_kernel():
    """``nr_dirtied``/``nr_written`` count pages since boot (foreign file churn is their
    rate); the other ``nr_*`` fields are gauges of pages now.  Read from this machine's
    /proc/vmstat: both grow across a file written and fsync'd."""
    import tempfile

    from reveal_plugins.probes.procfs import VmstatProbe

    p = VmstatProbe()
    p.open()
    kinds = {c.name: c.kind for c in p.channels}
    assert kinds["memory.vm.nr_dirtied"] == "counter", kinds
    assert kinds["memory.vm.nr_written"] == "counter", kinds
    assert kinds["memory.vm.nr_dirty"] == "gauge", kinds
    names = [c.name for c in p.channels]
    before = dict(zip(names, p.sample()))
    with tempfile.NamedTemporaryFile(dir=os.path.expanduser("~")) as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        after = dict(zip(names, p.sample()))
    p.close()
    assert after["memory.vm.nr_dirtied"] - before["memory.vm.nr_dirtied"] >= 256 * 0.9
    assert after["memory.vm.nr_written"] > before["memory.vm.nr_written"]
