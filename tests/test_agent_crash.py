"""kill -9 of the agent at 50 random moments of one run.

Every finished segment stays readable, ``meta.json`` is never empty or torn, and the next hook
(the Epilog's analysis, ``finalize_orphan``) closes the run from what is on disk.  The agent is
forked from this process (imports already done) so 50 crashes take seconds, not minutes.
"""
import json
import os
import random
import select
import signal
import time

from reveal_plugins.store import store
from reveal_plugins.store.finalize import finalize_orphan


def _agent_child(spool: str, run_dir: str, ready: int) -> None:
    from reveal_plugins.agent.daemon import Agent
    from reveal_plugins.types import RunInfo
    try:
        a = Agent(spool, interval_s=0.01, segment_s=0.05)
        a.register(RunInfo(run_id="r", source="test", run_dir=run_dir))
        os.write(ready, b"r")
        a._sampling_loop()  # until killed
    finally:
        os._exit(1)


def test_kill9_at_random_moments_loses_only_the_open_segment(tmp_path):
    rng = random.Random(7)
    spool, run_dir = str(tmp_path / "spool"), str(tmp_path / "run")
    os.makedirs(spool)
    kills = 0
    for _ in range(50):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _agent_child(spool, run_dir, w)
        os.close(w)
        # The random moment is counted from the end of registration: a cold machine (CI's
        # first test) spends longer than the whole window discovering probes.
        ready = select.select([r], [], [], 60)[0]
        os.close(r)
        assert ready, "the forked agent did not register within 60 s"
        time.sleep(rng.uniform(0.02, 0.3))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        kills += 1
        # meta.json is whole after every crash (written beside and renamed in)
        if os.path.exists(os.path.join(run_dir, "meta.json")):
            with open(os.path.join(run_dir, "meta.json")) as f:
                assert json.load(f)["schema"]
    assert kills == 50
    paths = store.segment_paths(run_dir)
    assert len(paths) >= 20, f"only {len(paths)} segments written"
    names = [c["name"] for c in store.read_meta(run_dir)["channels"]]
    for p in paths:  # every segment renamed into place is complete
        t, v = store.read_segment(p, names)
        assert len(t) > 0
    meta = finalize_orphan(run_dir, 137, "epilog")
    assert meta is not None and meta["end"] is not None and meta["finalized_by"] == "epilog"
    assert finalize_orphan(run_dir, 137, "epilog") is None  # once closed, left alone
    run = store.load_run(run_dir)
    assert len(run.frame.t) > 100


def test_a_restarted_agent_adopts_the_runs_left_open(tmp_path):
    """kill -9 of a root-style agent mid-job; the next agent resumes the job's run in the same
    directory (start and open step kept, an ``agent_restart`` event), and closes it later."""
    from reveal_plugins.agent.daemon import Agent
    from reveal_plugins.types import RunInfo
    spool = str(tmp_path / "spool")
    run_dir = os.path.join(spool, "jobs", "42", "n")
    os.makedirs(spool)
    pid = os.fork()
    if pid == 0:
        try:
            a = Agent(spool, interval_s=0.02, segment_s=0.2)
            a.host = "n"
            a.register(RunInfo(run_id="slurm-42", source="slurm", job_id="42", run_dir=run_dir))
            a.event("slurm-42", "step_start", step_id="0")
            a._sampling_loop()
        finally:
            os._exit(1)
    time.sleep(1.5)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    start = store.read_meta(run_dir)["start"]
    b = Agent(spool, interval_s=0.1)
    b.host = "n"
    b.start()
    try:
        assert "slurm-42" in b._runs
        time.sleep(1.0)
        b.unregister("slurm-42", 0)
    finally:
        b.stop()
    meta = store.read_meta(run_dir)
    assert meta["start"] == start and meta["end"] is not None and meta["restarts"] == 1
    assert [s["step_id"] for s in meta["steps"]] == ["0"] and meta["steps"][0]["end"]
    events = [e["event"] for e in store.read_events(run_dir)]
    assert events.count("run_start") == 1 and "agent_restart" in events


def test_old_job_directories_are_pruned_and_open_ones_kept(tmp_path):
    from reveal_plugins.agent.daemon import Agent
    spool = tmp_path / "spool"
    now = time.time()
    for job, end in (("1", now - 40 * 86400), ("2", now - 86400), ("3", None)):
        d = spool / "jobs" / job / "n"
        d.mkdir(parents=True)
        store.write_meta(str(d), {"schema": store.META_SCHEMA, "run": {}, "channels": [],
                                  "start": now - 50 * 86400, "end": end})
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, spool / "jobs" / "1" / "n" / "link")
    a = Agent(str(spool), interval_s=0.5, config={"retention_days": 30})
    assert a.prune_old_jobs() == ["1"]
    assert sorted(os.listdir(spool / "jobs")) == ["2", "3"] and victim.read_text() == "keep"


def test_a_queued_registration_of_a_run_already_closed_is_not_replayed(tmp_path):
    """The SPANK plugin queued a registration while no agent ran; the job ended and the Epilog
    closed the run from disk.  The next agent must not reopen it and sample a finished job."""
    from reveal_plugins.agent.daemon import Agent
    from reveal_plugins.agent.client import queue_request
    from reveal_plugins.types import RunInfo
    spool = str(tmp_path / "spool")
    run_dir = os.path.join(spool, "jobs", "7", "n")
    os.makedirs(run_dir)
    closed = {"schema": store.META_SCHEMA, "run": {"run_id": "slurm-7"}, "channels": [],
              "start": 100.0, "end": 160.0, "finalized_by": "epilog"}
    store.write_meta(run_dir, closed)
    queue_request(spool, {"op": "register", "run": RunInfo(
        run_id="slurm-7", source="slurm", job_id="7", run_dir=run_dir).to_dict()})
    queue_request(spool, {"op": "register", "run": RunInfo(
        run_id="slurm-8", source="slurm", job_id="8",
        run_dir=os.path.join(spool, "jobs", "8", "n")).to_dict()})
    a = Agent(spool, interval_s=0.05, segment_s=0.5)
    a.take_pending(os.path.join(spool, "pending"))
    assert [r.run_id for r in a.runs()] == ["slurm-8"]   # the live job's copy still registers
    assert store.read_meta(run_dir)["end"] == 160.0
    assert os.listdir(os.path.join(spool, "pending")) == []
    a.unregister("slurm-8", 0)
