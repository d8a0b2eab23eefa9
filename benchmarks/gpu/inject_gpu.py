#!/usr/bin/env python3
"""Injectors for the GPU device check; each runs for --seconds then exits.

    matmul  a foreign process computing bf16 matrix products on the job's GPU
    h2d     a foreign process copying pinned host memory to the GPU in a loop (PCIe)
    cpuhog  2 busy processes per CPU core (starves the job's DataLoader workers)
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time


def _spin(until):
    x = 0
    while time.time() < until:
        x += 1


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=("matmul", "h2d", "cpuhog"))
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--gpu", type=int, default=0)
    a = ap.parse_args(argv)
    until = time.time() + a.seconds
    if a.kind == "cpuhog":
        procs = [mp.Process(target=_spin, args=(until,)) for _ in range(2 * os.cpu_count())]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        return
    import torch
    dev = torch.device("cuda", a.gpu)
    n = 0
    if a.kind == "matmul":
        x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        while time.time() < until:
            for _ in range(20):
                z = x @ y
            torch.cuda.synchronize()
            n += 20
        del z
    else:
        h = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
        d = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        while time.time() < until:
            d.copy_(h, non_blocking=True)
            torch.cuda.synchronize()
            n += 1
    print(f"{a.kind}: {n} iterations", flush=True)


if __name__ == "__main__":
    main()
