#!/usr/bin/env python3
"""Labeled detection benchmark: real torch CPU training under ``reveal record`` with anomalies
injected at known times, scored against a single-IsolationForest reference in the same runs.

    python benchmarks/detection/run.py                 # full (~25 min): 140-s runs, 3 models,
                                                       # 5 stress-ng kinds x2, DDP network
                                                       # slowdown, 3 clean runs
    python benchmarks/detection/run.py --smoke         # ~2.5 min: one CPU injection + one clean
    python benchmarks/detection/run.py --rescore DIR   # re-score recorded runs (no recording)

Injections (stress-ng, Debian): cpu (``--cpu 2``), cache (``--cache 2``), membw (``--stream 2``),
memhog (``--vm 1 --vm-bytes 4G --vm-keep``), disk (``--hdd 1 --hdd-opts direct``: on this VM
buffered writes stay in the page cache), and net: a 2-process gloo DDP run, rank 0 in the host
namespace and rank 1 in a network namespace joined by a veth pair whose rate is cut with
``tc qdisc ... tbf`` mid-run.  Needs root for the network part (skipped otherwise).
Results: ``<out>/results.json`` and a table on stdout.
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

from scoring import fmt_table, reference_iforest, score  # noqa: E402

EXPECTED = {"cpu": "cpu", "cache": "cpu", "membw": "memory", "memhog": "memory",
            "disk": "storage", "net": "network"}
NETNS, VETH_H, VETH_N = "rvdetbench", "rvdet-h", "rvdet-n"
IP_H, IP_N = "10.79.3.1", "10.79.3.2"


def stress_cmd(kind: str, length: float, tmp: str) -> list[str]:
    t = f"{int(round(length))}s"
    base = ["stress-ng", "--timeout", t, "--quiet"]
    return base + {
        "cpu": ["--cpu", "2"],
        "cache": ["--cache", "2"],
        "membw": ["--stream", "2"],
        "memhog": ["--vm", "1", "--vm-bytes", "4G", "--vm-keep"],
        "disk": ["--hdd", "1", "--hdd-opts", "direct", "--hdd-bytes", "256M",
                 "--temp-path", tmp],
    }[kind]


def scenarios(smoke: bool, seconds: float, net: bool) -> list[dict]:
    if smoke:
        return [{"name": "smoke-mlp-cpu", "model": "mlp", "seconds": 60,
                 "inject": [("cpu", 20, 15)]},
                {"name": "smoke-clean", "model": "mlp", "seconds": 45, "inject": []}]
    # Two injections of 13 % of the run each: self-referential detection needs most of a run
    # to be normal (above ~40 % anomalous, the anomaly becomes the run's typical state).
    a, b, L = 0.3 * seconds, 0.65 * seconds, 0.13 * seconds
    sc = [
        {"name": "mlp-cpu-memhog", "model": "mlp", "inject": [("cpu", a, L), ("memhog", b, L)]},
        {"name": "cnn-cache-disk", "model": "cnn", "inject": [("cache", a, L), ("disk", b, L)]},
        {"name": "rnn-membw-cpu", "model": "rnn", "inject": [("membw", a, L), ("cpu", b, L)]},
        {"name": "mlp-disk-cache", "model": "mlp", "inject": [("disk", a, L), ("cache", b, L)]},
        {"name": "cnn-memhog-membw", "model": "cnn",
         "inject": [("memhog", a, L), ("membw", b, L)]},
        {"name": "clean-mlp", "model": "mlp", "inject": []},
        {"name": "clean-cnn", "model": "cnn", "inject": []},
        {"name": "clean-rnn", "model": "rnn", "inject": []},
    ]
    for s in sc:
        s["seconds"] = seconds
    if net:
        sc.append({"name": "ddp-net", "model": "mlp", "seconds": seconds, "net": True,
                   "inject": [("net", 0.4 * seconds, 0.2 * seconds)]})
    return sc


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
    if not sc.get("net"):
        return [py, train, "--model", sc["model"], "--seconds", str(sc["seconds"]),
                "--log-every", "0"]
    common = (f"MASTER_PORT=29791 WORLD_SIZE=2 {py} {train} --model {sc['model']} "
              f"--seconds {sc['seconds']} --log-every 0 --threads 1")
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
    from reveal_plugins.detect.live import LiveAnalyzer
    from reveal_plugins.telemetry.store import load_run

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
    dur = rep["run"]["end"] - rep["run"]["start"]
    live, worst = live_replay(run_dir)
    base = {"name": sc["name"], "clean": not sc["inject"], "duration_s": dur,
            "injections": labels["injections"]}
    ours = dict(base, events=[{"start": a["start"], "end": a["end"],
                               "subsystem": a["subsystem"]} for a in rep["anomalies"]],
                live=[{"start": a["start"], "detected_at": a["detected_at"],
                       "subsystem": a["subsystem"]} for a in live])
    ref = dict(base, events=reference_iforest(run_dir))
    info = {"name": sc["name"], "analysis_s": round(secs, 2), "live_update_max_s": round(worst, 3),
            "found": [(round(a["start"] - rep["run"]["start"], 1),
                       round(a["end"] - rep["run"]["start"], 1), a["subsystem"],
                       a["hints"][0]["title"] if a["hints"] else "") for a in rep["anomalies"]],
            "injected": [(i["kind"], round(i["start"] - rep["run"]["start"], 1),
                          round(i["end"] - rep["run"]["start"], 1))
                         for i in labels["injections"]],
            "live": [(round(a["detected_at"] - rep["run"]["start"], 1), a["subsystem"])
                     for a in live],
            "reference_events": len(ref["events"])}
    return ours, ref, info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="small version (~2.5 min)")
    ap.add_argument("--seconds", type=float, default=140.0, help="length of each training run")
    ap.add_argument("--out", default=None, help="where run directories go")
    ap.add_argument("--rescore", metavar="DIR", help="score already recorded runs in DIR")
    ap.add_argument("--no-net", action="store_true", help="skip the DDP network scenario")
    ap.add_argument("--only", help="comma-separated scenario names")
    args = ap.parse_args(argv)
    if args.rescore:
        out = args.rescore
        names = sorted(d for d in os.listdir(out)
                       if os.path.exists(os.path.join(out, d, "labels.json")))
    else:
        if not shutil.which("stress-ng"):
            print("stress-ng not found (apt-get install stress-ng)", file=sys.stderr)
            return 2
        net = not args.no_net and not args.smoke and os.geteuid() == 0 and bool(shutil.which("tc"))
        out = args.out or tempfile.mkdtemp(prefix="reveal-detbench-")
        os.makedirs(out, exist_ok=True)
        scs = scenarios(args.smoke, args.seconds, net)
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
        ours_runs.append(o)
        ref_runs.append(r)
        infos.append(info)
        print(f"  {n}: injected {info['injected']}\n      found {info['found']}\n"
              f"      live {info['live']}  (reference: {info['reference_events']} events; "
              f"analysis {info['analysis_s']} s)", flush=True)
    ours, ref = score(ours_runs), score(ref_runs)
    print()
    print(fmt_table(ours, ref))
    print("per kind (reveal):", json.dumps(ours["per_kind"]))
    res = {"out": out, "reveal": ours, "reference_iforest": ref, "runs": infos,
           "finished": time.time()}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\nresults: {os.path.join(out, 'results.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
