"""Low items of issue 22: a bad file in the pending queue stopping the agent's housekeeping,
torn ``events.jsonl`` lines after a short write, ``reveal import reveal-tsv`` of a file named
``...tsv`` writing outside ``--out``, and root's configuration checked by path then opened by
path (a symlink re-pointed in between)."""
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from reveal_plugins.store import store
from reveal_plugins.types import RunInfo

from fixtures_tmpfs import mounted_tmpfs

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_failing_pending_queue_does_not_stop_reaping(tmp_path, monkeypatch):
    """pending.take raising (an unreadable queue entry, a bad directory) must not end the
    housekeeping thread: a run whose owner died is still closed."""
    from reveal_plugins.agent import housekeeping
    from reveal_plugins.agent.daemon import Agent

    def broken(*a, **k):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(housekeeping.pending, "take", broken)
    spool = str(tmp_path / "spool")
    a = Agent(spool, interval_s=0.1, segment_s=0.5)
    a.start()
    try:
        owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
        a.register(RunInfo(run_id="r1", source="test", run_dir=str(tmp_path / "run")),
                   owner_pid=owner.pid)
        owner.wait()
        end = time.monotonic() + 10
        while time.monotonic() < end and "r1" in a._runs:
            time.sleep(0.1)
        assert "r1" not in a._runs, "the owner died but housekeeping never closed the run"
        assert store.read_meta(str(tmp_path / "run"))["end"] is not None
    finally:
        a.stop()


@pytest.fixture
def tiny_fs():
    with mounted_tmpfs("size=1m", prefix="reveal-short-") as base:
        yield base


def test_a_short_write_never_leaves_a_torn_event_line(tiny_fs):
    run = os.path.join(tiny_fs, "run")
    os.makedirs(run)
    store.append_event(run, "run_start")
    # fill the file system: what is left is the rest of events.jsonl's last page
    fd = os.open(os.path.join(tiny_fs, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    chunk = b"\0" * 65536
    while chunk:
        try:
            os.write(fd, chunk)
        except OSError:
            chunk = chunk[:len(chunk) // 2]
    os.close(fd)
    with pytest.raises(OSError):
        store.append_event(run, "big", blob="x" * 20000)   # does not fit: a short write
    os.unlink(os.path.join(tiny_fs, "filler"))
    store.append_event(run, "after", n=1)
    with open(os.path.join(run, "events.jsonl"), "rb") as f:
        lines = f.read().splitlines()
    assert [json.loads(x)["event"] for x in lines] == ["run_start", "after"]


def test_import_of_a_file_named_dots_tsv_stays_inside_out(tmp_path):
    sys.path.insert(0, HERE)
    try:
        from test_import_reveal_tsv import write_reveal_tsv
    finally:
        sys.path.remove(HERE)
    from reveal_plugins.importers.reveal_tsv import import_file
    src = tmp_path / "in"
    src.mkdir()
    f = write_reveal_tsv(str(src / "...tsv"), seconds=5, episode=None)
    out = tmp_path / "a" / "out"
    out.mkdir(parents=True)
    runs = import_file(f, str(out))
    assert runs
    for r in runs:
        real = os.path.realpath(r)
        assert real.startswith(str(out) + os.sep), f"{r} is outside --out {out}"
    assert sorted(os.listdir(tmp_path / "a")) == ["out"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the trust rule applies to root")
def test_config_symlink_repointed_after_the_check_is_not_loaded(tmp_path, monkeypatch):
    """The path is checked, then opened: a symlink in sticky /tmp re-pointed in between must
    not make root load another user's file."""
    from reveal_plugins import trust
    from reveal_plugins.slurm.config import ConfigError, load_config
    good_dir = tempfile.mkdtemp(prefix="reveal-trusted-")        # root 0700 under sticky /tmp
    evil_dir = tempfile.mkdtemp(prefix="reveal-evil-")
    try:
        good = os.path.join(good_dir, "slurm.toml")
        with open(good, "w") as f:
            f.write('analyzer = "good:run"\n')
        evil = os.path.join(evil_dir, "slurm.toml")
        with open(evil, "w") as f:
            f.write('analyzer = "evil:run"\n')
        os.chown(evil, 65534, 65534)
        link = os.path.join(evil_dir, "link.toml")
        os.symlink(good, link)
        real_check = trust.untrusted_reason

        def racing_check(path):
            why = real_check(path)
            tmp = link + ".new"
            os.symlink(evil, tmp)
            os.replace(tmp, link)          # the attacker wins the race
            return why
        monkeypatch.setattr(trust, "untrusted_reason", racing_check)
        try:
            cfg = load_config(link)
        except ConfigError:
            return                           # refused: fine
        assert cfg.analyzer == "good:run"
    finally:
        shutil.rmtree(good_dir, ignore_errors=True)
        shutil.rmtree(evil_dir, ignore_errors=True)
