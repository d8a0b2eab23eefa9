"""Multi-node jobs on one machine (issue 11, environment half): the node CPU set the per-core
probes honour, and ``examples/multinode.sh`` end to end (two nodes, each with its own network
namespace, interface, CPU set, host name and agent, one gloo DDP job)."""
import os
import subprocess
import sys

import pytest

from reveal_plugins.telemetry import cpuset, procfs

STAT = """cpu  300 0 30 600 0 0 0 0 0 0
cpu0 100 0 10 200 0 0 0 0 0 0
cpu1 200 0 20 400 0 0 0 0 0 0
intr 1234 5 6
ctxt 99
btime 1
processes 7
procs_running 3
procs_blocked 0
"""


def test_cpulist_round_trip_and_errors():
    assert cpuset.parse_cpulist("0-2,5, 7-8") == [0, 1, 2, 5, 7, 8]
    assert cpuset.format_cpulist([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    for bad in ("", "a", "3-1", "-1"):
        with pytest.raises(ValueError, match="cpus"):
            cpuset.parse_cpulist(bad)
    with pytest.raises(ValueError, match="not online"):
        cpuset.resolve("0-4095")


def test_cpu_stat_counts_only_the_node_cpus(tmp_path, monkeypatch):
    (tmp_path / "stat").write_text(STAT)
    monkeypatch.setattr(procfs, "PROC", str(tmp_path))
    whole = procfs.CpuStatProbe()
    whole.open()
    mine = procfs.CpuStatProbe(cpus=[1])
    mine.open()
    try:
        w = dict(zip([c.name for c in whole.channels], whole.sample()))
        m = dict(zip([c.name for c in mine.channels], mine.sample()))
    finally:
        whole.close()
        mine.close()
    assert w["cpu.all.user"] == 300 and "cpu.core0.user" in w
    assert "cpu.core0.user" not in m and m["cpu.core1.user"] == 200
    assert m["cpu.all.user"] == 200 and m["cpu.all.idle"] == 400   # node = its own cores
    assert m["system.ctxt"] == 99 and m["cpu.procs_running"] == 3
    # a core the file does not have: unavailable with the reason, never a wrong sum
    bad = procfs.CpuStatProbe(cpus=[1, 7])
    bad.open()
    assert not bad.available and "7" in bad.reason


def test_agent_refuses_a_bad_cpu_list():
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.telemetry.agent", "--spool",
                        "/nonexistent-reveal-spool", "--cpus", "0-4095"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--cpus 0-4095" in r.stderr and "not online" in r.stderr
