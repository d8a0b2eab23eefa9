"""``reveal fleet nodes --slurm-workers 2`` on the real Slurm: the pass runs on two Dask
workers that are Slurm jobs (dask-jobqueue's SLURMCluster submits them with sbatch) and
ranks the nodes exactly as the embedded default does."""
import json
import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from fixtures_fleet import planted_fleet, tls_options
from reveal_plugins.fleet.index import build_index

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
pytest.importorskip("dask_jobqueue")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _nodes(index, env, *extra):
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "fleet", "nodes", index,
                        "--json", *extra], capture_output=True, text=True, timeout=240,
                       env=env, cwd="/")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.timeout(300)
def test_nodes_on_two_slurm_workers_same_ranking(slurm_cluster, fleet_templates, tmp_path):
    root = str(tmp_path)
    os.chmod(root, 0o755)
    fl = planted_fleet(root, fleet_templates, nodes=6, runs_per_node=8)
    index = os.path.join(root, "FLEET")
    build_index([fl["spool"]], index, None, features=False, flush_runs=3)   # many part files
    env = dict(slurm_cluster.env, PYTHONPATH=REPO)
    embedded = _nodes(index, env, "--workers", "2")
    from distributed.security import Security
    tls = tls_options(Security.temporary(), root)   # the scheduler and workers speak TLS
    on_slurm = _nodes(index, env, "--slurm-workers", "2", *tls)
    key = [(r["node"], r["anomalous"], r["analysed"], r["score"], r["suspect"])
           for r in embedded["nodes"]]
    assert [(r["node"], r["anomalous"], r["analysed"], r["score"], r["suspect"])
            for r in on_slurm["nodes"]] == key
    assert on_slurm["nodes"][0]["node"] == fl["lemon"] and on_slurm["nodes"][0]["suspect"]
    # the tasks ran in two different Slurm jobs
    slurm_jobs = [w for w in on_slurm["ran_on"] if w.startswith("slurm:")]
    assert len(slurm_jobs) == 2 and on_slurm["ran_on"] == slurm_jobs, on_slurm["ran_on"]
    assert all(w.startswith("slurm:") is False for w in embedded["ran_on"])
    # and are gone afterwards (the cluster cancels its jobs on close)
    ids = {w.split(":")[1] for w in slurm_jobs}
    deadline = time.monotonic() + 30
    while True:
        r = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True,
                           env=slurm_cluster.env, timeout=30)
        live = [ln for ln in r.stdout.splitlines() if ln.split()[0] in ids
                and ln.split()[1] in ("RUNNING", "PENDING", "CONFIGURING")]
        if not live or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not live, live
    # The worker jobs were real jobs under the Reveal hooks: the node's spool holds their run
    # directories, and indexing that real spool finds them under their identity.
    dirs = [slurm_cluster.run_dir(i) for i in sorted(ids)]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(d, "meta.json")) for d in dirs):
        assert time.monotonic() < deadline, dirs
        time.sleep(0.5)
    real = os.path.join(root, "REAL")
    build_index([slurm_cluster.spool], real, None, features=False)
    rows = {r["job_id"]: r for r in pq.read_table(os.path.join(real, "runs")).to_pylist()}
    for i in ids:
        assert rows[i]["source"] == "slurm" and rows[i]["node"] == slurm_cluster.node
        assert rows[i]["user"] == "root" and rows[i]["partition"] == "debug"
        extra = json.load(open(os.path.join(slurm_cluster.run_dir(i), "meta.json")))["run"][
            "extra"]
        # the SPANK registration carries no job name or command (workload "unknown" then)
        assert rows[i]["workload"] == extra.get("job_name", "unknown")
