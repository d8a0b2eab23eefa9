#!/usr/bin/env python3
"""Peer comparison on real multi-node jobs, against per-node analysis alone (same runs).

    python benchmarks/peers/run.py [--runs 20] [--seconds 50] [--split dev|test] [--keep DIR]
                                   [--results FILE]

Every run is one ``examples/multinode.sh`` job (2 nodes, each with its own network namespace,
CPU set, agent, one gloo DDP rank).  The schedule is drawn from the split's seed (dev and test
never share a draw; tune on dev, report test): at least 5 clean runs (at least a quarter), the
others a fault on a random node, a random time after ``ready`` and for a random length:

* ``cpu``      a CPU hog pinned to the node's CPU set (stress-ng --cpu, a Python spin loop,
               dd /dev/zero -> /dev/null)
* ``network``  a shaper on the node's interface (tc tbf 20 or 50 Mbit/s, an htb class at
               30 Mbit/s; netem is not built into this VM's kernel)
* ``memory``   memory pressure from the node's CPUs (stress-ng --vm, a Python loop touching
               1.5 GiB, a numpy copy loop over 2 GiB)
* ``io``       disk writes from the node's CPUs (stress-ng --hdd, dd oflag=direct, dd
               conv=fsync; the disk is shared by all nodes)

The faults are injected from outside the job, after ``ready``, from the node lines the example
prints (:mod:`faults`), as a person checking it would; the dev split never draws the
``held_out`` tools, the test split draws from all.  The victim's shape is drawn too (model and
width of ``examples/train.py``).

Scored per fault run: the job report's top peer suspect overlapping the fault (start - 3 s ..
end + 10 s) must name the node (``node_acc``) and the subsystem (``subsystem_acc``, expected
cpu / network / memory / storage); onset latency = suspect start - fault start.  Clean runs:
any suspect is false (``false_suspects_clean`` = clean runs with one; ``live_false_clean`` =
clean runs with a live ``peer_suspect`` event).  Live: the first live
event naming a suspect node (any node's events.jsonl, an event whose name holds "suspect"),
minus the fault start.  The reference, from the same recordings: each node's own report
(today's per-node analysis), naming the node whose anomaly overlapping the fault scores
highest; on clean runs any anomaly on any node names a node; live = the first ``live_finding``
of any node after the fault start.

The runs hold /tmp/reveal-quiet.lock exclusively (``--lock``), a few consecutive runs per
hold (at most 9 minutes a hold), so the machine's other work pauses between holds, never
during a run.  Keep the machine otherwise idle: any process landing on a node's CPU is a real
foreign load there, and one free to run anywhere loads both nodes and hides a hog.  Results:
``benchmarks/peers/results/peers-<split>-<date>.json`` (``--results``; :mod:`results` header,
``--split dev`` by default, a ``test`` run is refused from a dirty tree), rewritten after every
run so an interrupted benchmark keeps its runs (``"complete": false`` in the header until the
end).  ``results/2026-12-03.txt`` holds the text results of earlier versions.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import EXPECT, inject, variants  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import results as bench_results  # noqa: E402
from quiet import QUIET_LOCK, QuietLock  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "multinode.sh")
SEEDS = {"dev": 11, "test": 12}
NODE_RE = re.compile(r"^node=(\S+) netns=(\S+) dev=(\S+) cpus=(\S+)$")
SHAPES = [("mlp", 512), ("mlp", 1024), ("cnn", 256)]


def schedule(n: int, split: str, seed: int | None) -> list[dict]:
    rng = random.Random(SEEDS[split] if seed is None else seed)
    clean = max(5, round(n / 4)) if n >= 5 else n // 2
    faults = sorted(EXPECT)   # balanced: each kind as often as the others (+-1)
    kinds = ["clean"] * clean + [faults[(i + rng.randrange(4)) % 4] if i >= (n - clean) // 4 * 4
                                 else faults[i % 4] for i in range(n - clean)]
    rng.shuffle(kinds)
    out = []
    for k in kinds:
        model, width = rng.choice(SHAPES)
        r = {"kind": k, "model": model, "width": width}
        if k != "clean":
            r.update(node=rng.randint(1, 2), at=rng.randint(6, 12), dur=rng.randint(14, 20),
                     tool=rng.choice(variants(k, split)).name)
        out.append(r)
    return out


def frozen_example(into: str) -> str:
    """A private copy of the example (bash reads a script as it runs: editing the checkout
    during a benchmark must not change the runs in flight)."""
    d = os.path.join(into, "examples")
    os.makedirs(d, exist_ok=True)
    for f in ("multinode.sh", "multinode_slurm.sh", "train.py"):
        shutil.copy2(os.path.join(ROOT, "examples", f), d)
    return os.path.join(d, "multinode.sh")


def run_one(plan: dict, seconds: int, spool: str, lock: "QuietLock | None",
            example: str = EXAMPLE) -> dict:
    cmd = ["bash", example, "--seconds", str(seconds), "--spool", spool,
           "--model", plan.get("model", "mlp"), "--width", str(plan.get("width", 512))]
    if lock is not None:
        lock.take()
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
    reader.start()
    nodes: dict[str, dict] = {}
    lines: list[str] = []
    fault: dict = {}
    injector = None
    timer = threading.Timer(seconds + 150, p.kill)
    timer.start()
    for line in p.stdout:
        lines.append(line)
        m = NODE_RE.match(line.strip())
        if m:
            nodes[m.group(1)] = dict(zip(("node", "netns", "dev", "cpus"), m.groups()))
        elif line.strip() == "ready" and plan["kind"] != "clean":
            injector = threading.Thread(target=_inject, args=(plan, nodes, spool, fault),
                                        daemon=True)
            injector.start()
    p.wait()
    timer.cancel()
    if injector is not None:
        injector.join(timeout=60)
    reader.join(timeout=10)
    wall = time.monotonic() - t
    stdout, stderr = "".join(lines), "".join(err)
    out = {"plan": plan, "rc": p.returncode, "wall": wall, "stdout": stdout,
           "stderr": stderr[-4000:]}
    if fault.get("error"):
        out["stderr"] += "\ninjection failed: " + fault["error"]
    last = stdout.strip().splitlines()[-1:] or [""]
    if last[0].startswith("report="):
        with open(last[0][len("report="):]) as f:
            out["job"] = json.load(f)
    if "start" in fault:
        out["fault"] = fault
    if "job" in out:
        jobdir = os.path.join(spool, "jobs", str(out["job"]["job_id"]))
        out["events"] = {h: _live_events(os.path.join(jobdir, h)) for h in os.listdir(jobdir)
                         if os.path.isfile(os.path.join(jobdir, h, "meta.json"))}
    return out


def _inject(plan: dict, nodes: dict, tmp: str, into: dict) -> None:
    node = f"node{plan['node']}"
    v = next(v for v in variants(plan["kind"], "test") if v.name == plan["tool"])
    try:
        time.sleep(plan["at"])
        t0, t1 = inject(v, nodes[node], plan["dur"], tmp)
        into.update(kind=plan["kind"], node=node, start=t0, end=t1)
    except Exception as e:          # the run is then scored as failed, with the reason
        into["error"] = f"{type(e).__name__}: {e}"


def _live_events(run_dir: str) -> list[dict]:
    ev = []
    try:
        with open(os.path.join(run_dir, "events.jsonl")) as f:
            for line in f:
                if '"live_finding"' in line or "suspect" in line:
                    try:
                        ev.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return ev


def _overlaps(a: dict, lo: float, hi: float) -> bool:
    return a["start"] <= hi and a["end"] >= lo


def score(res: dict) -> dict:
    """Peers' and the reference's verdict for one run."""
    plan, job = res["plan"], res.get("job")
    s: dict = {"kind": plan["kind"], "tool": plan.get("tool"),
               "ok": res["rc"] == 0 and job is not None}
    if not s["ok"]:
        return s
    fault = res.get("fault")
    if plan["kind"] != "clean" and fault is None:
        s["ok"] = False
        return s
    suspects = (job.get("peers") or {}).get("suspects", [])
    anomalies = [dict(a, node=r["run"]["nodes"][0]) for r in job["reports"]
                 for a in r.get("anomalies", [])]
    live_peer = sorted((e.get("t", 0), e) for evs in res.get("events", {}).values() for e in evs
                       if "suspect" in str(e.get("event")))
    live_ref = sorted((e.get("t", 0), h, e) for h, evs in res.get("events", {}).items()
                      for e in evs if e.get("event") == "live_finding")
    if plan["kind"] == "clean":
        s.update(false=len(suspects), ref_false=len(anomalies), live_false=len(live_peer),
                 named=",".join(sorted({x["node"] for x in suspects})) or "-",
                 ref_named=",".join(sorted({x["node"] for x in anomalies})) or "-")
        return s
    lo, hi = fault["start"] - 3, fault["end"] + 10
    want_node, want_sub = fault["node"], EXPECT[plan["kind"]]
    hit = sorted((x for x in suspects if _overlaps(x, lo, hi)), key=lambda x: -x["score"])
    ref = sorted((x for x in anomalies if _overlaps(x, lo, hi)), key=lambda x: -x["score"])
    s["want"] = f"{want_node}/{want_sub}"
    s["got"] = f"{hit[0]['node']}/{hit[0]['subsystem']}" if hit else "-"
    s["node_ok"] = bool(hit) and hit[0]["node"] == want_node
    s["sub_ok"] = s["node_ok"] and hit[0]["subsystem"] == want_sub
    s["latency"] = hit[0]["start"] - fault["start"] if s["node_ok"] else None
    s["other_node"] = sum(x["node"] != want_node for x in suspects)
    s["ref_got"] = f"{ref[0]['node']}/{ref[0]['subsystem']}" if ref else "-"
    s["ref_node_ok"] = bool(ref) and ref[0]["node"] == want_node
    s["ref_sub_ok"] = s["ref_node_ok"] and ref[0]["subsystem"] == want_sub
    s["ref_latency"] = ref[0]["start"] - fault["start"] if s["ref_node_ok"] else None
    lp = [(t, e) for t, e in live_peer if lo <= t <= hi + 30
          and want_node in json.dumps(e)]
    s["live"] = lp[0][0] - fault["start"] if lp else None
    lr = [(t, h) for t, h, e in live_ref if lo <= t <= hi + 30]
    s["ref_live"] = lr[0][0] - fault["start"] if lr else None
    s["ref_live_node_ok"] = bool(lr) and lr[0][1] == want_node
    return s


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def _p50(xs: list) -> str:
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.1f}" if xs else "n/a"


def _acc(xs: list) -> str:
    return f"{sum(xs) / len(xs):.2f}" if xs else "n/a"


def summary(scores: list[dict]) -> list[str]:
    ok = [s for s in scores if s["ok"]]
    f = [s for s in ok if s["kind"] != "clean"]
    c = [s for s in ok if s["kind"] == "clean"]
    line1 = (f"node_acc={_acc([s['node_ok'] for s in f])} "
             f"subsystem_acc={_acc([s['sub_ok'] for s in f])} "
             f"false_suspects_clean={sum(s['false'] > 0 for s in c)}/{len(c)} "
             f"live_false_clean={sum(s['live_false'] > 0 for s in c)}/{len(c)} "
             f"live_latency_s_p50={_p50([s['live'] for s in f])} "
             f"ref_node_acc={_acc([s['ref_node_ok'] for s in f])}")
    line2 = (f"fault_runs={len(f)} clean_runs={len(c)} failed_runs={len(scores) - len(ok)} "
             f"end_latency_s_p50={_p50([s['latency'] for s in f])} "
             f"suspects_on_other_node={sum(s['other_node'] for s in f)} "
             f"live_found={sum(s['live'] is not None for s in f)}/{len(f)} "
             f"ref_subsystem_acc={_acc([s['ref_sub_ok'] for s in f])} "
             f"ref_false_clean={sum(s['ref_false'] > 0 for s in c)}/{len(c)} "
             f"ref_end_latency_s_p50={_p50([s['ref_latency'] for s in f])} "
             f"ref_live_latency_s_p50={_p50([s['ref_live'] for s in f])} "
             f"ref_live_node_acc={_acc([s['ref_live_node_ok'] for s in f])}")
    per_kind = []
    for k in sorted(EXPECT):
        ks = [s for s in f if s["kind"] == k]
        if ks:
            per_kind.append(f"{k}: node {sum(s['node_ok'] for s in ks)}/{len(ks)} "
                            f"sub {sum(s['sub_ok'] for s in ks)}/{len(ks)} "
                            f"ref node {sum(s['ref_node_ok'] for s in ks)}/{len(ks)}")
    per_tool = []
    for tool in sorted({s["tool"] for s in f}):
        ts = [s for s in f if s["tool"] == tool]
        per_tool.append(f"{tool} {sum(s['node_ok'] for s in ts)}/{sum(s['sub_ok'] for s in ts)}"
                        f"/{len(ts)}")
    return [line1, line2, "per kind: " + "; ".join(per_kind),
            "per tool (node/subsystem/runs): " + ", ".join(per_tool)]


def figures(scores: list[dict]) -> dict:
    """The summary as numbers (what the README table reads)."""
    ok = [s for s in scores if s["ok"]]
    f = [s for s in ok if s["kind"] != "clean"]
    c = [s for s in ok if s["kind"] == "clean"]
    live = [s["live"] for s in f if s["live"] is not None]
    return {"fault_runs": len(f), "clean_runs": len(c), "failed_runs": len(scores) - len(ok),
            "node_ok": sum(bool(s["node_ok"]) for s in f),
            "subsystem_ok": sum(bool(s["sub_ok"]) for s in f),
            "false_suspects_clean": sum(s["false"] > 0 for s in c),
            "live_false_clean": sum(s["live_false"] > 0 for s in c),
            "live_latency_s_p50": round(statistics.median(live), 1) if live else None,
            "ref_node_ok": sum(bool(s["ref_node_ok"]) for s in f),
            "ref_subsystem_ok": sum(bool(s["ref_sub_ok"]) for s in f),
            "ref_false_clean": sum(s["ref_false"] > 0 for s in c)}


def run_line(i: int, res: dict, s: dict) -> str:
    p = res["plan"]
    head = f"run={i:02d} kind={p['kind']}"
    if p["kind"] != "clean":
        head += f" tool={p['tool']} node=node{p['node']} at=+{p['at']}s for={p['dur']}s"
    head += f" victim={p.get('model', 'mlp')}/{p.get('width', 512)}"
    if not s["ok"]:
        return f"{head} FAILED rc={res['rc']} {res['stderr'].strip().splitlines()[-1:]}"
    if p["kind"] == "clean":
        return (f"{head} suspects={s['false']} named={s['named']} live={s['live_false']} "
                f"ref_anomalies={s['ref_false']} ref_named={s['ref_named']} "
                f"wall={res['wall']:.0f}s")
    return (f"{head} want={s['want']} peers={s['got']} lat={_fmt(s['latency'])} "
            f"live={_fmt(s['live'])} other_node={s['other_node']} ref={s['ref_got']} "
            f"ref_lat={_fmt(s['ref_latency'])} ref_live={_fmt(s['ref_live'])} "
            f"wall={res['wall']:.0f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seconds", type=int, default=50, help="training time per job")
    ap.add_argument("--seed", type=int, default=None, help="override the split's seed")
    ap.add_argument("--lock", default=QUIET_LOCK,
                    help="held exclusively during the runs, <= 9 min a hold ('' for none)")
    ap.add_argument("--keep", default=None, help="keep the spools and raw results here")
    bench_results.add_args(ap)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("needs root (network, UTS and PID namespaces)")
    if a.runs < 1 or not (20 <= a.seconds <= 600):
        ap.error("--runs >= 1 and 20 <= --seconds <= 600")
    bench = bench_results.begin("peers", a.split, argv)
    plans = schedule(a.runs, a.split, a.seed)
    out = a.results or bench.default_path()
    doc = {"seed": SEEDS[a.split] if a.seed is None else a.seed, "runs_planned": a.runs,
           "seconds": a.seconds, "runs": [], "summary": [], "figures": {}}
    print(f"# {bench.header['command']}  ({bench.header['date']}, git "
          f"{(bench.header['commit'] or '?')[:7]}, tree clean: {bench.header['tree_clean']}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})", flush=True)
    keep = a.keep
    if keep:
        os.makedirs(keep, exist_ok=True)
    scores = []
    lock = QuietLock(a.lock) if a.lock else None
    frozen = tempfile.mkdtemp(prefix="reveal-peers-example-")
    example = frozen_example(frozen)
    for i, plan in enumerate(plans, 1):
        spool = tempfile.mkdtemp(prefix="reveal-peers-bench-", dir=keep)
        res = run_one(plan, a.seconds, spool, lock, example)
        if lock is not None:
            lock.ran(res["wall"])
        s = score(res)
        scores.append(s)
        line = run_line(i, res, s)
        print(line, flush=True)
        doc["runs"].append({"line": line, "plan": plan, "score": s})
        bench.write(out, doc, complete=False)   # an interrupted benchmark keeps its runs
        if keep:
            with open(os.path.join(spool, "result.json"), "w") as f:
                json.dump({k: v for k, v in res.items() if k != "job"}, f)
        else:
            shutil.rmtree(spool, ignore_errors=True)
    if lock is not None:
        lock.release()
    shutil.rmtree(frozen, ignore_errors=True)
    doc["summary"] = summary(scores)
    doc["figures"] = figures(scores)
    for ln in doc["summary"]:
        print(ln, flush=True)
    bench.write(out, doc)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
