#!/usr/bin/env python3
"""A bf16 training job on one GPU whose input pipeline is CPU work in DataLoader workers.

The workers' CPU cost per batch is set after a warm-up so they deliver about 1.6x what the GPU
consumes: a CPU hog on the node then makes the job input-bound (the GPU waits for data), a
foreign process on the GPU makes its steps slower.  Every step's time goes to --log (JSON
lines: t, step, step_s, wait_s) as the workload's own ground truth; under reveal-torchrun each
optimizer step is also an iteration marker.

    python benchmarks/gpu/train_gpu.py --seconds 90 --log steps.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

WIDTH, IN, BATCH, LAYERS = 8192, 1024, 4096, 6


class Synthetic(IterableDataset):
    def __init__(self, cpu_ms: float):
        self.cpu_ms = cpu_ms

    def __iter__(self):
        rng = np.random.default_rng(os.getpid())
        while True:
            t0 = time.thread_time()
            x = rng.standard_normal((BATCH, IN), dtype=np.float32)
            # "augmentation": CPU time, not wall time, so contention stretches it
            while (time.thread_time() - t0) * 1e3 < self.cpu_ms:
                x = np.tanh(x[:, ::-1] * 0.9 + 0.1)
            yield torch.from_numpy(np.ascontiguousarray(x))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--log", default=None)
    a = ap.parse_args(argv)
    try:
        import reveal_plugins.torch_ext as rt
        rt.instrument()
    except Exception as e:  # markers are optional
        print("no iteration markers:", e)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layers = [torch.nn.Linear(IN, WIDTH)] + [torch.nn.Linear(WIDTH, WIDTH)
                                             for _ in range(LAYERS)] + [torch.nn.Linear(WIDTH, 1)]
    model = torch.nn.Sequential(*[m for l in layers for m in (l, torch.nn.GELU())][:-1])
    model = model.to(dev, dtype=torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(x):
        y = model(x.to(dev, dtype=torch.bfloat16, non_blocking=True))
        loss = y.float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    x0 = torch.randn(BATCH, IN).pin_memory()
    for _ in range(5):
        step(x0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        step(x0)
    torch.cuda.synchronize()
    gpu_ms = (time.perf_counter() - t0) / 20 * 1e3
    cpu_ms = gpu_ms * a.workers / 1.6
    print(f"GPU step {gpu_ms:.1f} ms; worker CPU per batch {cpu_ms:.1f} ms "
          f"({a.workers} workers)", flush=True)
    dl = DataLoader(Synthetic(cpu_ms), batch_size=None, num_workers=a.workers,
                    pin_memory=True, prefetch_factor=2, persistent_workers=True)
    log = open(a.log, "w") if a.log else None
    end = time.time() + a.seconds
    it = iter(dl)
    n = 0
    while time.time() < end:
        t_a = time.perf_counter()
        x = next(it)
        t_b = time.perf_counter()
        step(x)
        torch.cuda.synchronize()
        t_c = time.perf_counter()
        n += 1
        if log:
            log.write(json.dumps({"t": time.time(), "step": n, "step_s": t_c - t_a,
                                  "wait_s": t_b - t_a}) + "\n")
    if log:
        log.close()
    print(f"{n} steps in {a.seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
