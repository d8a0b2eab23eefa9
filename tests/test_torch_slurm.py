"""reveal-torchrun inside a real Slurm job step: it joins the job's node agent (job identity
reused, no second agent) and its events land in the job's run directory."""
import json
import os
import pathlib
import sys

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
torch = pytest.importorskip("torch")

TRAIN = pathlib.Path(__file__).resolve().parent.parent / "examples" / "train.py"


def test_reveal_torchrun_in_srun_joins_the_job_run(slurm_cluster):
    script = f"""#!/bin/sh
export REVEAL_SPOOL={slurm_cluster.spool}
srun -n1 {sys.executable} -m reveal_plugins.torch_ext.launcher --standalone \\
    --nproc-per-node 2 {TRAIN} --steps 40 --log-every 0 --instrument
"""
    job = slurm_cluster.run_batch(script, timeout=240)
    out = slurm_cluster.job_output(job)
    assert job.state == "COMPLETED", f"{job.info}\n{out[-4000:]}"
    run_dir = slurm_cluster.run_dir(job.job_id)
    with open(os.path.join(run_dir, "meta.json")) as f:
        meta = json.load(f)
    assert meta["run"]["source"] == "slurm" and meta["run"]["job_id"] == job.job_id
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        ev = [json.loads(line) for line in f if line.strip()]
    joined = [e for e in ev if e["event"] == "note" and "torchrun joined job" in
              e.get("message", "")]
    assert joined, [e["event"] for e in ev]
    assert "step 0" in joined[0]["message"]
    assert {e["rank"] for e in ev if e["event"] == "rank"} == {0, 1}
    its = [e for e in ev if e["event"] == "iteration"]
    assert {e["rank"] for e in its} == {0, 1}
    assert max(e["step"] for e in its) == 40
    assert any(e["event"] == "elastic" and e.get("state") == "SUCCEEDED" for e in ev)
    # one agent for the node: the job's run was not re-registered by the launcher
    assert [e["event"] for e in ev].count("run_start") == 1
