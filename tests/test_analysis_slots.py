"""Issue 22 (low): one detached analysis per job, at most ``analysis_max_concurrent`` per node.
Two Epilogs of one job (the SPANK plugin's and a script Epilog, or a retry) analysed it twice
and published twice; a burst of job ends started one root analysis each."""
import json
import multiprocessing
import os
import time

import pytest

from reveal_plugins.detect.synth import SynthHost
from reveal_plugins.slurm import analysis_slots as slots
from reveal_plugins.slurm import hooks


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A spool, the hook configuration pointing at it, and a finished run of job 77."""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    run = SynthHost(2, seed=3).write_run(str(tmp_path / "run"), 30)

    def configure(**kw):
        toml = tmp_path / "slurm.toml"
        lines = [f'spool = "{spool}"', 'analysis_cap = "off"'] + [
            f"{k} = {json.dumps(v)}" for k, v in kw.items()]
        toml.write_text("\n".join(lines) + "\n")
        os.chmod(toml, 0o644)
    configure()
    monkeypatch.setenv("REVEAL_SLURM_CONFIG", str(tmp_path / "slurm.toml"))
    monkeypatch.setenv("REVEAL_SLURM_LOG", str(tmp_path / "hooks.log"))
    monkeypatch.setenv("REVEAL_SLURM_JOB_ID", "77")
    # analyze_job renices its own process (the Epilog's detached supervisor); here that is
    # pytest itself, whose CPU time would then count as "nice" for every later test
    monkeypatch.setattr("os.nice", lambda inc: 0)
    return str(spool), run, configure, tmp_path / "hooks.log"


def test_a_second_epilog_does_not_analyse_the_job_again(node):
    spool, run, _, logf = node
    assert hooks.analyze_job(run) == 0
    rep = os.path.join(run, "report.json")
    first = os.stat(rep).st_mtime_ns
    assert hooks.analyze_job(run) == 0
    assert os.stat(rep).st_mtime_ns == first
    assert "already analysed by an earlier Epilog" in logf.read_text()


def test_an_epilog_while_the_job_is_being_analysed_skips(node):
    spool, run, _, logf = node
    with slots.JobLock(spool, "77"):
        t0 = time.monotonic()
        assert hooks.analyze_job(run) == 0
        assert time.monotonic() - t0 < 5
    assert not os.path.exists(os.path.join(run, "report.json"))
    assert "another analysis of job 77 is running; this one is skipped" in logf.read_text()


def _hold_slot(spool, ready, release):
    fd = slots.acquire_slot(spool, 1, 0)
    assert fd is not None
    ready.set()
    release.wait(30)


def test_analyses_wait_for_a_slot_and_report_when_none_frees(node):
    spool, run, configure, logf = node
    configure(analysis_max_concurrent=1, analysis_timeout_s=1.0,
              analysis_timeout_per_hour_s=0.0)
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    other = multiprocessing.Process(target=_hold_slot, args=(spool, ready, release))
    other.start()            # another analysis (another process) holds the node's only slot
    try:
        assert ready.wait(10)
        assert hooks.analyze_job(run) == 0
    finally:
        release.set()
        other.join(10)
    rep = json.load(open(os.path.join(run, "report.json")))
    assert rep["status"] == "partial"
    assert "analysis_max_concurrent" in rep["status_reason"], rep["status_reason"]
    # the slot freed: the next Epilog of another job runs its analysis
    os.environ["REVEAL_SLURM_JOB_ID"] = "78"
    configure(analysis_max_concurrent=1)
    assert hooks.analyze_job(run) == 0
    assert json.load(open(os.path.join(run, "report.json")))["status"] != "partial"


def test_lock_files_are_never_followed_through_a_symlink(tmp_path):
    spool = tmp_path / "spool"
    (spool / "analysis").mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    os.symlink(victim, spool / "analysis" / "job-5.lock")
    with pytest.raises(OSError):
        with slots.JobLock(str(spool), "5"):
            pass
    assert victim.read_text() == "keep\n"
    os.chmod(spool / "analysis", 0o777)         # a lock directory others can write: refused
    with pytest.raises(PermissionError):
        slots.acquire_slot(str(spool), 1, 0)
