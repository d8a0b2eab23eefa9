#!/usr/bin/env python3
"""Faults injected under a real one-node Slurm: jobs completed, nodes drained, hook wall time.

    python benchmarks/reliability/slurm_faults.py [--jobs 3] [--keep]     (root)

Starts its own slurmctld + slurmd + munge (tests/fixtures_slurm.py), then for both hook modes
(``spank``: the SPANK plugin in C, Python detached; ``scripts``: Prolog=/Epilog= wrappers) runs
``--jobs`` jobs under each fault below, and the same number with no fault as the reference:

  broken_python    the wrappers' interpreter exits 1 at start-up (a broken virtualenv)  [scripts]
  invalid_config   the hook configuration is not TOML
  untrusted_config the configuration file belongs to ``nobody`` (root refuses it)
  spool_not_dir    the spool path is under a regular file
  agent_kill9      the node agent is killed with SIGKILL while the job runs
  hostile_user     a local user (``nobody``) attacks the agent socket during the job
  analysis_raises  the Epilog's analysis raises

A job "survives" when it COMPLETED and the node is idle afterwards; a drained node is resumed
and counted.  Prolog/Epilog wall time is what the wrapper measured (scripts mode) and is shown
as the worst case against the no-fault reference of the same run.  Results:
``benchmarks/reliability/results/slurm_faults-<split>-<date>.json`` (``--results``; the
:mod:`results` header; ``--split test`` is refused from a dirty tree).
``results/2026-12-03-slurm-faults.txt`` holds the figures of an earlier version.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import results as bench_results  # noqa: E402
from fixtures_slurm import SlurmCluster, _ensure_installed, _ensure_users  # noqa: E402

JOB = "#!/bin/sh\nsrun sleep 2\n"


@contextlib.contextmanager
def broken_python(c: SlurmCluster):
    from reveal_plugins.slurm.install import script
    hooks = os.path.join(c.base, "hooks")
    saved = {h: open(os.path.join(hooks, h)).read() for h in ("prolog", "epilog")}
    broken = os.path.join(c.base, "broken-venv-python")
    with open(broken, "w") as f:
        f.write("#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    os.chmod(broken, 0o755)
    try:
        for h in saved:
            with open(os.path.join(hooks, h), "w") as f:
                f.write(script(h, {"REVEAL_SLURM_LOG": c.hook_log}, python=broken))
        yield
    finally:
        for h, text in saved.items():
            with open(os.path.join(hooks, h), "w") as f:
                f.write(text)


@contextlib.contextmanager
def invalid_config(c):
    with c.hook_config(c.default_hook_config + "epilog_budget_s = = 1\n"):
        yield


@contextlib.contextmanager
def untrusted_config(c):
    with c.hook_config() as path:
        os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
        try:
            yield
        finally:
            os.chown(path, 0, -1)


@contextlib.contextmanager
def spool_not_dir(c):
    spool = f"{c.conf}/spool"
    with c.hook_config(f'spool = "{spool}"\n'), c.spank_args(f"spool={spool}"):
        yield


@contextlib.contextmanager
def analysis_raises(c):
    with c.hook_config(c.default_hook_config +
                       'analyzer = "tests.slurm_fault_analyzers:boom"\n'):
        yield


@contextlib.contextmanager
def nothing(c):
    yield


def during_job(c: SlurmCluster, fault: str) -> None:
    """Faults that act while the job runs (the agent must be up: wait for RUNNING)."""
    if fault == "agent_kill9":
        pid = c.agent_pid()
        if pid:
            os.kill(pid, signal.SIGKILL)
    elif fault == "hostile_user":
        nobody = pwd.getpwnam("nobody")
        subprocess.Popen([sys.executable, str(ROOT / "tests" / "hostile_client.py"),
                          os.path.join(c.spool, "agent.sock"), "--seconds", "2",
                          "--idle", "500", "--drip", "20"],
                         user=nobody.pw_uid, group=nobody.pw_gid, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)


SETUP = {"none": nothing, "broken_python": broken_python, "invalid_config": invalid_config,
         "untrusted_config": untrusted_config, "spool_not_dir": spool_not_dir,
         "agent_kill9": nothing, "hostile_user": nothing, "analysis_raises": analysis_raises}


def run_jobs(c: SlurmCluster, fault: str, n: int) -> dict:
    out = {"jobs": 0, "completed": 0, "drained": 0, "ids": []}
    with SETUP[fault](c):
        for _ in range(n):
            jid = c.sbatch(JOB).stdout.strip()
            deadline = time.monotonic() + 60
            while c.job_state(jid).get("JobState") == "PENDING" and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.7)
            during_job(c, fault)
            res = c.wait(jid, timeout=120)
            out["jobs"] += 1
            out["ids"].append(jid)
            out["completed"] += res.state == "COMPLETED"
            time.sleep(0.5)   # the Epilog has run when the job is COMPLETED; state settles
            if not c.node_state().startswith("idle"):
                out["drained"] += 1
                c.resume_node()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=3, help="jobs per fault and mode")
    ap.add_argument("--keep", action="store_true", help="keep the Slurm directory (logs)")
    bench_results.add_args(ap)
    a = ap.parse_args()
    bench = bench_results.begin("slurm_faults", a.split,
                                extra_paths=("tests/fixtures_slurm.py", "tests/hostile_client.py"))
    if os.geteuid() != 0:
        print("needs root (it starts slurmctld/slurmd)", file=sys.stderr)
        return 2
    reason = _ensure_installed()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    _ensure_users()
    base = tempfile.mkdtemp(prefix="reveal-slurm-faults-")
    os.chmod(base, 0o755)
    c = SlurmCluster(base)
    c.start()
    rows = []
    try:
        for mode in ("spank", "scripts"):
            with c.hook_mode(mode):
                run_jobs(c, "none", 1)  # warm-up: starts the node agent
                for fault in SETUP:
                    if fault == "broken_python" and mode == "spank":
                        continue
                    r = run_jobs(c, fault, a.jobs)
                    times = {h: [v for j, v in c.hook_wall_times(h).items() if j in r["ids"]]
                             for h in ("prolog", "epilog")}
                    rows.append((mode, fault, r, times))
    finally:
        c.stop()
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    ref = {m: t for m, f, _, t in rows if f == "none"}
    table = []
    print(f"{'mode':8} {'fault':17} {'jobs':>4} {'done':>4} {'drained':>7} "
          f"{'prolog_max_ms':>13} {'epilog_max_ms':>13} {'epilog_max/ref':>14}")
    for mode, fault, r, t in rows:
        pm = max(t["prolog"]) * 1e3 if t["prolog"] else float("nan")
        em = max(t["epilog"]) * 1e3 if t["epilog"] else float("nan")
        rem = max(ref[mode]["epilog"]) * 1e3 if ref[mode]["epilog"] else float("nan")
        print(f"{mode:8} {fault:17} {r['jobs']:4d} {r['completed']:4d} {r['drained']:7d} "
              f"{pm:13.1f} {em:13.1f} {em / rem:14.2f}")
        table.append({"mode": mode, "fault": fault, "jobs": r["jobs"],
                      "completed": r["completed"], "drained": r["drained"],
                      "prolog_max_ms": pm, "epilog_max_ms": em, "epilog_max_ref_ms": rem})
    faulty = [r for _, f, r, _ in rows if f != "none"]
    print(f"faults_injected={sum(r['jobs'] for r in faulty)} "
          f"jobs_completed={sum(r['completed'] for r in faulty)} "
          f"nodes_drained={sum(r['drained'] for r in faulty)} "
          f"fault_kinds={len({f for _, f, _, _ in rows if f != 'none'})}")
    figures = {"faults_injected": sum(r["jobs"] for r in faulty),
               "jobs_completed": sum(r["completed"] for r in faulty),
               "nodes_drained": sum(r["drained"] for r in faulty),
               "fault_kinds": len({f for _, f, _, _ in rows if f != "none"}),
               "modes": sorted({m for m, _, _, _ in rows})}
    print("results: " + bench.write(a.results or bench.default_path(),
                                    {"jobs_per_fault": a.jobs, "table": table,
                                     "figures": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
