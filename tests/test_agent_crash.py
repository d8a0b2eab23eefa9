"""kill -9 of the agent at 50 random moments of one run.

Every finished segment stays readable, ``meta.json`` is never empty or torn, and the next hook
(the Epilog's analysis, ``finalize_orphan``) closes the run from what is on disk.  The agent is
forked from this process (imports already done) so 50 crashes take seconds, not minutes.
"""
import json
import os
import random
import signal
import time

from reveal_plugins.telemetry import store
from reveal_plugins.telemetry.finalize import finalize_orphan


def _agent_child(spool: str, run_dir: str) -> None:
    from reveal_plugins.telemetry.agent import Agent
    from reveal_plugins.types import RunInfo
    try:
        a = Agent(spool, interval_s=0.01, segment_s=0.05)
        a.register(RunInfo(run_id="r", source="test", run_dir=run_dir))
        a._sampling_loop()  # until killed
    finally:
        os._exit(1)


def test_kill9_at_random_moments_loses_only_the_open_segment(tmp_path):
    rng = random.Random(7)
    spool, run_dir = str(tmp_path / "spool"), str(tmp_path / "run")
    os.makedirs(spool)
    kills = 0
    for _ in range(50):
        pid = os.fork()
        if pid == 0:
            _agent_child(spool, run_dir)
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
