"""A node that is a CPU set of a shared machine: its own processes' I/O and memory, not the
machine's (probes/nodeprocs.py), and the foreign load derived from them."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from reveal_plugins.detect.evidence import foreign
from reveal_plugins.probes.nodeprocs import CHANNELS, NodeProcsProbe

_WRITER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
buf = b"x" * (1 << 20)
t = time.time()
while time.time() - t < float(sys.argv[2]):
    os.write(fd, buf)
    os.ftruncate(fd, 0); os.lseek(fd, 0, 0)
"""


def _two_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: one for the node, one for the rest of the machine")
    return cpus


def _writer(tmp_path, cpu: int | None, seconds: float = 2.5):
    pre = ["taskset", "-c", str(cpu)] if cpu is not None else []
    return subprocess.Popen(pre + [sys.executable, "-c", _WRITER, str(tmp_path / f"w{cpu}"),
                                   str(seconds)])


def _written(probe: NodeProcsProbe, seconds: float = 1.5) -> float:
    a = probe.sample()
    time.sleep(seconds)
    b = probe.sample()
    return b[1] - a[1]


def test_a_process_pinned_to_the_node_counts_one_free_to_roam_does_not(tmp_path):
    cpus = _two_cpus()
    node = NodeProcsProbe([cpus[-1]])
    node.open()
    assert node.available, node.reason
    assert [c.name for c in node.channels] == [n for n, _, _ in CHANNELS]
    w = _writer(tmp_path, cpus[-1])
    time.sleep(0.3)
    try:
        mine = _written(node)
    finally:
        w.wait()
    free = _writer(tmp_path, None)
    time.sleep(0.3)
    try:
        roaming = _written(node)
    finally:
        free.wait()
    # writes into the page cache count when dirtied (truncated before writeback: the disk
    # counters never see them at all)
    assert mine > 50 * 2**20, mine
    assert roaming < 0.1 * mine, (roaming, mine)


_SELF = r"""
import os, sys
from reveal_plugins.probes.nodeprocs import NodeProcsProbe
node = NodeProcsProbe([int(sys.argv[1])])
node.open()
a = node.sample()[1]
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
for _ in range(64):
    os.write(fd, b"x" * (1 << 20))
    os.ftruncate(fd, 0); os.lseek(fd, 0, 0)
print(node.sample()[1] - a)
"""


def test_the_agents_own_writes_are_not_the_nodes(tmp_path):
    # the agent runs pinned to the node's CPUs too (taskset reveal record ...): its segment
    # writes must not read as a neighbour's I/O on that node
    cpus = _two_cpus()
    r = subprocess.run(["taskset", "-c", str(cpus[-1]), sys.executable, "-c", _SELF,
                        str(cpus[-1]), str(tmp_path / "own")], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=os.path.dirname(
                           os.path.dirname(os.path.abspath(__file__)))))
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) < 4 * 2**20, r.stdout


def test_the_counters_stay_monotonic_when_node_processes_exit(tmp_path):
    cpus = _two_cpus()
    node = NodeProcsProbe([cpus[-1]])
    node.open()
    w = _writer(tmp_path, cpus[-1], 1.0)
    vals = []
    for _ in range(5):
        vals.append(node.sample()[1])
        time.sleep(0.4)
    w.wait()
    vals.append(node.sample()[1])
    assert all(b >= a for a, b in zip(vals, vals[1:])), vals
    assert vals[-1] > vals[0]


def test_no_cpu_set_or_the_whole_machine_leaves_the_probe_off():
    p = NodeProcsProbe(None)
    p.open()
    assert not p.available and "whole machine" in p.reason
    p = NodeProcsProbe(sorted(os.sched_getaffinity(0) | set(range(os.cpu_count()))))
    p.open()
    assert not p.available and "whole machine" in p.reason


def test_foreign_io_and_memory_of_a_node_come_from_its_own_processes():
    names = ["cpu.run.usage", "storage.run.read_bytes", "storage.run.write_bytes",
             "memory.run.rss", "storage.node.read_bytes", "storage.node.write_bytes",
             "memory.node.rss", "storage.vda.write_sectors", "storage.vda.read_sectors",
             "memory.MemTotal", "memory.MemAvailable", "memory.Cached"]
    n = 6
    X = np.zeros((n, len(names)))
    ix = {k: i for i, k in enumerate(names)}
    X[:, ix["storage.run.write_bytes"]] = 1e6
    X[:, ix["storage.node.write_bytes"]] = [1e6, 1e6, 9e7, 9e7, 1e6, 1e6]   # a node hog
    X[:, ix["storage.vda.write_sectors"]] = 3e5                  # the machine: everyone's
    X[:, ix["memory.run.rss"]] = 1e9
    X[:, ix["memory.node.rss"]] = [1.1e9] * 3 + [2.2e9] * 3
    X[:, ix["memory.MemTotal"]] = 8e6
    X[:, ix["memory.MemAvailable"]] = 4e6
    cols, out, _ = foreign.derive(X, names)
    got = dict(zip(out, cols))
    assert list(got["storage.foreign.write_bytes"]) == pytest.approx([0, 0, 8.9e7, 8.9e7, 0, 0])
    assert list(got["memory.foreign.used"]) == pytest.approx([1e8] * 3 + [1.2e9] * 3)
    assert "memory.foreign.cache_growth" not in got   # the page cache is the machine's
