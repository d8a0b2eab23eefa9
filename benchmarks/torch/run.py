#!/usr/bin/env python3
"""reveal-torchrun costs, each against its reference measured in the same run.

    python benchmarks/torch/run.py [--repeats 3] [--steps 20000]

1. Iteration markers: per-step cost (thread CPU time) of the optimizer step hook, as
   (a) the hook itself (calls/s with real datagrams going to a real receiver) and
   (b) ``optimizer.step()`` on a tiny model plain / with a no-op hook / with the marker,
   rotated blocks; best block and median paired difference per step.  Goal: <= 5 us per step.
2. Launcher: wall time from launch to the worker's first line, and launch to exit, of
   ``torchrun`` vs ``reveal-torchrun`` vs ``reveal-torchrun --reveal-off`` on a script that
   does nothing (so only launcher cost is measured); interleaved, medians.

Results: ``benchmarks/torch/results/torch-<split>-<date>.json`` (``--results``; the :mod:`results`
header; ``--split test`` is refused from a dirty tree).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import results as bench_results  # noqa: E402


# The launcher's receiver, in its own process as in real use (in this process it would compete
# with the measured loop for the GIL).
RECEIVER = """
import sys
from reveal_plugins.torch_ext import markers
n = []
r = markers.MarkerReceiver(sys.argv[1], n.extend).start()
print("ready", flush=True)
sys.stdin.read()
r.close()
print(r.steps, len(n), flush=True)
"""


# CPU time of this thread (syscalls included): on a shared, overloaded machine wall time
# mostly measures who else ran; thread CPU time measures what the code costs.
clock = time.thread_time


def bench_hook(n: int) -> dict:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook as register_post

    from reveal_plugins.torch_ext import markers

    tmp = tempfile.mkdtemp(prefix="reveal-bench-")
    path = os.path.join(tmp, "m.sock")
    rp = subprocess.Popen([sys.executable, "-c", RECEIVER, path], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
    assert rp.stdout.readline().strip() == "ready"
    try:
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.ones(4)
        opt = torch.optim.SGD([p], lr=1e-6)

        # (a) the hook alone, as torch calls it
        m = markers._Marker(path)
        m.next_flush = time.time() + markers.FLUSH_S
        blocks = []
        for _ in range(20):
            t0 = clock()
            for _ in range(n // 20):
                m.hook(opt, (), {})
            blocks.append((clock() - t0) / (n // 20) * 1e6)
        m.flush()
        hook_us, hook_mean_us = min(blocks), statistics.mean(blocks)

        # (b) optimizer.step() with and without the global hook, interleaved blocks
        def block(k: int) -> float:
            t = clock()
            for _ in range(k):
                opt.step()
            return (clock() - t) / k * 1e6

        block(2000)  # warm up
        k = max(n // 40, 250)
        noop = lambda o, a, kw: None  # noqa: E731  torch's own hook dispatch, as reference
        base, inst, ref = [], [], []
        for i in range(24):  # ABBA-style rotation so drift and noise hit all three alike
            order = ("b", "i", "r") if i % 2 == 0 else ("r", "i", "b")
            for what in order:
                if what == "b":
                    base.append(block(k))
                elif what == "i":
                    markers.instrument(sock_path=path)
                    inst.append(block(k))
                    markers.uninstrument()
                else:
                    h = register_post(noop)
                    ref.append(block(k))
                    h.remove()
        time.sleep(0.3)
        step_base = min(base)
        res = {"hook_us": hook_us, "hook_mean_us": hook_mean_us, "step_us": step_base, "step_instr_us": min(inst),
               "step_noop_us": min(ref), "delta_us": min(inst) - step_base,
               "delta_med_us": statistics.median(i - b for i, b in zip(inst, base)), "n": n}
    finally:
        out, _ = rp.communicate("", timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    res["steps_received"], res["events"] = (int(x) for x in out.split()[-2:])
    return res


NOOP = "import time, sys; print('WORKER_START', repr(time.time()), flush=True)\n"


def bench_launch(repeats: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="reveal-bench-launch-")
    script = os.path.join(tmp, "noop.py")
    with open(script, "w") as f:
        f.write(NOOP)
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    reveal = [sys.executable, "-m", "reveal_plugins.torch_ext.launcher"]
    common = ["--standalone", "--nproc-per-node", "1", script]
    variants = {
        "torchrun": lambda i: torchrun + common,
        "reveal-torchrun": lambda i: reveal + ["--reveal-out", os.path.join(tmp, f"r{i}")]
        + common,
        "reveal-torchrun --reveal-off": lambda i: reveal + ["--reveal-off"] + common,
    }
    res: dict = {k: {"first": [], "total": []} for k in variants}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SLURM_JOB_ID", None)
    try:
        for i in range(repeats):
            for name, mk in variants.items():
                t0 = time.time()
                r = subprocess.run(mk(i), cwd=tmp, env=env, capture_output=True, text=True,
                                   timeout=300)
                t1 = time.time()
                if r.returncode != 0:
                    raise SystemExit(f"{name} failed (rc={r.returncode}):\n{r.stderr[-3000:]}")
                first = [float(line.split()[1]) for line in r.stdout.splitlines()
                         if line.startswith("WORKER_START")]
                res[name]["first"].append(first[0] - t0)
                res[name]["total"].append(t1 - t0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {k: {m: statistics.median(v) for m, v in d.items()} for k, d in res.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="launches per variant (default 3)")
    ap.add_argument("--steps", type=int, default=20000, help="hook calls measured (default 20000)")
    bench_results.add_args(ap)
    a = ap.parse_args(argv)
    bench = bench_results.begin("torch", a.split, argv)
    print(f"reveal-torchrun benchmark  (python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    h = bench_hook(a.steps)
    print("\n1. iteration markers, thread CPU time (goal <= 5 us/step)")
    print(f"   hook alone                 {h['hook_us']:8.3f} us/step best block, "
          f"{h['hook_mean_us']:.3f} mean (incl. batch sends and machine noise)")
    print(f"                                             "
          f"({h['n']} steps; receiver got {h['steps_received']} steps as {h['events']} events)")
    print(f"   optimizer.step() plain     {h['step_us']:8.2f} us   (best block)")
    print(f"   + a no-op Python hook      {h['step_noop_us']:8.2f} us   "
          f"delta {h['step_noop_us'] - h['step_us']:+.2f} us (torch's hook dispatch)")
    print(f"   + reveal marker            {h['step_instr_us']:8.2f} us   "
          f"delta {h['delta_us']:+.2f} us/step best, {h['delta_med_us']:+.2f} median of pairs "
          f"({h['delta_us'] / h['step_us'] * 100:+.1f} %)")
    L = bench_launch(a.repeats)
    ref = L["torchrun"]
    print(f"\n2. launcher start-up, no-op script, 1 worker, median of {a.repeats}")
    print(f"   {'':30s} {'to worker start':>16s} {'to exit':>10s}")
    for name, v in L.items():
        print(f"   {name:30s} {v['first']:14.2f} s {v['total']:8.2f} s   "
              f"x{v['first'] / ref['first']:.2f} / x{v['total'] / ref['total']:.2f}   "
              f"(+{v['first'] - ref['first']:.2f} s / +{v['total'] - ref['total']:.2f} s)")
    print("results: " + bench.write(a.results or bench.default_path(),
                                    {"markers": h, "launcher": L, "repeats": a.repeats}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
