"""Fleet fixtures: many run directories from a few analysed templates.

Templates are run directories written through the real store (``SynthHost``: the procfs
probe's channel layout, synthetic values) and analysed by the real pipeline (real
``report.json``): one clean, one with CPU contention, one with storage pressure.  A fleet
clones them under other job/user/node identities and start times: segments are hard links
(immutable files), ``meta.json``/``report.json``/``events.jsonl`` are rewritten with the new
identity and times shifted.  ``benchmarks/scale/fleet.py`` builds its 10,000 runs the same way.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

DAY = 86400.0
T0 = 1_789_948_800.0   # 2026-09-21 00:00 UTC


def make_templates(root: str) -> dict[str, str]:
    """Three analysed run directories under ``root``: clean, cpu, storage."""
    from reveal_plugins.analysis import analyze_and_publish
    from reveal_plugins.detect.synth import SynthHost

    out = {}
    for name, an in (("clean", []), ("cpu", [("cpu", 25, 45)]),
                     ("storage", [("storage", 20, 40)])):
        d = os.path.join(root, f"template-{name}")
        if not os.path.exists(os.path.join(d, "report.json")):
            SynthHost(2, seed=1, anomalies=an).write_run(d, 70, 0.1)
            rep = analyze_and_publish(d, {}, publish=False)
            want = 0 if name == "clean" else 1
            assert (len(rep["anomalies"]) > 0) == bool(want), (name, rep["anomalies"])
        out[name] = d
    return out


def clone_run(template: str, dst: str, *, job_id: str, user: str, node: str, workload: str,
              start: float, partition: str = "batch", exit_code: int = 0) -> str:
    """A copy of ``template`` as another run (identity and start time replaced)."""
    os.makedirs(os.path.join(dst, "segments"), exist_ok=True)
    seg = os.path.join(template, "segments")
    for n in os.listdir(seg):
        try:
            os.link(os.path.join(seg, n), os.path.join(dst, "segments", n))
        except FileExistsError:
            pass
        except OSError:
            shutil.copy(os.path.join(seg, n), os.path.join(dst, "segments", n))
    with open(os.path.join(template, "meta.json")) as f:
        meta = json.load(f)
    shift = start - meta["start"]
    meta["start"] += shift
    meta["end"] += shift
    meta["exit_code"] = exit_code
    meta["host"] = node
    meta["run"].update(run_id=f"slurm-{job_id}", run_dir=dst, source="slurm", host=node,
                       job_id=job_id, user=user,
                       extra={"job_name": workload, "partition": partition})
    with open(os.path.join(dst, "meta.json"), "w") as f:
        json.dump(meta, f)
    rpath = os.path.join(template, "report.json")
    if os.path.exists(rpath):
        with open(rpath) as f:
            rep = json.load(f)
        rep["run"].update(job_id=job_id, user=user, nodes=[node], exit_code=exit_code,
                          start=rep["run"]["start"] + shift, end=rep["run"]["end"] + shift,
                          source="slurm")
        for a in rep["anomalies"]:
            a["start"] += shift
            a["end"] += shift
            a["node"] = node
        with open(os.path.join(dst, "report.json"), "w") as f:
            json.dump(rep, f)
    return dst


def planted_fleet(root: str, templates: dict[str, str], nodes: int = 8, users: int = 5,
                  runs_per_node: int = 10, lemon: str = "node03", one_bad: str = "node06",
                  seed: int = 0) -> dict:
    """A fleet where every run on ``lemon`` carries an injected CPU anomaly (jobs of several
    users), ``one_bad`` has exactly one bad job among good ones, the rest are clean except a
    storage anomaly here and there (one per 40 runs, spread over nodes)."""
    import random

    rnd = random.Random(seed)
    wls = ["train-resnet", "train-llm", "cfd-solver"]
    runs = []
    job = 1000
    for i in range(nodes):
        node = f"node{i:02d}"
        for k in range(runs_per_node):
            job += 1
            user = f"user{(i + k) % users}"
            kind = "clean"
            if node == lemon:
                kind = "cpu"
            elif node == one_bad and k == 0:
                kind = "cpu"
            elif job % 40 == 0:
                kind = "storage"
            start = T0 + (k % 3) * DAY + rnd.uniform(0, 3600 * 20)
            d = os.path.join(root, "spool", "jobs", str(job), node)
            clone_run(templates[kind], d, job_id=str(job), user=user, node=node,
                      workload=wls[(i + k) % len(wls)], start=start)
            runs.append({"dir": d, "node": node, "user": user, "kind": kind, "job": job})
    return {"spool": os.path.join(root, "spool"), "runs": runs, "lemon": lemon,
            "one_bad": one_bad}


@pytest.fixture(scope="session")
def fleet_templates(tmp_path_factory):
    return make_templates(str(tmp_path_factory.mktemp("fleet-templates")))


def tls_options(security, d: str) -> list[str]:
    """``--tls-*`` options (root-owned files, key 0600 in ``d``) for joining a cluster whose
    ``distributed.security.Security`` holds its credentials in memory (``Security.temporary``)."""
    paths = []
    for name, pem in (("ca.pem", security.tls_ca_file), ("cert.pem", security.tls_client_cert),
                      ("key.pem", security.tls_client_key)):
        p = os.path.join(d, name)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(pem)
        paths.append(p)
    return ["--tls-ca-file", paths[0], "--tls-cert", paths[1], "--tls-key", paths[2]]
