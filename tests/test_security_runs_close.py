"""Runs that never close (issue 22): a full disk while the agent closes a run, a Slurm
NodeName that differs from the host name, and retention of runs whose ``end`` is null.

The full disk is a real one (a 3 MiB tmpfs mounted over the spool) where the test may mount
file systems (root); an injected ENOSPC at the ``meta.json`` write covers the rest."""
import errno
import os
import socket
import time

import pytest

from reveal_plugins.store import store
from reveal_plugins.types import RunInfo

from fixtures_tmpfs import mounted_tmpfs


def _agent(spool, **kw):
    from reveal_plugins.agent.daemon import Agent
    kw.setdefault("interval_s", 0.05)
    kw.setdefault("segment_s", 0.2)
    return Agent(spool, **kw)


def _abandon(agent):
    """What kill -9 leaves: the runs stay open on disk, nothing is finished."""
    for st in list(agent._runs.values()):
        for p in st.probes:
            p.close()
    agent._runs.clear()
    for p in agent.probes:
        p.close()


def _wait(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


@pytest.fixture
def tiny_fs():
    with mounted_tmpfs("size=3m,mode=0755", prefix="reveal-full-") as base:
        yield base


def _fill(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"\0" * 65536
        while True:
            try:
                os.write(fd, chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                chunk = chunk[:len(chunk) // 2]
                if not chunk:
                    return
    finally:
        os.close(fd)


def test_a_disk_full_at_run_end_leaves_a_run_the_next_agent_closes(tiny_fs):
    spool = os.path.join(tiny_fs, "spool")
    run_dir = os.path.join(spool, "jobs", "1", "n1")
    a = _agent(spool)
    a.register(RunInfo(run_id="slurm-1", source="slurm", job_id="1", host="n1",
                       run_dir=run_dir))
    for _ in range(8):
        a.sample_once()
        time.sleep(0.05)
    _fill(os.path.join(tiny_fs, "filler"))
    a.unregister("slurm-1", 0)           # meta.json cannot be rewritten: ENOSPC
    _abandon(a)                          # ... and that agent is gone
    assert store.read_meta(run_dir)["end"] is None   # the disk really was full

    b = _agent(spool)
    b.start()
    try:
        # the finished run is not adopted: nobody samples a job that is over
        assert "slurm-1" not in b._runs
        os.unlink(os.path.join(tiny_fs, "filler"))   # the operator frees space
        assert _wait(lambda: store.read_meta(run_dir).get("end") is not None), \
            "the agent never closed the run once the disk had room again"
    finally:
        b.stop()
    meta = store.read_meta(run_dir)
    assert meta["end"] >= meta["start"] and meta.get("finalized_by")
    assert "slurm-1" not in b._runs


def test_enospc_at_run_end_is_retried_by_the_same_agent(tmp_path, monkeypatch):
    spool = str(tmp_path / "spool")
    run_dir = os.path.join(spool, "jobs", "2", "n1")
    a = _agent(spool)
    a.register(RunInfo(run_id="slurm-2", source="slurm", job_id="2", host="n1",
                       run_dir=run_dir))
    a.sample_once()
    real = store.write_meta
    full = {"on": True}

    def write_meta(d, meta):
        if full["on"] and meta.get("end") is not None:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(d, meta)
    monkeypatch.setattr(store, "write_meta", write_meta)
    a.unregister("slurm-2", 3)
    assert store.read_meta(run_dir)["end"] is None
    # a restarted agent while the disk is still full: not adopted, not sampled
    _abandon(a)
    b = _agent(spool)
    assert b.adopt_open_runs() == [] and not b._runs
    full["on"] = False
    b.close_unfinished()
    meta = store.read_meta(run_dir)
    assert meta["end"] is not None and meta["exit_code"] == 3
    _abandon(b)


def test_adoption_when_the_node_name_is_not_the_host_name(tmp_path):
    """Slurm's NodeName (SLURMD_NODENAME, the directory name and run.host) differs from
    gethostname(): the restarted agent of the same machine still adopts the open run."""
    spool = str(tmp_path / "spool")
    node = "cn-" + socket.gethostname()[:8] + "-x"
    run_dir = os.path.join(spool, "jobs", "42", node)
    a = _agent(spool)
    assert a.host != node
    a.register(RunInfo(run_id="slurm-42", source="slurm", job_id="42", host=node,
                       run_dir=run_dir))
    a.sample_once()
    _abandon(a)
    b = _agent(spool)
    b.start()
    try:
        assert "slurm-42" in b._runs
        b.unregister("slurm-42", 0)
    finally:
        b.stop()
    meta = store.read_meta(run_dir)
    assert meta["end"] is not None and meta["restarts"] == 1 and meta["host"] == node


def test_another_machines_open_run_is_not_adopted(tmp_path):
    spool = str(tmp_path / "spool")
    run_dir = os.path.join(spool, "jobs", "43", "othernode")
    os.makedirs(run_dir)
    store.write_meta(run_dir, {"schema": store.META_SCHEMA, "channels": [], "start": 1.0,
                               "end": None, "host": "othernode",
                               "run": {"run_id": "slurm-43", "run_dir": run_dir},
                               "agent": {"pid": 1, "hostname": "other-machine"}})
    b = _agent(spool)
    assert b.adopt_open_runs() == []
    _abandon(b)


def test_retention_removes_unclosed_runs_once_idle_past_the_limit(tmp_path):
    spool = tmp_path / "spool"
    now = time.time()
    old = now - 40 * 86400
    for job, touched in (("4", old), ("5", now - 3600)):
        d = spool / "jobs" / job / "n"
        (d / "segments").mkdir(parents=True)
        store.write_meta(str(d), {"schema": store.META_SCHEMA, "run": {}, "channels": [],
                                  "start": now - 50 * 86400, "end": None})
        (d / "events.jsonl").write_text('{"t": 1, "event": "run_start"}\n')
        for p in (d / "meta.json", d / "events.jsonl", d / "segments", d):
            os.utime(p, (touched, touched))
    a = _agent(str(spool), config={"retention_days": 30})
    try:
        assert a.prune_old_jobs() == ["4"]
        assert sorted(os.listdir(spool / "jobs")) == ["5"]
    finally:
        _abandon(a)
