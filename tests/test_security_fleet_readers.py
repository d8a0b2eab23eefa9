"""A root fleet pass over user-writable run directories (``reveal-runs/*``, issue 22).

The attacker is an ordinary user (``reveal-ta``) who owns a run directory the pass indexes:
``events.jsonl -> /dev/zero``, a FIFO, a symlinked ``meta.json`` of another user, a crafted
segment whose change log expands to gigabytes, a run that claims another user and another
team's workload.  Each pass runs in a child process with a memory limit and a timeout, so the
unfixed code fails the test instead of taking the machine down."""
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reveal_plugins.store import store

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="attacks on a root fleet pass")

MEM_LIMIT = 1536 << 20


def _child(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter limited to MEM_LIMIT of address space."""
    pre = ("import resource\n"
           f"resource.setrlimit(resource.RLIMIT_AS, ({MEM_LIMIT}, {MEM_LIMIT}))\n")
    try:
        # Arrow's default allocator reserves address space up front: use malloc under the limit
        env = dict(os.environ, ARROW_DEFAULT_MEMORY_POOL="system")
        return subprocess.run([sys.executable, "-c", pre + code], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the pass hung for {timeout} s (blocked on a FIFO?): {e.stderr!r}")


def _index(paths, out, timeout=60):
    r = _child("import json\nfrom reveal_plugins.fleet.index import build_index\n"
               f"print(json.dumps(build_index({paths!r}, {out!r}, None)))", timeout)
    assert r.returncode == 0, f"the pass failed ({r.returncode}): {r.stderr[-3000:]}"
    rows = pq.read_table(os.path.join(out, "runs")).to_pylist()
    return json.loads(r.stdout.strip().splitlines()[-1]), {
        os.path.basename(x["run_dir"]): x for x in rows}


def _chown_tree(path, uid, gid):
    for dirpath, dirs, files in os.walk(path):
        os.lchown(dirpath, uid, gid)
        for n in dirs + files:
            os.lchown(os.path.join(dirpath, n), uid, gid)


@pytest.fixture
def homes(slurm_users):
    """Two users' ``reveal-runs`` with one clean run each (written by the real store)."""
    from reveal_plugins.detect.synth import SynthHost
    base = tempfile.mkdtemp(prefix="reveal-fleetsec-")
    os.chmod(base, 0o755)
    out = {}
    for user in slurm_users:
        pw = pwd.getpwnam(user)
        runs = os.path.join(base, user, "reveal-runs")
        d = os.path.join(runs, "good")
        SynthHost(2, seed=1).write_run(d, 20, 0.1)
        meta = store.read_meta(d)
        meta["run"].update(user=user, uid=pw.pw_uid, extra={"job_name": "train-llm"})
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)
        _chown_tree(os.path.join(base, user), pw.pw_uid, pw.pw_gid)
        out[user] = runs
    yield base, out
    shutil.rmtree(base, ignore_errors=True)


def _attacker_run(homes, slurm_users, name):
    base, runs = homes
    a = slurm_users[0]
    src = os.path.join(runs[a], "good")
    dst = os.path.join(runs[a], name)
    shutil.copytree(src, dst, symlinks=True)
    pw = pwd.getpwnam(a)
    _chown_tree(dst, pw.pw_uid, pw.pw_gid)
    return dst, pw


def test_events_symlinked_to_dev_zero_is_not_read(homes, slurm_users, tmp_path):
    d, pw = _attacker_run(homes, slurm_users, "zero")
    if os.path.lexists(os.path.join(d, "events.jsonl")):
        os.unlink(os.path.join(d, "events.jsonl"))
    os.symlink("/dev/zero", os.path.join(d, "events.jsonl"))
    os.lchown(os.path.join(d, "events.jsonl"), pw.pw_uid, pw.pw_gid)
    stats, rows = _index([homes[0]], str(tmp_path / "F"))
    assert stats["runs"] == 3
    assert "events.jsonl" in (rows["zero"]["error"] or "") and \
        "symbolic link" in rows["zero"]["error"]
    with pytest.raises(store.StoreError, match="events.jsonl.*symbolic link"):
        store.read_events(d)


@pytest.mark.parametrize("name", ["events.jsonl", "meta.json", "report.json"])
def test_a_fifo_does_not_hang_the_pass(homes, slurm_users, tmp_path, name):
    d, pw = _attacker_run(homes, slurm_users, "fifo")
    p = os.path.join(d, name)
    if os.path.exists(p):
        os.unlink(p)
    os.mkfifo(p)
    os.chown(p, pw.pw_uid, pw.pw_gid)
    stats, rows = _index([homes[0]], str(tmp_path / "F"), timeout=60)
    assert stats["runs"] == 3
    err = rows["fifo"]["error"] or ""
    assert name in err and "not a regular file" in err, err


def test_symlinked_meta_of_another_user_is_not_indexed(homes, slurm_users, tmp_path):
    a, b = slurm_users
    victim = os.path.join(homes[1][b], "good")
    secret = store.read_meta(victim)
    secret["run"]["extra"] = {"job_name": "secret-project", "account": "team-b"}
    with open(os.path.join(victim, "meta.json"), "w") as f:
        json.dump(secret, f)
    os.chmod(os.path.join(victim, "meta.json"), 0o600)
    d, pw = _attacker_run(homes, slurm_users, "stolen")
    os.unlink(os.path.join(d, "meta.json"))
    os.symlink(os.path.join(victim, "meta.json"), os.path.join(d, "meta.json"))
    os.lchown(os.path.join(d, "meta.json"), pw.pw_uid, pw.pw_gid)
    _, rows = _index([homes[0]], str(tmp_path / "F"))
    row = rows["stolen"]
    assert row["status"] == "unreadable" and "meta.json" in row["error"]
    assert row["workload"] is None and row["user"] in (None, a)
    assert "secret-project" not in json.dumps(row)


def test_identity_comes_from_the_owner_not_from_the_run(homes, slurm_users, tmp_path):
    """A run owned by A that says it is B's, of B's team's workload: indexed as A's, and
    its workload kept apart from the team's (it cannot move their fleet baseline)."""
    a, b = slurm_users
    d, _ = _attacker_run(homes, slurm_users, "forged")
    meta = store.read_meta(d)
    meta["run"].update(user=b, uid=pwd.getpwnam(b).pw_uid,
                       extra={"workload": "train-llm", "account": "team-b"})
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    _, rows = _index([homes[0]], str(tmp_path / "F"))
    assert rows["forged"]["user"] == a
    assert rows["forged"]["workload"] != "train-llm" and a in rows["forged"]["workload"]
    # root-written runs (the agent's spool: Slurm's identity) keep what they say
    spool_run = os.path.join(str(tmp_path), "spool", "jobs", "7", "n1")
    shutil.copytree(os.path.join(homes[1][b], "good"), spool_run)
    _chown_tree(os.path.join(str(tmp_path), "spool"), 0, 0)
    _, rows = _index([os.path.join(str(tmp_path), "spool")], str(tmp_path / "G"))
    assert rows["n1"]["user"] == b and rows["n1"]["workload"] == "train-llm"


def _bomb_segment(path, ticks, t0_ms=1_790_000_000_000):
    """A reveal segment of ``ticks`` sample rows that compresses to almost nothing."""
    names = pa.array([store.SAMPLE_CHANNEL, "cpu.c0"], pa.string())
    codes = np.zeros(ticks + 1, np.int32)
    codes[-1] = 1
    t_ms = np.arange(t0_ms, t0_ms + ticks + 1, dtype=np.int64)
    t_ms[-1] = t0_ms
    vals = np.zeros(ticks + 1)
    schema = pa.schema([pa.field("channel", pa.dictionary(pa.int32(), pa.string())),
                        pa.field("t_ms", pa.int64()), pa.field("value", pa.float64())],
                       metadata={b"reveal": store.SEGMENT_FORMAT.encode()})
    table = pa.Table.from_arrays([pa.DictionaryArray.from_arrays(pa.array(codes), names),
                                  pa.array(t_ms), pa.array(vals)], schema=schema)
    pq.write_table(table, path, compression="zstd", use_dictionary=["channel"],
                   column_encoding={"t_ms": "DELTA_BINARY_PACKED"})


def test_a_tiny_segment_cannot_force_a_huge_allocation(tmp_path):
    seg = str(tmp_path / "seg-000001.parquet")
    _bomb_segment(seg, 2_000_000)
    assert os.path.getsize(seg) < 1 << 20          # a tiny file ...
    names = [f"cpu.c{i}" for i in range(2000)]     # ... and a meta.json declaring 2000 channels
    r = _child("from reveal_plugins.store import store\n"
               "try:\n"
               f"    store.read_segment({seg!r}, {names!r})\n"
               "except store.StoreError as e:\n"
               "    print('REFUSED', e)\n"
               "except MemoryError:\n"
               "    print('MEMORYERROR')\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("REFUSED") and seg in r.stdout, r.stdout + r.stderr[-2000:]


def test_oversized_files_are_refused_with_the_file_named(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    with open(d / "meta.json", "wb") as f:
        f.truncate(store.MAX_META_BYTES + 1)        # sparse: no disk used
    with pytest.raises(store.StoreError, match=r"meta\.json.*bytes"):
        store.read_meta(str(d))
    with open(d / "events.jsonl", "wb") as f:
        f.truncate(store.MAX_EVENTS_BYTES + 1)
    with pytest.raises(store.StoreError, match=r"events\.jsonl.*bytes"):
        store.read_events(str(d))


def test_reveal_record_takes_the_user_from_the_account_not_from_USER(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, USER="someone-else", LOGNAME="someone-else", LNAME="x",
               USERNAME="x")
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "record", "--out", str(out),
                        "--no-analyze", "--", sys.executable, "-c", "pass"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    meta = store.read_meta(str(out))
    assert meta["run"]["user"] == pwd.getpwuid(os.getuid()).pw_name
