#!/usr/bin/env python3
"""Labeled detection benchmark with a dev and a test split: real torch CPU training under
``reveal record`` with anomalies injected at known times, scored beside three simple reference
detectors (IsolationForest, PCA reconstruction error, k-means distance) on the same recordings,
each twice: alone, on single 10 Hz samples with fixed thresholds (``iforest``, ``pca``,
``kmeans``), and inside the whole pipeline in place of its detectors (``pipeline_<name>``: the
same windows, scaling, warm-up, threshold, event grouping and judging; the pipeline's own three
detectors are run alone that way too), so a reader sees what each part contributes.

    python benchmarks/detection/run.py --split dev --seed S --out D   # record + score dev
    python benchmarks/detection/run.py --split test --seed S --out D  # ... the test split
    python benchmarks/detection/run.py --smoke                  # ~2.5 min (CI)
    python benchmarks/detection/run.py --rescore DIR [--split dev|test]   # no recording

``--split dev`` is the default; ``--split test`` (and ``all``, which includes test) is refused
from a dirty tree (:mod:`results`).

Kinds (``KINDS``): stress-ng (cpu, cache, stream, vm, hdd) and the benchmark's own injectors
(``injectors.py``: a one-core hog on the idle or on the victim's core, a cache thrasher, a
memory-bandwidth streamer, a memory eater, a page-cache filler, a metadata storm, buffered and
O_DIRECT writes) plus ``net``: a 2-rank gloo DDP run, rank 1 in a network namespace behind a veth
pair whose rate is cut with ``tc qdisc ... tbf``.  Victims (``VICTIMS``): single-threaded (pinned
to core 0), two threads, DataLoader workers, eval/checkpoint phases, DDP.  Each kind is injected
three times; one instance goes to the dev split and two to the test split at random (the seed
is printed and stored in ``scenarios.json``).  Tune on dev; report test.
Needs root for the network part (skipped otherwise).  Results: ``<out>/results.json`` and
(not for ``--smoke``) ``benchmarks/detection/results/detection-<split>-<date>.json``
(``--results``), both with the :mod:`results` header.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from scoring import (events_of, fmt_confusion, fmt_table, load_thresholds,  # noqa: E402
                     pipeline_references, reference_detectors, run_base, score)

sys.path.insert(0, os.path.dirname(HERE))
import results as bench_results  # noqa: E402

#: injection kind -> (subsystem a correct finding names, how it is made)
KINDS = {
    "stress-cpu": ("cpu", "stress-ng --cpu 2"),
    "stress-cache": ("cpu", "stress-ng --cache 2"),
    "stress-membw": ("memory", "stress-ng --stream 1"),
    "stress-vm": ("memory", "stress-ng --vm 1 --vm-bytes 2G --vm-keep"),
    "stress-hdd": ("storage", "stress-ng --hdd 1 --hdd-opts direct"),
    "hog1": ("cpu", "injectors.py hog1, pinned to core 1 (idle next to a pinned victim)"),
    "hog1-busy": ("cpu", "injectors.py hog1, pinned to core 0 (the victim's core)"),
    "cache": ("cpu", "injectors.py cache (random reads over 2x L3)"),
    "membw": ("memory", "injectors.py membw (256 MiB array copies)"),
    "memeat": ("memory", "injectors.py memeat --mb 1200 (allocate, touch, hold)"),
    "pagecache": ("memory", "injectors.py pagecache --mb 3000 (fill the page cache, re-read)"),
    "metadata": ("storage", "injectors.py metadata (create/stat/rename/unlink storm)"),
    "bufwrite": ("storage", "injectors.py bufwrite (buffered, fsync every 64 MiB)"),
    "dwrite": ("storage", "injectors.py dwrite (O_DIRECT 1 MiB writes)"),
    "net": ("network", "tc tbf 2 Mbit/s on the veth of a 2-rank gloo DDP run"),
}
EXPECTED = {k: v[0] for k, v in KINDS.items()}
#: victim shape -> train.py arguments (``single`` is pinned to core 0 so core 1 stays idle)
VICTIMS = {
    "single": ["--threads", "1"],
    "multi": ["--threads", "2"],
    "workers": ["--threads", "1", "--workers", "2"],
    "phases": ["--threads", "1", "--eval-every", "150", "--checkpoint-every", "200"],
    "ddp": ["--threads", "1"],
}
NETNS, VETH_H, VETH_N = "rvdetbench", "rvdet-h", "rvdet-n"
IP_H, IP_N = "10.79.3.1", "10.79.3.2"
INJECTORS = os.path.join(HERE, "injectors.py")


def stress_cmd(kind: str, length: float, tmp: str) -> list[str]:
    t = f"{int(round(length))}s"
    if not kind.startswith("stress-"):
        own = kind.split("-")[0]
        cpu = {"hog1": ["--cpu", "1"], "hog1-busy": ["--cpu", "0"]}.get(kind, [])
        mb = {"memeat": ["--mb", "1200"], "pagecache": ["--mb", "3000"]}.get(kind, [])
        return [sys.executable, INJECTORS, own, str(length), "--dir", tmp] + cpu + mb
    base = ["stress-ng", "--timeout", t, "--quiet"]
    return base + {
        "stress-cpu": ["--cpu", "2"],
        "stress-cache": ["--cache", "2"],
        "stress-membw": ["--stream", "1"],
        "stress-vm": ["--vm", "1", "--vm-bytes", "2G", "--vm-keep"],
        "stress-hdd": ["--hdd", "1", "--hdd-opts", "direct", "--hdd-bytes", "256M",
                       "--temp-path", tmp],
    }[kind]


def scenarios(smoke: bool, seconds: float, net: bool, seed: int, per_kind: int = 3,
              clean: tuple[int, int] = (2, 5)) -> list[dict]:
    """Runs of the dev and test splits.  Every kind is injected ``per_kind`` times; each
    instance is assigned to dev (one) or test (the rest) at random, then paired with another
    instance of the same split into a run of a random victim shape and model.  Two injections
    of 15 % of the run each, at 30 % and 65 %: self-referential detection needs most of a run
    to be normal."""
    import random

    if smoke:
        return [{"name": "smoke-single-hog1", "model": "mlp", "victim": "single",
                 "seconds": 60, "split": "dev", "inject": [("hog1", 20, 15)]},
                {"name": "smoke-clean", "model": "mlp", "victim": "single", "seconds": 45,
                 "split": "dev", "inject": []}]
    rng = random.Random(seed)
    kinds = [k for k in KINDS if net or k != "net"]
    a, b, L = 0.3 * seconds, 0.65 * seconds, 0.15 * seconds
    out: list[dict] = []
    for split in ("dev", "test"):
        inst = []
        for k in kinds:
            n = 1 if split == "dev" else per_kind - 1
            inst += [k] * n
        rng.shuffle(inst)
        nets = [k for k in inst if k == "net"]
        rest = [k for k in inst if k != "net"]
        pairs = []
        for k in nets:           # a slow link needs a distributed victim
            pairs.append(("ddp", [k, rest.pop()] if rest else [k]))
        while rest:
            pairs.append((None, [rest.pop(), rest.pop()] if len(rest) > 1 else [rest.pop()]))
        for i, (victim, ks) in enumerate(pairs):
            if victim is None:
                shapes = [v for v in VICTIMS if v != "ddp" or net]
                victim = "single" if any(k.startswith("hog1") for k in ks) else rng.choice(shapes)
            rng.shuffle(ks)
            model = rng.choice(["mlp", "cnn", "rnn"])
            out.append({"name": f"{split}-{i:02d}-{victim}-{model}-{'-'.join(ks)}",
                        "model": model, "victim": victim, "seconds": seconds, "split": split,
                        "net": victim == "ddp",
                        "inject": [(k, t, L) for k, t in zip(ks, (a, b))]})
        for i in range(clean[0 if split == "dev" else 1]):
            shapes = [v for v in VICTIMS if v != "ddp" or net]
            victim = shapes[(i + (0 if split == "dev" else 2)) % len(shapes)]
            model = rng.choice(["mlp", "cnn", "rnn"])
            out.append({"name": f"{split}-clean{i}-{victim}-{model}", "model": model,
                        "victim": victim, "seconds": seconds, "split": split,
                        "net": victim == "ddp", "inject": []})
    return out


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


def net_up() -> None:
    net_down()
    sh("ip", "netns", "add", NETNS)
    sh("ip", "link", "add", VETH_H, "type", "veth", "peer", "name", VETH_N)
    sh("ip", "link", "set", VETH_N, "netns", NETNS)
    sh("ip", "addr", "add", f"{IP_H}/24", "dev", VETH_H)
    sh("ip", "link", "set", VETH_H, "up")
    sh("ip", "netns", "exec", NETNS, "ip", "addr", "add", f"{IP_N}/24", "dev", VETH_N)
    sh("ip", "netns", "exec", NETNS, "ip", "link", "set", VETH_N, "up")
    sh("ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up")


def net_down() -> None:
    sh("ip", "link", "del", VETH_H, check=False)
    sh("ip", "netns", "del", NETNS, check=False)


def net_slow(on: bool) -> None:
    for pre in ([], ["ip", "netns", "exec", NETNS]):
        dev = VETH_H if not pre else VETH_N
        if on:
            sh(*pre, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "2mbit",
               "burst", "16kb", "latency", "100ms", check=False)
        else:
            sh(*pre, "tc", "qdisc", "del", "dev", dev, "root", check=False)


def train_cmd(sc: dict) -> list[str]:
    py = sys.executable
    train = os.path.join(ROOT, "examples", "train.py")
    extra = VICTIMS[sc.get("victim", "multi")]
    if not sc.get("net"):
        cmd = [py, train, "--model", sc["model"], "--seconds", str(sc["seconds"]),
               "--log-every", "0"] + extra
        return (["taskset", "-c", "0"] + cmd) if sc.get("victim") == "single" else cmd
    common = (f"MASTER_PORT=29791 WORLD_SIZE=2 {py} {train} --model {sc['model']} "
              f"--seconds {sc['seconds']} --log-every 0 {' '.join(extra)}")
    script = (f"ip netns exec {NETNS} env MASTER_ADDR={IP_H} RANK=1 LOCAL_RANK=0 "
              f"GLOO_SOCKET_IFNAME={VETH_N} {common} & "
              f"env MASTER_ADDR={IP_H} RANK=0 LOCAL_RANK=0 GLOO_SOCKET_IFNAME={VETH_H} {common}; "
              "wait")
    return ["bash", "-c", script]


def record(sc: dict, out: str, log) -> dict:
    rd = os.path.join(out, sc["name"])
    if os.path.exists(rd):
        shutil.rmtree(rd)
    tmp = tempfile.mkdtemp(prefix="rvdet-io-", dir="/var/tmp")
    if sc.get("net"):
        net_up()
    cmd = ["reveal", "record", "--out", rd, "--interval", "0.1", "--"] + train_cmd(sc)
    injections: list[dict] = []
    procs: list[subprocess.Popen] = []
    t_launch = time.time()
    rec = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    started = threading.Event()
    t_train = [t_launch]

    def pump() -> None:
        # Injection times count from the moment training starts (train.py prints its
        # "train.py: model=..." line after imports and process-group set-up, which take
        # anything from 3 s to 30 s on a busy 2-core node).
        for line in iter(rec.stdout.readline, b""):
            log.write(line)
            if not started.is_set() and line.startswith(b"train.py: model="):
                t_train[0] = time.time()
                started.set()
        started.set()

    pt = threading.Thread(target=pump, daemon=True)
    pt.start()

    def inject() -> None:
        started.wait(timeout=120)
        for kind, off, length in sorted(sc["inject"], key=lambda x: x[1]):
            delay = t_train[0] + off - time.time()
            if delay > 0:
                time.sleep(delay)
            if rec.poll() is not None:
                return
            t0 = time.time()
            if kind == "net":
                net_slow(True)
                time.sleep(length)
                net_slow(False)
            else:
                p = subprocess.Popen(stress_cmd(kind, length, tmp), stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
                procs.append(p)
                try:
                    p.wait(timeout=length + 15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            injections.append({"kind": kind, "subsystem": EXPECTED[kind], "start": t0,
                               "end": time.time()})

    th = threading.Thread(target=inject, daemon=True)
    th.start()
    rc = rec.wait()
    pt.join(timeout=10)
    th.join(timeout=60)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if sc.get("net"):
        net_slow(False)
        net_down()
    shutil.rmtree(tmp, ignore_errors=True)
    labels = {"scenario": sc, "record_rc": rc, "launched": t_launch, "training_started": t_train[0],
              "injections": injections}
    with open(os.path.join(rd, "labels.json"), "w") as f:
        json.dump(labels, f, indent=1)
    return labels


def live_replay(run_dir: str, chunk_s: float = 2.0) -> tuple[list[dict], float]:
    """Feed the recorded rows to LiveAnalyzer as the agent does (every ``chunk_s``)."""
    from reveal_plugins.detect.live.analyzer import LiveAnalyzer
    from reveal_plugins.store.store import load_run

    data = load_run(run_dir)
    fr = data.frame
    la = LiveAnalyzer(fr.channels, float(data.meta.get("interval_s") or 0.1), {})
    out, worst = [], 0.0
    if len(fr.t) == 0:
        return out, worst
    edges = fr.t[0] + chunk_s * (1 + (fr.t - fr.t[0]) // chunk_s)
    for e in sorted(set(edges.tolist())):
        sel = edges == e
        t0 = time.perf_counter()
        out += la.update(fr.t[sel], fr.values[sel])
        worst = max(worst, time.perf_counter() - t0)
    return out, worst


def evaluate(run_dir: str) -> tuple[dict, dict, dict]:
    from reveal_plugins.detect import analyze

    with open(os.path.join(run_dir, "labels.json")) as f:
        labels = json.load(f)
    sc = labels["scenario"]
    t0 = time.perf_counter()
    rep = analyze(run_dir)
    secs = time.perf_counter() - t0
    with open(os.path.join(run_dir, "report.bench.json"), "w") as f:
        json.dump(rep, f, indent=1)
    live, worst = live_replay(run_dir)
    base = run_base(rep, labels)
    ours = dict(base, events=events_of(rep),
                live=[{"start": a["start"], "detected_at": a["detected_at"],
                       "subsystem": a["subsystem"]} for a in live])
    refs = {k: dict(base, events=v) for k, v in reference_detectors(run_dir).items()}
    refs.update({f"pipeline_{k}": dict(base, events=v)
                 for k, v in pipeline_references(run_dir).items()})
    info = {"name": sc["name"], "victim": sc.get("victim"),
            "duration_s": round(rep["run"]["end"] - rep["run"]["start"], 1),
            "streamed": bool((rep.get("analysis") or {}).get("streamed")),
            "analysis_s": round(secs, 2), "live_update_max_s": round(worst, 3),
            "found": [(round(a["start"] - rep["run"]["start"], 1),
                       round(a["end"] - rep["run"]["start"], 1), a["subsystem"],
                       a["hints"][0]["title"] if a["hints"] else "") for a in rep["anomalies"]],
            "injected": [(i["kind"], round(i["start"] - rep["run"]["start"], 1),
                          round(i["end"] - rep["run"]["start"], 1))
                         for i in labels["injections"]],
            "live": [(round(a["detected_at"] - rep["run"]["start"], 1), a["subsystem"])
                     for a in live],
            "reference_events": {k: len(v["events"]) for k, v in refs.items()},
            "status": rep.get("status"),
            "observations": [(round(o["start"] - rep["run"]["start"], 1), o["subsystem"])
                             for o in rep.get("observations") or []]}
    return ours, refs, info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="small version (~2.5 min)")
    ap.add_argument("--seconds", type=float, default=140.0, help="length of each training run")
    ap.add_argument("--out", default=None, help="where run directories go")
    ap.add_argument("--rescore", metavar="DIR", help="score already recorded runs in DIR")
    ap.add_argument("--no-net", action="store_true", help="skip the DDP network scenario")
    ap.add_argument("--only", help="comma-separated scenario names")
    # --split: record/score only this split (tune on dev, report test; default dev); --results
    bench_results.add_args(ap, extra_splits=("all",))
    ap.add_argument("--extra-clean", type=int, default=0, metavar="N",
                    help="record only N more clean runs of --split (test unless dev; "
                         "victim shapes in turn) into --out, for more clean hours")
    ap.add_argument("--seed", type=int, default=None,
                    help="seed of the split assignment and scenario draw (printed)")
    args = ap.parse_args(argv)
    bench = bench_results.begin("detection", args.split, argv)
    if args.rescore:
        out = args.rescore
        try:
            with open(os.path.join(out, "scenarios.json")) as f:
                seed = json.load(f).get("seed")
        except (OSError, ValueError):
            seed = None
        extra_seeds = sorted(int(f[len("scenarios-"):-len(".json")]) for f in os.listdir(out)
                             if f.startswith("scenarios-") and f.endswith(".json"))
        names = sorted(d for d in os.listdir(out)
                       if os.path.exists(os.path.join(out, d, "labels.json"))
                       and (args.split == "all" or d.startswith(args.split + "-")))
    else:
        if not shutil.which("stress-ng"):
            print("stress-ng not found (apt-get install stress-ng)", file=sys.stderr)
            return 2
        net = not args.no_net and not args.smoke and os.geteuid() == 0 and bool(shutil.which("tc"))
        out = args.out or tempfile.mkdtemp(prefix="reveal-detbench-")
        os.makedirs(out, exist_ok=True)
        extra_seeds = []
        seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(2), "big")
        print(f"scenario seed {seed}", flush=True)
        scs = scenarios(args.smoke, args.seconds, net, seed)
        if args.extra_clean:
            import random
            rng = random.Random(seed)
            shapes = [v for v in VICTIMS if v != "ddp" or net]
            split = "dev" if args.split == "dev" else "test"
            scs = [{"name": f"{split}-xclean{seed}-{i:02d}-{shapes[i % len(shapes)]}",
                    "model": rng.choice(["mlp", "cnn", "rnn"]), "victim": shapes[i % len(shapes)],
                    "seconds": args.seconds, "split": split,
                    "net": shapes[i % len(shapes)] == "ddp", "inject": []}
                   for i in range(args.extra_clean)]
        if args.split != "all":
            scs = [s for s in scs if s["split"] == args.split]
        with open(os.path.join(out, f"scenarios-{seed}.json" if args.extra_clean
                               else "scenarios.json"), "w") as f:
            json.dump({"seed": seed, "scenarios": scs}, f, indent=1)
        if args.only:
            want = set(args.only.split(","))
            scs = [s for s in scs if s["name"] in want]
        names = []
        with open(os.path.join(out, "record.log"), "ab") as log:
            for sc in scs:
                print(f"recording {sc['name']} ({sc['seconds']:.0f} s, inject "
                      f"{[k for k, _, _ in sc['inject']] or 'nothing'}) ...", flush=True)
                record(sc, out, log)
                names.append(sc["name"])
    ours_runs, ref_runs, infos = [], [], []
    for n in names:
        o, r, info = evaluate(os.path.join(out, n))
        if args.split != "all" and o["split"] != args.split:
            continue
        ours_runs.append(o)
        ref_runs.append(r)
        infos.append(info)
        print(f"  {n}: injected {info['injected']}\n      found {info['found']}\n"
              f"      observations {info['observations']}\n"
              f"      live {info['live']}  (references: {info['reference_events']} events; "
              f"analysis {info['analysis_s']} s)", flush=True)
    res = {"out": out, "seed": seed, "extra_clean_seeds": extra_seeds,
           "rescored": bool(args.rescore), "runs": infos,
           "pipeline_reference_thresholds": load_thresholds(),
           "finished": time.time()}
    for split in ("dev", "test"):
        sel = [i for i, o in enumerate(ours_runs) if o["split"] == split]
        if not sel:
            continue
        ours = score([ours_runs[i] for i in sel])
        refs = {k: score([ref_runs[i][k] for i in sel]) for k in ref_runs[sel[0]]}
        print(f"\n== {split} split: {len(sel)} runs ==")
        print(fmt_table(ours, refs))
        print("\nsubsystem confusion (reveal):")
        print(fmt_confusion(ours))
        print("per kind (reveal):", json.dumps(ours["per_kind"]))
        print("per victim (reveal):", json.dumps(ours["per_victim"]))
        res[split] = {"reveal": ours, **{f"reference_{k}": v for k, v in refs.items()}}
    bench.write(os.path.join(out, "results.json"), res)
    print(f"\nresults: {os.path.join(out, 'results.json')}")
    if args.results or not args.smoke:
        path = bench.write(args.results or bench.default_path(), res)
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
