"""The root agent under a hostile local user, and under kill -9: figures for docs/protocol.md.

    python benchmarks/reliability/run.py [--seconds 30] [--kills 50]     (as root)

Attack (tests/hostile_client.py as ``nobody``): an oversized line, 2,000 idle connections, 50
slow-drip clients and an event flood on its own run, for ``--seconds``.  Meanwhile root pings
every 50 ms and registers a new run every 0.5 s.  Reference in the same run: the same pings
with no attack.  Then ``--kills`` kill -9s of a forked agent at random moments of one run.
Last line: ``worst_root_ms=… p99_root_ms=… baseline_p99_ms=… requests_per_s=… conns_held_max=…
rss_mb=… kills=… segments_lost=…``.  Results: ``benchmarks/reliability/results/
reliability-<split>-<date>.json`` (``--results``; the :mod:`results` header; ``--split test`` is
refused from a dirty tree).  ``results/2026-12-03.txt`` holds the figures of an earlier version.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import results as bench_results  # noqa: E402

from reveal_plugins.store import store  # noqa: E402
from reveal_plugins.agent.client import AgentClient  # noqa: E402


def _root_probe(client: AgentClient, seconds: float, jobs: str, tag: str) -> dict:
    lat, reg, k = [], [], 0
    t_end = time.monotonic() + seconds
    conns = 0
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        client.ping(timeout=5)
        lat.append(time.monotonic() - t0)
        if k % 10 == 0:
            conns = max(conns, client.status()["server"]["connections"])
            t0 = time.monotonic()
            rid = f"{tag}{k}"
            client.register({"run_id": rid, "source": "bench",
                             "run_dir": os.path.join(jobs, rid, "n")})
            client.unregister(rid, 0)
            reg.append(time.monotonic() - t0)
        k += 1
        time.sleep(0.05)
    return {"lat": np.array(lat), "reg": np.array(reg), "conns": conns}


def attack(seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="reveal-rel-")
    os.chmod(d, 0o755)
    spool = os.path.join(d, "spool")
    agent = subprocess.Popen([sys.executable, "-m", "reveal_plugins.agent.daemon", "--spool",
                              spool, "--log-file", os.path.join(d, "agent.log")],
                             env=dict(os.environ, PYTHONPATH=ROOT))
    client = AgentClient(os.path.join(spool, "agent.sock"))
    while not client.alive(0.2):
        time.sleep(0.05)
    jobs = os.path.join(spool, "jobs")
    base = _root_probe(client, 5.0, jobs, "base")
    nobody = pwd.getpwnam("nobody")
    client.register({"run_id": "victim", "source": "bench", "uid": nobody.pw_uid,
                     "gid": nobody.pw_gid, "run_dir": os.path.join(jobs, "victim", "n")})
    s0 = client.status()["server"]
    att = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "hostile_client.py"),
                            client.socket_path, "--seconds", str(seconds), "--run-id", "victim"],
                           user=nobody.pw_uid, group=nobody.pw_gid, stdout=subprocess.PIPE,
                           text=True, env={"PATH": "/usr/bin:/bin"})
    time.sleep(1.0)
    under = _root_probe(client, seconds - 2, jobs, "att")
    out, _ = att.communicate()
    s1 = client.status()["server"]
    got = json.loads(out.strip().splitlines()[-1])
    with open(f"/proc/{agent.pid}/status") as f:
        rss = next(int(x.split()[1]) / 1024 for x in f if x.startswith("VmHWM:"))
    log_kb = os.path.getsize(os.path.join(d, "agent.log")) / 1024
    agent.terminate()
    agent.wait(10)
    return {"baseline_p99_ms": float(np.percentile(base["lat"], 99) * 1e3),
            "worst_root_ms": float(under["lat"].max() * 1e3),
            "p99_root_ms": float(np.percentile(under["lat"], 99) * 1e3),
            "worst_register_ms": float(under["reg"].max() * 1e3),
            "requests_per_s": (s1["requests"] - s0["requests"]) / seconds,
            "accepted_per_s": (s1["accepted"] - s0["accepted"]) / seconds,
            "refused": s1["refused"] - s0["refused"],
            "closed_slow": s1["closed_slow"] - s0["closed_slow"],
            "closed_oversized": s1["closed_oversized"] - s0["closed_oversized"],
            "conns_held_max": under["conns"], "rss_mb": rss, "agent_log_kb": log_kb,
            "attacker": got}


def kills(n: int) -> dict:
    from reveal_plugins.agent.daemon import Agent
    from reveal_plugins.types import RunInfo
    d = tempfile.mkdtemp(prefix="reveal-kill-")
    spool, run_dir = os.path.join(d, "spool"), os.path.join(d, "run")
    os.makedirs(spool)
    rng = random.Random(1)
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                a = Agent(spool, interval_s=0.01, segment_s=0.05)
                a.register(RunInfo(run_id="r", source="bench", run_dir=run_dir))
                a._sampling_loop()
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.05, 0.5))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    names = [c["name"] for c in store.read_meta(run_dir)["channels"]]
    lost = 0
    paths = store.segment_paths(run_dir)
    for p in paths:
        try:
            store.read_segment(p, names)
        except Exception:
            lost += 1
    return {"kills": n, "segments": len(paths), "segments_lost": lost}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--kills", type=int, default=50)
    bench_results.add_args(ap)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (a root agent attacked by nobody)")
    bench = bench_results.begin("reliability", a.split, extra_paths=("tests/hostile_client.py",))
    res = {**attack(a.seconds), **kills(a.kills)}
    print(json.dumps(res, indent=1))
    keys = ("worst_root_ms", "p99_root_ms", "baseline_p99_ms", "worst_register_ms",
            "requests_per_s", "conns_held_max", "rss_mb", "kills", "segments_lost")
    print(" ".join(f"{k}={res[k]:.1f}" if isinstance(res[k], float) else f"{k}={res[k]}"
                   for k in keys))
    print("results: " + bench.write(a.results or bench.default_path(),
                                    dict(res, seconds=a.seconds)))


if __name__ == "__main__":
    main()
