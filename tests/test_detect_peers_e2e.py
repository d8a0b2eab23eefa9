"""Peer comparison end to end on real recordings: two "nodes" of one synchronous job on this
machine, each its own CPU (``taskset`` + the agent's ``REVEAL_CPUS``), each recorded by its own
``reveal record`` agent into ``JOB/node0`` and ``JOB/node1`` at the same time; a stress-ng CPU
hog pinned to node 1's CPU for a span.  ``reveal report JOB --format json`` must name node 1
(and validate against the schema); a clean pair must name no node for the job's own reasons.
~45 s each (a hog run on a busy machine is recorded twice)."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "peer_job.py")

# records real telemetry: not while a benchmark or another such test records (quiet_machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(200),
              pytest.mark.usefixtures("quiet_machine"),
              pytest.mark.skipif(not shutil.which("stress-ng") or not shutil.which("taskset")
                                 or (os.cpu_count() or 1) < 2,
                                 reason="needs stress-ng, taskset and 2 CPUs")]


def _port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def record_pair(job_dir, seconds, hog=None):
    """Record the 2-node job; ``hog = (node, at_s, for_s)``.  Returns the hog's (start, end)
    in unix seconds, or None."""
    port = _port()
    env = dict(os.environ, REVEAL_SEGMENT_S="2", PYTHONPATH=ROOT)
    procs = []
    for k in (0, 1):
        out = os.path.join(job_dir, f"node{k}")
        procs.append(subprocess.Popen(
            ["taskset", "-c", str(k), sys.executable, "-m", "reveal_plugins.cli", "record",
             "--no-analyze", "--out", out, "--", sys.executable, JOB, "--rank", str(k),
             "--port", str(port), "--seconds", str(seconds), "--run-dir", out],
            env=dict(env, REVEAL_CPUS=str(k)), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
        time.sleep(0.3)
    span = None
    if hog:
        node, at, dur = hog
        time.sleep(at)
        t0 = time.time()
        subprocess.run(["taskset", "-c", str(node), "stress-ng", "--cpu", "1", "--timeout",
                        f"{dur}s", "--quiet"], check=True, timeout=dur + 30)
        span = (t0, time.time())
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        assert p.returncode == 0, out[-3000:]
    return span


def job_json(job_dir):
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "report", job_dir,
                        "--format", "json"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def validate_job(doc):
    import jsonschema
    from conftest import SCHEMA_PATH
    schema = json.loads(SCHEMA_PATH.read_text())
    v = jsonschema.Draft202012Validator(schema)
    v.evolve(schema=schema["$defs"]["job_report"]).validate(doc)


def foreign_cores(run_dir, a, b):
    """Mean foreign CPU (cores) of a node between a and b (unix seconds)."""
    import numpy as np

    from reveal_plugins.detect.peers.job import load_node
    s = load_node(run_dir)
    sel = (s.t >= a + 2) & (s.t <= b - 2)
    return float(np.nanmean(s.X[sel, s.names.index("cpu.foreign.cores")]))


def test_hog_on_one_nodes_cpu_names_that_node(tmp_path):
    for attempt in range(2):
        job = str(tmp_path / f"job{attempt}")
        a, b = record_pair(job, 40, hog=(1, 17, 15))
        # this machine is shared: when something else loaded the nodes' CPUs before the hog
        # or node 0's during it, the nodes were disturbed beside the injection and no
        # comparison can be held to name exactly node 1; record again
        quiet = [foreign_cores(os.path.join(job, "node0"), a, b)] + [
            foreign_cores(os.path.join(job, f"node{k}"), a - 8, a) for k in (0, 1)]
        if max(quiet) < 0.25:
            break
    else:
        pytest.skip("other processes loaded the nodes' CPUs during both recordings "
                    f"(foreign cores {quiet}): busy machine")
    doc = job_json(job)
    validate_job(doc)
    peers = doc["peers"]
    assert [n["node"] for n in peers["nodes"]] == ["node0", "node1"]
    during = [s for s in peers["suspects"] if s["start"] <= b and s["end"] >= a]
    assert during and {s["node"] for s in during} == {"node1"}, peers
    sp = during[0]
    assert sp["subsystem"] == "cpu" and sp["rank"] == 1
    assert a - 3 <= sp["start"] <= a + 8 and b - 8 <= sp["end"] <= b + 5, (sp, a, b)
    fe = [e for e in sp["evidence"] if e["channel"].startswith("cpu.foreign.")]
    assert fe and fe[0]["observed"] > 0.3 > fe[0]["peers"], sp["evidence"]
    assert sp["impact"]["iteration_time_pct"] > 10        # the job waited for node 1
    assert sp["hints"][0]["rule"] == "peer_straggler" and "node1" in sp["hints"][0]["action"]
    assert "node node1 (rank 1) is the suspect: cpu" in doc["summary"]
    # the text report marks it, one line per node
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "report", job],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    lines = [x for x in r.stdout.splitlines() if x.strip().startswith(("node0", "=> node1"))]
    assert any("SUSPECT CPU" in x for x in lines) and any(x.strip().startswith("node0") and
                                                           x.rstrip().endswith("ok")
                                                           for x in lines), r.stdout[:2000]


def test_clean_pair_names_no_node_for_the_jobs_own_reasons(tmp_path):
    """Nothing injected.  This machine is shared (other tests may run beside this one), so a
    stray process can land on one node's CPU for a while -- that is a real foreign load and
    may be named; what must never be named is a node whose only difference is the job."""
    job = str(tmp_path / "job")
    record_pair(job, 40)
    doc = job_json(job)
    validate_job(doc)
    for sp in doc["peers"]["suspects"]:
        ev = {e["channel"]: e for e in sp["evidence"]}
        f = ev.get("cpu.foreign.cores") or ev.get("cpu.foreign.system_cores") or {}
        assert (f.get("observed") or 0) - (f.get("peers") or 0) >= 0.25, sp
    assert doc["peers"]["analysis"]["windows_compared"] >= 20


NODE = """
import subprocess, sys
from reveal_plugins.recording import Recording
out, cmd = sys.argv[1], sys.argv[2:]
with Recording(out=out, interval_s=0.1, source="local", command=cmd, live=True,
               analyze=False, run_id="job-77") as rec:
    rec.exit_code = subprocess.call(cmd)
sys.exit(rec.exit_code or 0)
"""


def test_live_peer_suspect_named_while_the_job_runs(tmp_path):
    """Both nodes recorded with live mode by their own agents, their run directories side by
    side: the agents publish their horizons and name node 1 soon after the hog's start (goal
    10 s; held to 15 s here), as a ``peer_suspect`` event in the run's events."""
    from reveal_plugins.store import store
    job = str(tmp_path / "job")
    port = _port()
    env = dict(os.environ, REVEAL_SEGMENT_S="2", PYTHONPATH=ROOT)
    procs = []
    for k in (0, 1):
        out = os.path.join(job, f"node{k}")
        procs.append(subprocess.Popen(
            ["taskset", "-c", str(k), sys.executable, "-c", NODE, out, sys.executable, JOB,
             "--rank", str(k), "--port", str(port), "--seconds", "55", "--run-dir", out],
            env=dict(env, REVEAL_CPUS=str(k)), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
        time.sleep(0.3)
    time.sleep(35)        # 15 s of start-up grace and a reference of peers agreeing
    a = time.time()
    subprocess.run(["taskset", "-c", "1", "stress-ng", "--cpu", "1", "--timeout", "14s",
                    "--quiet"], check=True, timeout=60)
    b = time.time()
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-3000:]
    found = [e for k in (0, 1) for e in store.read_events(os.path.join(job, f"node{k}"))
             if e.get("event") == "peer_suspect"]
    quiet = max(foreign_cores(os.path.join(job, "node0"), a, b),
                foreign_cores(os.path.join(job, "node1"), a - 10, a))
    if quiet >= 0.25 and not any(e["suspect"]["node"] == "node1" for e in found):
        pytest.skip(f"other processes loaded the nodes' CPUs ({quiet:.2f} cores): busy machine")
    during = [e["suspect"] for e in found if e["suspect"]["start"] <= b + 1]
    assert during, found
    first = min(during, key=lambda s: s["detected_at"])
    assert first["node"] == "node1" and first["subsystem"] == "cpu" and first["live"], first
    # the goal is <= 10 s; measured p50 10.9 s on this shared VM (docs/detection.md), so the
    # test holds the live path to 15 s: a regression (no name, or much later) still fails
    assert first["detected_at"] - a <= 15.0, (first["detected_at"] - a, first)
