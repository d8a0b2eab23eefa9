"""Multi-node jobs on one machine (issue 11, environment half): the node CPU set the per-core
probes honour, and ``examples/multinode.sh`` end to end (two nodes, each with its own network
namespace, interface, CPU set, host name and agent, one gloo DDP job)."""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from reveal_plugins.probes import cpuset, procfs

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
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.agent.daemon", "--spool",
                        "/nonexistent-reveal-spool", "--cpus", "0-4095"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--cpus 0-4095" in r.stderr and "not online" in r.stderr


# -- examples/multinode.sh end to end (root; ~45 s each) ---------------------------------------

def _peers_available() -> bool:
    return importlib.util.find_spec("reveal_plugins.detect.peers.nodes") is not None


def _check_run(run, job, before_qdiscs):
    from fixtures_multinode import NODE_LINE, leftovers
    lines = run.lines
    assert [NODE_LINE.match(ln) is not None for ln in lines[:2]] == [True, True], lines
    assert lines[2:] == ["ready", lines[-1]] and lines[-1].startswith("report="), lines
    hosts = [n.host for n in run.nodes]
    assert len(set(hosts)) == 2 and len({n.netns for n in run.nodes}) == 2
    cpus = [set(cpuset.parse_cpulist(n.cpus)) for n in run.nodes]
    assert not (cpus[0] & cpus[1]), f"node CPU sets overlap: {cpus}"
    # one job: one report per node, each recorded in that node's namespaces and CPU set
    assert job["schema"] == "reveal.job-report/1"
    assert sorted(r["run"]["nodes"][0] for r in job["reports"]) == sorted(hosts)
    jobdir = os.path.join(run.spool, "jobs", str(job["job_id"]))
    for n in run.nodes:
        with open(os.path.join(jobdir, n.host, "meta.json")) as f:
            meta = json.load(f)
        assert meta["host"] == n.host and meta["cpus"] == cpuset.parse_cpulist(n.cpus)
        cores = {c["name"].split(".")[1] for c in meta["channels"]
                 if c["name"].startswith("cpu.core")}
        assert cores == {f"core{c}" for c in meta["cpus"]}
        # live: the agent published its blocks for its peers with the job's iteration markers
        # (reveal-torchrun's, through the agent): what says whether a symptom cost the job
        import numpy as np
        with np.load(os.path.join(jobdir, n.host, "live-peers.npz")) as z:
            assert z["it"].shape[1] == 3 and len(z["it"]) > 10, z["it"].shape
    # nothing left behind: namespaces, processes, qdiscs of the host
    assert leftovers(run.prefix, run.spool) == []
    assert subprocess.run(["tc", "qdisc", "show"], capture_output=True,
                          text=True).stdout == before_qdiscs


def _foreign_gap(jobdir, hosts, t0, t1):
    """Node 2's CPU load by processes outside the job minus node 1's, cores, over [t0, t1]:
    how visible a fault on node 2's CPU set was on this (shared) machine."""
    from reveal_plugins.store import store
    out = []
    for h in hosts:
        d = store.load_run(os.path.join(jobdir, h),
                           channels=[f"cpu.all.{k}" for k in procfs.CPU_FIELDS[:3]]
                           + ["cpu.all.irq", "cpu.all.softirq", "cpu.run.usage"])
        names = [getattr(c, "name", c) for c in d.frame.channels]
        sel = (d.frame.t >= t0) & (d.frame.t <= t1)
        if sel.sum() < 2:
            return 0.0
        v = d.frame.values[sel]
        t = d.frame.t[sel]
        busy = sum(v[:, names.index(n)] for n in names if n.startswith("cpu.all.")) / 100.0
        run = v[:, names.index("cpu.run.usage")]
        out.append(((busy[-1] - busy[0]) - (run[-1] - run[0])) / (t[-1] - t[0]))
    return out[1] - out[0]


def _qdiscs():
    return subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout


def test_cpu_hog_on_node_2_is_named(multinode):
    before = _qdiscs()
    # the benchmark's shape (6 s of steady training before the hog): peers need normal windows
    run = multinode.start(40, "--fault", "cpu", "--node", "2", "--fault-at", "6",
                          "--fault-for", "14")
    job = run.finish(timeout=85)
    _check_run(run, job, before)
    m = re.search(r"fault cpu node=node2 start=([0-9.]+) end=([0-9.]+)", run.stderr)
    assert m, run.stderr[-2000:]
    if not _peers_available():
        pytest.skip("peer comparison (reveal_plugins.detect.peers.nodes) not in this tree")
    jobdir = os.path.join(run.spool, "jobs", str(job["job_id"]))
    t0, t1 = float(m.group(1)), float(m.group(2))
    gap = _foreign_gap(jobdir, [n.host for n in run.nodes], t0 + 3, t1)
    if gap < 0.3:   # other work on this machine already filled node 2's cores
        pytest.skip(f"the hog raised node 2's foreign CPU load only {gap:.2f} cores above "
                    "node 1's (machine busy with other work): not a test of the peers")
    named = {s["node"] for s in job["peers"]["suspects"]}
    assert named <= {run.nodes[1].host}, job["peers"]   # never the healthy node
    if not named:   # a miss of the detection (benchmarks/peers: cpu 3/3), not of this setup
        pytest.xfail(f"peers named no node for a visible hog (gap {gap:.2f} cores)")


def test_clean_job_names_no_node(multinode):
    before = _qdiscs()
    run = multinode.start(25)
    job = run.finish(timeout=85)
    _check_run(run, job, before)
    assert "fault" not in run.stderr
    if not _peers_available():
        pytest.skip("peer comparison (reveal_plugins.detect.peers.nodes) not in this tree")
    jobdir = os.path.join(run.spool, "jobs", str(job["job_id"]))
    hosts = [n.host for n in run.nodes]
    with open(os.path.join(jobdir, hosts[0], "meta.json")) as f:
        t0 = json.load(f)["start"]
    worst = max(abs(_foreign_gap(jobdir, hosts, t, t + 3)) for t in range(int(t0), int(t0) + 25))
    if worst >= 0.3:   # outside work landed on one node's cores: a real fault, not clean
        pytest.skip(f"other work on this machine loaded one node {worst:.2f} cores more than "
                    "the other: not a clean run")
    assert job["peers"]["suspects"] == [], job["peers"]


def test_interrupted_example_leaves_nothing_behind(multinode):
    """^C / kill after `ready` (with a qdisc of the example's own on a node): the trap tears
    everything down and no report is printed."""
    from fixtures_multinode import leftovers
    before = _qdiscs()
    run = multinode.start(60, "--fault", "network", "--node", "1", "--fault-at", "0")
    run.wait_ready(timeout=60)
    time.sleep(2)
    run.proc.send_signal(signal.SIGINT)
    out, err = run.proc.communicate(timeout=40)
    assert run.proc.returncode == 130, err[-2000:]
    assert "report=" not in out
    assert leftovers(run.prefix, run.spool) == [] and _qdiscs() == before


def test_srun_across_two_slurmd_nodes(multinode):
    """--launcher slurm: one slurmd per node namespace, `srun -N 2 reveal-torchrun ...`; each
    node's Prolog starts that node's agent (its CPU set, its interfaces); one job directory
    under Slurm's job id."""
    import shutil
    missing = [c for c in ("slurmctld", "slurmd", "srun", "sinfo", "munged")
               if shutil.which(c) is None]
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)} missing)")
    before = _qdiscs()
    run = multinode.start(20, "--launcher", "slurm")
    job = run.finish(timeout=88)
    _check_run(run, job, before)
    assert str(job["job_id"]).isdigit()
    assert [r["run"]["source"] for r in job["reports"]] == ["slurm", "slurm"]
    assert {r["run"]["job_id"] for r in job["reports"]} == {str(job["job_id"])}
