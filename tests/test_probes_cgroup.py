"""Per-run cgroup / process-tree accounting against the real kernel (root: we create cgroups
under our own cgroup in each hierarchy and remove them afterwards); the v2 memory files,
which this hybrid machine does not have, come from a small fake tree."""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from reveal_plugins.probes import cgroup
from reveal_plugins.probes.cgroup import CgroupProbe, find_hierarchies
from reveal_plugins.types import RunInfo

ROOT = "/sys/fs/cgroup"
BUSY = [sys.executable, "-c", "import time\nt=time.time()+{s}\nwhile time.time()<t: pass"]


def busy(seconds):
    return [a.format(s=seconds) for a in BUSY]


def _own(ctl):
    for line in open("/proc/self/cgroup"):
        _, ctls, path = line.strip().split(":", 2)
        if (ctl == "v2" and ctls == "") or ctl in ctls.split(","):
            return path
    return None


def _writable(d):
    return os.path.isdir(d) and os.access(d, os.W_OK)


@pytest.fixture
def v1_cgroup():
    """A fresh cgroup in the cpu, cpuacct and memory v1 hierarchies; yields (path per
    controller, the relative name to give as run.cgroup when all share the same parent)."""
    hier = find_hierarchies(ROOT)
    if os.geteuid() != 0 or not all(c in hier for c in ("cpu", "cpuacct", "memory")):
        pytest.skip("needs root and cgroup v1 cpu/cpuacct/memory hierarchies")
    name = f"reveal_test_{uuid.uuid4().hex[:8]}"
    dirs = {}
    try:
        for c in ("cpu", "cpuacct", "memory"):
            d = hier[c] + _own(c).rstrip("/") + "/" + name
            os.mkdir(d)
            dirs[c] = d
    except OSError as e:
        for d in dirs.values():
            os.rmdir(d)
        pytest.skip(f"cannot create cgroups here: {e}")
    yield dirs
    for d in dirs.values():
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except OSError:
                time.sleep(0.1)


def _enter(dirs, pid):
    for d in dirs.values():
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(pid))


def _vals(p):
    return dict(zip([c.name for c in p.channels], p.sample()))


def _start_in(dirs, argv):
    """Start argv stopped, move it into the cgroups, then let it run (nothing escapes)."""
    child = subprocess.Popen(argv, start_new_session=True)
    os.kill(child.pid, signal.SIGSTOP)
    _enter(dirs, child.pid)
    os.kill(child.pid, signal.SIGCONT)
    return child


def test_v1_cgroup_cpu_throttling_and_memory(v1_cgroup):
    with open(os.path.join(v1_cgroup["cpu"], "cpu.cfs_quota_us"), "w") as f:
        f.write("20000")  # 0.2 core per 100 ms period
    with open(os.path.join(v1_cgroup["memory"], "memory.limit_in_bytes"), "w") as f:
        f.write(str(256 << 20))
    child = _start_in(v1_cgroup, busy(1.0))
    try:
        # PIDs only: each hierarchy's path comes from /proc/<pid>/cgroup
        p = CgroupProbe(RunInfo("r", "", pids=[child.pid]))
        p.open()
        assert p.available, p.reason
        assert p.mode == "cgroup-v1"
        a = _vals(p)
        time.sleep(0.6)
        b = _vals(p)
    finally:
        child.wait()
    meta = {c.name: c for c in p.channels}
    assert meta["cpu.run.usage"].unit == "s" and meta["cpu.run.usage"].kind == "counter"
    # 0.2 core for 0.6 s: about 0.12 s of CPU, and it was throttled most periods
    assert 0.03 < b["cpu.run.usage"] - a["cpu.run.usage"] < 0.4
    assert b["cpu.run.nr_throttled"] - a["cpu.run.nr_throttled"] >= 2
    assert b["cpu.run.throttled_time"] > a["cpu.run.throttled_time"]
    assert b["cpu.run.limit_cores"] == pytest.approx(0.2)
    assert b["memory.run.limit"] == 256 << 20
    assert b["memory.run.usage"] > 0 and b["system.run.nprocs"] == 1
    assert meta["memory.run.oom_kill"].kind == "counter"
    p.close()


def test_v1_oom_kill_is_counted(v1_cgroup):
    with open(os.path.join(v1_cgroup["memory"], "memory.limit_in_bytes"), "w") as f:
        f.write(str(32 << 20))
    p = CgroupProbe(cgroup=v1_cgroup["memory"])
    p.open()
    assert p.available, p.reason
    before = _vals(p)
    hog = _start_in(v1_cgroup, [sys.executable, "-c", "x = bytearray(200 << 20)"])
    rc = hog.wait(timeout=60)
    time.sleep(cgroup.HOLD_S)   # oom_control is read once a second
    after = _vals(p)
    assert rc == -signal.SIGKILL
    assert after["memory.run.oom_kill"] == before["memory.run.oom_kill"] + 1
    assert after["memory.run.failcnt"] > before["memory.run.failcnt"]
    assert after["system.run.nprocs"] == 0


def test_explicit_cgroup_path(v1_cgroup):
    child = _start_in(v1_cgroup, busy(0.5))
    try:
        p = CgroupProbe(RunInfo("r", "", cgroup=v1_cgroup["cpu"]))  # absolute path works
        p.open()
        assert p.available and p.mode == "cgroup-v1", (p.mode, p.reason)
        names = {c.name for c in p.channels}
        assert {"cpu.run.usage", "cpu.run.nr_throttled", "system.run.nprocs"} <= names
        assert _vals(p)["system.run.nprocs"] == 1
    finally:
        child.wait()


def test_pids_in_root_cgroup_sum_the_process_tree(tmp_path):
    if _own("cpu") not in (None, "/"):
        pytest.skip("this test expects the test runner in the root CPU cgroup")
    # the busy loop is a multi-line program: quote it for bash
    b = "'" + busy(0.8)[2] + "'"
    script = (f"{sys.executable} -c {b} & {sys.executable} -c {b} & "
              f"dd if=/dev/zero of={tmp_path}/f bs=1M count=4 status=none; wait")
    root = subprocess.Popen(["bash", "-c", script])
    p = CgroupProbe(RunInfo("r", "", pids=[root.pid]))
    p.open()
    assert p.available, p.reason
    assert p.mode == "process-tree"
    names = [c.name for c in p.channels]
    assert {"cpu.run.usage", "memory.run.rss", "storage.run.wchar", "system.run.nprocs"} <= set(names)
    first = _vals(p)
    most = 0
    seen = [first]
    while True:
        pid, _, ru = os.wait4(root.pid, os.WNOHANG)
        if pid:
            root.returncode = 0
            break
        time.sleep(0.1)
        v = _vals(p)
        seen.append(v)
        most = max(most, v["system.run.nprocs"])
    assert most >= 3  # bash + two pythons (dd may have finished)
    usage = [v["cpu.run.usage"] for v in seen if v["cpu.run.usage"] == v["cpu.run.usage"]]
    assert usage == sorted(usage), "cumulative CPU must not go backwards when children exit"
    # the kernel's own account of the tree (bash + reaped children), minus up to one
    # sample interval of two busy children missed at the end
    truth = ru.ru_utime + ru.ru_stime
    assert truth > 0.3
    assert truth - 0.35 <= usage[-1] <= truth + 0.05
    assert max(v["storage.run.wchar"] for v in seen) >= 4 << 20
    assert max(v["memory.run.rss"] for v in seen) > 1 << 20
    p.close()


def test_fake_cgroup_v2_tree(tmp_path):
    root = tmp_path / "cg"
    d = root / "slurm" / "job_7" / "step_0"
    d.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory io\n")
    (d / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"
                                "nr_periods 40\nnr_throttled 10\nthrottled_usec 300000\n")
    (d / "cpu.max").write_text("50000 100000\n")
    (d / "memory.current").write_text(f"{64 << 20}\n")
    (d / "memory.max").write_text("max\n")
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    (d / "memory.stat").write_text("anon 1000\nfile 2000\nkernel 5\n")
    (d / "io.stat").write_text("8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n"
                               "8:16 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n")
    (d / "cgroup.procs").write_text("101\n102\n")
    p = CgroupProbe(cgroup="/slurm/job_7/step_0", cgroup_root=str(root))
    p.open()
    assert p.available, p.reason
    assert p.mode == "cgroup-v2"
    v = _vals(p)
    assert v["cpu.run.usage"] == pytest.approx(2.5) and v["cpu.run.system"] == pytest.approx(0.5)
    assert v["cpu.run.nr_throttled"] == 10 and v["cpu.run.throttled_time"] == pytest.approx(0.3)
    assert v["cpu.run.limit_cores"] == pytest.approx(0.5)
    assert v["memory.run.usage"] == 64 << 20 and v["memory.run.limit"] != v["memory.run.limit"]
    assert v["memory.run.failcnt"] == 4 and v["memory.run.oom_kill"] == 1
    assert v["memory.run.anon"] == 1000 and v["memory.run.file"] == 2000
    assert v["storage.run.read_bytes"] == 8192 and v["storage.run.write_bytes"] == 8192
    assert v["system.run.nprocs"] == 2
    # an absolute path under the mount names the same cgroup
    q = CgroupProbe(cgroup=str(d), cgroup_root=str(root))
    q.open()
    assert q.available and _vals(q) == pytest.approx(v, nan_ok=True)


def test_limits_are_read_once_a_second_and_rates_every_sample(tmp_path, monkeypatch):
    """A limit or the OOM state set between two samples shows within a second; CPU time,
    usage and fail counts (rates) show on the next sample."""
    clock = [1000.0]
    monkeypatch.setattr(cgroup, "_now", lambda: clock[0])
    root = tmp_path / "cg"
    d = root / "job"
    d.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    files = {"cpu.stat": "usage_usec 1000000\n", "cpu.max": "max 100000\n",
             "memory.current": "100\n", "memory.max": "max\n",
             "memory.events": "high 0\nmax 0\noom 0\noom_kill 0\n"}
    for k, v in files.items():
        (d / k).write_text(v)
    p = CgroupProbe(cgroup="/job", cgroup_root=str(root))
    p.open()
    assert p.available, p.reason
    a = _vals(p)
    (d / "cpu.stat").write_text("usage_usec 3000000\n")
    (d / "cpu.max").write_text("50000 100000\n")
    (d / "memory.current").write_text("200\n")
    (d / "memory.max").write_text(f"{1 << 30}\n")
    (d / "memory.events").write_text("high 5\nmax 2\noom 0\noom_kill 0\n")
    clock[0] += 0.1
    b = _vals(p)
    assert (b["cpu.run.usage"], b["memory.run.usage"], b["memory.run.failcnt"]) == (3.0, 200, 2)
    assert b["cpu.run.limit_cores"] != b["cpu.run.limit_cores"]    # still "no limit" (NaN)
    assert b["memory.run.limit"] != b["memory.run.limit"]
    clock[0] += cgroup.HOLD_S
    c = _vals(p)
    assert c["cpu.run.limit_cores"] == pytest.approx(0.5) and c["memory.run.limit"] == 1 << 30
    (d / "memory.max").write_text("max\n")
    clock[0] += 0.5
    assert _vals(p)["memory.run.limit"] == 1 << 30
    assert a["cpu.run.usage"] == 1.0


def test_real_unified_hierarchy_cpu_stat():
    hier = find_hierarchies(ROOT)
    if "v2" not in hier or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup v2 hierarchy")
    parent = hier["v2"] + _own("v2").rstrip("/")
    if "cpu" in hier:  # hybrid: only the v2 side may hold this name
        pass
    d = f"{parent}/reveal_test_{uuid.uuid4().hex[:8]}"
    try:
        os.mkdir(d)
    except OSError as e:
        pytest.skip(f"cannot create a v2 cgroup: {e}")
    child = subprocess.Popen(busy(0.6), start_new_session=True)
    try:
        os.kill(child.pid, signal.SIGSTOP)
        with open(f"{d}/cgroup.procs", "w") as f:
            f.write(str(child.pid))
        os.kill(child.pid, signal.SIGCONT)
        p = CgroupProbe(cgroup=d)
        p.open()
        assert p.available, p.reason
        assert p.mode == "cgroup-v2"
        a = _vals(p)
        time.sleep(0.4)
        b = _vals(p)
        assert b["cpu.run.usage"] - a["cpu.run.usage"] > 0.1
        assert b["system.run.nprocs"] == 1
        # keys the kernel does not write (no cpu controller here) are no channels
        assert all(x == x for x in b.values()), b
    finally:
        child.wait()
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except OSError:
                time.sleep(0.1)


def test_bad_input_gives_reason():
    p = CgroupProbe(cgroup="/no/such/cgroup/xyz")
    p.open()
    assert not p.available and "/no/such/cgroup/xyz" in p.reason
    p = CgroupProbe(RunInfo("r", ""))
    p.open()
    assert not p.available and "neither a cgroup nor PIDs" in p.reason
    dead = subprocess.Popen(["true"])
    dead.wait()
    p = CgroupProbe(pids=[dead.pid])
    p.open()
    assert not p.available and "exited" in p.reason


def test_tree_leaves_out_the_sampling_process():
    """``reveal record`` starts its agent as a child of the run's root PID: the agent's own CPU
    must not be charged to the run."""
    import reveal_plugins
    code = ("import os, json\n"
            "from reveal_plugins.probes.cgroup import CgroupProbe\n"
            "p = CgroupProbe(pids=[os.getppid()]); p.open()\n"
            "v = dict(zip([c.name for c in p.channels], p.sample()))\n"
            "print(json.dumps([p.mode, v['system.run.nprocs']]))\n")
    if _own("cpu") not in (None, "/"):
        pytest.skip("this test expects the test runner in the root CPU cgroup")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(reveal_plugins.__file__)))
    r = subprocess.run(["bash", "-c", f"{sys.executable} -c \"$CODE\"; true"],
                       env=dict(env, CODE=code), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout) == ["process-tree", 1.0]  # bash only, not the prober
