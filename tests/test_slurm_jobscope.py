"""A job registered by the SPANK plugin (job id only, no cgroup, no PIDs) still gets its own
accounting: the agent finds the job's cgroup (proctrack/cgroup) or its slurmstepd process trees
(proctrack/linuxproc), so the frame has the job's CPU, memory and I/O -- and foreign load can be
told apart from the job's own."""
import json
import os

import numpy as np
import pytest

from reveal_plugins.store.store import load_run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# ~4 s of one busy core, 300 MiB held, 64 MiB written with fsync: in a second step
JOB = """#!/bin/sh
srun -n1 python3 -c "
import os, time
buf = bytearray(300 << 20)
for i in range(0, len(buf), 4096): buf[i] = 1
t = time.time()
while time.time() - t < 4: pass
with open('io.bin', 'wb') as f:
    for _ in range(64): f.write(os.urandom(1 << 20))
    f.flush(); os.fsync(f.fileno())
os.unlink('io.bin')
time.sleep(1)
"
"""


def _job_channels(cluster, user):
    job = cluster.run_batch(JOB, user=user, timeout=180)
    assert job.state == "COMPLETED", cluster.job_output(job, user)
    d = cluster.run_dir(job.job_id)
    meta = json.load(open(os.path.join(d, "meta.json")))
    assert meta["run"]["extra"].get("registered_by") == "spank"
    assert not meta["run"].get("cgroup") and not meta["run"].get("pids")
    probe = [p for p in meta["probes"] if p["name"] == "jobscope"]
    assert probe and probe[0]["available"], meta["probes"]
    fr = load_run(d).frame
    col = {n: fr.values[:, i] for i, n in enumerate(fr.names)}
    return fr.t, col, probe[0]


@pytest.mark.parametrize("proctrack", ["linuxproc", "cgroup"])
def test_spank_registered_job_has_job_channels(slurm_cluster, slurm_users, proctrack):
    user = slurm_users[0]
    with slurm_cluster.proctrack(proctrack):
        t, col, probe = _job_channels(slurm_cluster, user)
    for ch in ("cpu.run.usage", "memory.run.usage", "storage.run.write_bytes",
               "system.run.nprocs"):
        assert ch in col, sorted(col)
    cpu = col["cpu.run.usage"]
    ok = np.isfinite(cpu)
    assert ok.sum() > 10, probe
    # the job's CPU time grows by about the 4 s it spun, never backwards
    assert np.all(np.diff(cpu[ok]) >= -1e-9)
    assert 2.5 <= cpu[ok][-1] - cpu[ok][0] <= 30, (cpu[ok][0], cpu[ok][-1], probe)
    mem = col["memory.run.usage"]
    assert np.nanmax(mem) >= 250 << 20, (np.nanmax(mem), probe)
    assert np.nanmax(col["system.run.nprocs"]) >= 1
    # how the job was found (the freezer cgroup under proctrack/cgroup once Slurm has made
    # it; the slurmstepd trees before that and under linuxproc)
    note = probe.get("note", "")
    assert "/sys/fs/cgroup/" in note or "slurmstepd" in note, probe
    if proctrack == "linuxproc":
        assert "/sys/fs/cgroup/" not in note, probe
