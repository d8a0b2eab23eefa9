"""The permission model on a real Slurm: another user can neither act on a job through the
agent's socket nor through the (world-writable, sticky) pending queue, and a symlink planted in
that queue is never followed by root."""
import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SEND = ("import json, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])\n"
        "s.sendall(sys.argv[2].encode() + b'\\n'); print(s.makefile().readline())\n")


def send_as(user, sock, req):
    r = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", SEND, sock,
                        json.dumps(req)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_other_user_cannot_act_on_a_job(slurm_cluster, slurm_users, tmp_path):
    a, b = slurm_users
    c = slurm_cluster
    c.run_batch("#!/bin/sh\ntrue\n")  # an agent is running
    job_id = c.sbatch("#!/bin/sh\nsrun sleep 4\n", user=a).stdout.strip()
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(c.run_dir(job_id), "meta.json")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    sock = os.path.join(c.spool, "agent.sock")
    run_id = f"slurm-{job_id}"
    r = send_as(b, sock, {"op": "event", "run_id": run_id, "event": "step_start",
                          "step_id": "forged"})
    assert not r["ok"] and "may not act" in r["error"]
    r = send_as(b, sock, {"op": "unregister", "run_id": run_id})
    assert not r["ok"]
    r = send_as(b, sock, {"op": "register", "run": {
        "run_id": "slurm-999999", "source": "slurm", "uid": 0,
        "run_dir": os.path.join(c.spool, "jobs", "999999", c.node)}})
    assert not r["ok"] and "may not register" in r["error"]
    r = send_as(b, sock, {"op": "shutdown"})
    assert not r["ok"]
    # The job's own user may mark its steps.
    assert send_as(a, sock, {"op": "event", "run_id": run_id, "event": "note",
                             "message": "from the user"})["ok"]

    # The pending queue is root's alone (0700): B can plant neither a symlink nor a forged
    # request (had an older world-writable queue let it, the agent would drop them unread).
    target = tmp_path / "root-owned-target"
    target.write_text("untouched\n")
    os.chmod(tmp_path, 0o755)
    pend = os.path.join(c.spool, "pending")
    forged = json.dumps({"op": "register", "run": {
        "run_id": "slurm-888888", "source": "slurm", "uid": 0,
        "run_dir": os.path.join(c.spool, "jobs", "888888", c.node)}})
    planted = subprocess.run(["runuser", "-u", b, "--", "sh", "-c",
                              f"ln -s {target} {pend}/0000000001.000000-evil.json; "
                              f"echo '{forged}' > {pend}/0000000002.000000-forged.json"],
                             capture_output=True, text=True)
    assert planted.returncode != 0 and "Permission denied" in planted.stderr
    assert os.stat(pend).st_mode & 0o7777 == 0o700 and os.stat(pend).st_uid == 0
    job = c.wait(job_id)
    assert job.state == "COMPLETED"
    time.sleep(1.5)  # the agent reads the queue every 0.5 s
    assert target.read_text() == "untouched\n"
    assert not os.path.exists(os.path.join(c.spool, "jobs", "888888"))
    assert not os.path.exists(os.path.join(c.spool, "jobs", "999999"))
    meta = json.load(open(os.path.join(c.run_dir(job_id), "meta.json")))
    assert "forged" not in {s["step_id"] for s in meta["steps"]}
    assert meta["exit_code"] == 0  # B's unregister did not close A's job early
