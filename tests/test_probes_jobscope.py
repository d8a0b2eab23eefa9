"""JobScopeProbe on cgroup trees laid out as Slurm's plugins make them (written to a temporary
directory: the layouts, not the kernel, are under test here; tests/test_slurm_jobscope.py runs
it on the real Slurm)."""
import os
import subprocess

from reveal_plugins.probes.jobscope import JobScopeProbe, job_cgroups
from reveal_plugins.types import RunInfo


def _run(job="42", uid=1001):
    return RunInfo(run_id=f"slurm-{job}", run_dir="/nonexistent", source="slurm", job_id=job,
                   uid=uid)


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_v1_accounting_cgroup_counters_stay_monotonic(tmp_path):
    root = str(tmp_path)
    job = os.path.join(root, "cpuacct", "slurm_n1", "uid_1001", "job_42")
    _write(os.path.join(job, "cpuacct.usage"), "5000000000\n")
    _write(os.path.join(job, "cgroup.procs"), "11\n12\n")
    _write(os.path.join(root, "memory", "slurm_n1", "uid_1001", "job_42", "memory.usage_in_bytes"),
           str(300 << 20))
    assert len(job_cgroups("42", 1001, root)) == 2
    p = JobScopeProbe(_run(), cgroup_root=root, rescan_every=1)
    p.open()
    assert p.available and p.mode == "cgroup"
    names = [c.name for c in p.channels]
    v0 = dict(zip(names, p.sample()))
    assert v0["system.run.nprocs"] == 2 and v0["memory.run.usage"] == 300 << 20
    _write(os.path.join(job, "cpuacct.usage"), "7000000000\n")
    v1 = dict(zip(names, p.sample()))
    assert abs(v1["cpu.run.usage"] - v0["cpu.run.usage"] - 2.0) < 1e-9
    _write(os.path.join(job, "cpuacct.usage"), "1000000000\n")    # counter went backwards
    v2 = dict(zip(names, p.sample()))
    assert v2["cpu.run.usage"] == v1["cpu.run.usage"]
    assert v2["storage.run.rchar"] != v2["storage.run.rchar"]     # NaN: a cgroup has no rchar
    assert "cgroup" in p.describe()["note"]


def test_before_the_first_step_nothing_is_found_and_nothing_raises(tmp_path):
    p = JobScopeProbe(_run("77"), cgroup_root=str(tmp_path), proc=str(tmp_path / "proc"))
    os.makedirs(tmp_path / "proc")
    p.open()
    v = dict(zip([c.name for c in p.channels], p.sample()))
    assert v["system.run.nprocs"] == 0 and v["cpu.run.usage"] != v["cpu.run.usage"]
    assert "no processes found yet" in p.describe()["note"]


def test_bad_job_id_unavailable(tmp_path):
    p = JobScopeProbe(_run("../../etc"), cgroup_root=str(tmp_path))
    p.open()
    assert not p.available and "not a Slurm job id" in p.reason


def test_readings_parsed_later_keep_the_source_they_were_taken_from(tmp_path):
    """The agent takes readings every tick and parses them a second later: a switch of source
    in between (the job's accounting cgroup appears after its processes were followed) starts
    a new baseline at the reading where it happened, not at the parse."""
    root = str(tmp_path)
    job = subprocess.Popen(["sleep", "60"])          # the job: one process, no children
    try:
        _check_deferred_parse(root, job.pid)
    finally:
        job.kill()
        job.wait()


def _check_deferred_parse(root, pid):
    frz = os.path.join(root, "freezer", "slurm", "uid_1001", "job_42")
    _write(os.path.join(frz, "cgroup.procs"), f"{pid}\n")            # members only: a tree
    p = JobScopeProbe(_run(), cgroup_root=root, rescan_every=1)
    p.open()
    assert p.mode == "process-tree"
    r0 = p.read_raw()
    acct = os.path.join(root, "cpuacct", "slurm", "uid_1001", "job_42")
    _write(os.path.join(acct, "cpuacct.usage"), str(10_000 * 10**9))  # 10,000 s: not the tree's
    _write(os.path.join(acct, "cgroup.procs"), f"{pid}\n")
    r1 = p.read_raw()
    assert p.mode == "cgroup"
    _write(os.path.join(acct, "cpuacct.usage"), str(10_003 * 10**9))
    r2 = p.read_raw()
    names = [c.name for c in p.channels]
    v0, v1, v2 = (dict(zip(names, p.parse_raw(r))) for r in (r0, r1, r2))
    assert v0["system.run.nprocs"] == 1 and v0["cpu.run.usage"] < 1000    # the tree's
    # the switch adds nothing (the cgroup's 10,000 s are not 10,000 s of this job's work) and
    # the cgroup's own later change counts in full
    assert v1["cpu.run.usage"] == v0["cpu.run.usage"]
    assert abs(v2["cpu.run.usage"] - v1["cpu.run.usage"] - 3.0) < 1e-6
