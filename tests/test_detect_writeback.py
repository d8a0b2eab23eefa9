"""Issue 21, item 2, on a real recording: a job that writes a 400 MB checkpoint every 25 s
without fsync (its pages reach the disk later, by the kernel's writeback) under ``reveal
record``.  The node's disk writes are the job's own: no anomaly.  (Before the fix, the
writeback read as a 9-s ``storage`` anomaly with foreign writes as its evidence.)"""
import json
import os
import re
import subprocess
import sys

import pytest

from reveal_plugins.detect.batch.stages import OWN_IO

#: What writing and syncing a checkpoint moves: the run's bytes, the disks, the kernel's
#: dirty-page and writeback counters.
WRITES = re.compile(r"^(storage\.|memory\.vm\.(pgpgout|nr_written|nr_dirtied|nr_dirty|"
                    r"nr_writeback))")


# records real telemetry: not while a benchmark or another such test records
pytestmark = pytest.mark.usefixtures("quiet_machine")

JOB = """
import os, sys, time
path = sys.argv[1]
t0 = time.time(); nxt = t0 + 10; buf = os.urandom(1 << 20)
while time.time() - t0 < 70:
    if time.time() >= nxt:
        with open(path, "wb") as f:
            for _ in range(400):
                f.write(buf)
        nxt += 25
    sum(range(20000))
"""


def _disk_written() -> int:
    """Bytes written to whole block devices since boot (sectors of 512 bytes)."""
    total = 0
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            name = p[2]
            if name.startswith(("loop", "ram", "dm-", "sr")) or os.path.exists(
                    f"/sys/class/block/{name}/partition"):
                continue
            total += int(p[9]) * 512
    return total


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_jobs_own_checkpoint_writeback_is_not_foreign(tmp_path, report_schema_validate):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    before = _disk_written()
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "record", "--out",
                        str(tmp_path / "run"), "--", sys.executable, str(job),
                        str(tmp_path / "ckpt.bin")], capture_output=True, text=True,
                       timeout=300)
    written = _disk_written() - before
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    if written < 600e6:
        pytest.skip(f"the disk under {tmp_path} saw only {written / 1e6:.0f} MB of writes "
                    "(tmpfs?): no writeback to attribute")
    rep = report_schema_validate(json.loads((tmp_path / "run" / "report.json").read_text()))
    storage = [a for a in rep["anomalies"] if a["subsystem"] == "storage"
               or "storage.foreign.write_bytes" in json.dumps(a.get("foreign"))]
    assert storage == [], (storage, r.stdout[-3000:])


TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                     "train.py")


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("launcher", ["record", "torchrun"])
def test_fsynced_checkpoints_are_the_jobs_own_under_both_launchers(tmp_path, launcher,
                                                                     report_schema_validate):
    """Issue 21, item 2: a training job (examples/train.py) that saves a 300-MB checkpoint
    every 20 s and fsyncs it before renaming it into place, under ``reveal record`` and
    under ``reveal-torchrun``.  Its writes reach the disk while it waits in fsync, partly by
    the kernel's flusher threads: they are the job's, not a neighbour's."""
    pytest.importorskip("torch")
    run = tmp_path / "run"
    job = [TRAIN, "--model", "mlp", "--threads", "1", "--seconds", "75", "--log-every", "0",
           "--checkpoint-every-s", "20", "--checkpoint-extra-mb", "300", "--fsync",
           "--checkpoint-dir", str(tmp_path)]
    if launcher == "record":
        cmd = [sys.executable, "-m", "reveal_plugins.cli", "record", "--out", str(run), "--",
               sys.executable, *job]
    else:
        cmd = [sys.executable, "-m", "reveal_plugins.torch_ext.launcher", "--reveal-out",
               str(run), "--standalone", "--nproc-per-node", "1", *job]
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    before = _disk_written()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=330, env=env)
    written = _disk_written() - before
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    if written < 900e6:
        pytest.skip(f"the disk under {tmp_path} saw only {written / 1e6:.0f} MB of writes "
                    "(tmpfs?): no writeback to attribute")
    rep = report_schema_validate(json.loads((run / "report.json").read_text()))
    assert rep["status"] in ("ok", "partial"), rep.get("notes")
    # The claim is "the job's own": no storage finding blamed on a neighbour, and no finding
    # of the job's own writes without a process outside the run.  On a slow shared disk the
    # job's own fsync can stall its iterations (+34 % and +63 % in two CI runs); that is its
    # own I/O phase, an observation that names storage.run.*_bytes.  (Other things a shared
    # CI machine does meanwhile -- its page cache shrinking by 270 MB in one run, with the
    # iterations +12 % -- are not this test's claim.)
    keys = ("id", "subsystem", "families", "foreign", "symptoms", "evidence")
    blamed = [{k: a.get(k) for k in keys} for a in rep["anomalies"]
              if (a["subsystem"] == "storage" and "foreign" in a.get("families", []))
              or "storage.foreign" in json.dumps(a.get("foreign"))]
    assert blamed == [], (blamed, r.stdout[-3000:])
    own = [{k: a.get(k) for k in keys} for a in rep["anomalies"]
           if "foreign" not in a.get("families", [])
           and any(WRITES.match(e["channel"]) for e in a["evidence"][:5])]
    assert own == [], (own, r.stdout[-3000:])
    for o in rep["observations"]:
        if o["why_not_anomaly"].startswith(OWN_IO):
            assert "storage.run." in o["why_not_anomaly"], o
