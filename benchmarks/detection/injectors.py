#!/usr/bin/env python3
"""Noisy neighbours written for the benchmark (no stress-ng), one per kind.

    python benchmarks/detection/injectors.py KIND SECONDS [--cpu N] [--mb M] [--dir D]

Each runs for SECONDS and exits; ``--cpu N`` pins it to core N (an idle core next to a
single-threaded victim, or a busy one).  Kinds and what they do:

- ``hog1``      one core of pure integer work (a tight Python loop);
- ``cache``     random reads over a buffer of twice the L3 size (cache thrashing);
- ``membw``     streams copies between two 256 MiB arrays (memory bandwidth);
- ``memeat``    allocates and touches ``--mb`` MiB (default 1200), holds it, then sleeps;
- ``pagecache`` writes a ``--mb`` MiB file (default 3000) through the page cache, then reads it
                again and again (page-cache growth, buffered writes);
- ``metadata``  create / stat / rename / unlink small files as fast as it can;
- ``bufwrite``  buffered overwrites of a 512 MiB file with fsync every 64 MiB;
- ``dwrite``    O_DIRECT writes of 1 MiB blocks to a 512 MiB file.
Files go to ``--dir`` (default: a temporary directory on the root disk), removed at the end.
"""
from __future__ import annotations

import argparse
import mmap
import os
import shutil
import tempfile
import time

import numpy as np

_MiB = 1 << 20


def l3_bytes() -> int:
    for idx in range(8):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{idx}"
        try:
            if open(f"{base}/level").read().strip() == "3":
                s = open(f"{base}/size").read().strip()
                mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1], 1)
                return int(s.rstrip("KM")) * mult
        except OSError:
            break
    return 32 * _MiB


def hog1(until: float, **_) -> None:
    x = 0
    while time.time() < until:
        for i in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def cache(until: float, **_) -> None:
    n = 2 * l3_bytes() // 8
    buf = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(0)
    while time.time() < until:
        idx = rng.integers(0, n, 1 << 20)
        buf[idx] += 1


def membw(until: float, **_) -> None:
    a = np.ones(256 * _MiB // 8)
    b = np.empty_like(a)
    while time.time() < until:
        np.copyto(b, a)
        np.copyto(a, b)


def memeat(until: float, mb: int = 1200, **_) -> None:
    buf = bytearray(mb * _MiB)
    for off in range(0, len(buf), 4096):   # touch every page: resident, not just reserved
        buf[off] = 1
    while time.time() < until:
        time.sleep(0.2)
    del buf


def pagecache(until: float, mb: int = 3000, d: str = "/tmp", **_) -> None:
    path = os.path.join(d, "pagecache.bin")
    block = os.urandom(_MiB)
    with open(path, "wb") as f:
        for _ in range(mb):
            if time.time() >= until:
                break
            f.write(block)
    while time.time() < until:
        with open(path, "rb") as f:
            while f.read(8 * _MiB) and time.time() < until:
                pass


def metadata(until: float, d: str = "/tmp", **_) -> None:
    n = 0
    while time.time() < until:
        p = os.path.join(d, f"m{n % 512}")
        with open(p, "w") as f:
            f.write("x")
        os.stat(p)
        os.rename(p, p + ".r")
        os.unlink(p + ".r")
        n += 1


def bufwrite(until: float, d: str = "/tmp", **_) -> None:
    path = os.path.join(d, "bufwrite.bin")
    block = os.urandom(_MiB)
    with open(path, "wb") as f:
        while time.time() < until:
            f.seek(0)
            for i in range(512):
                f.write(block)
                if i % 64 == 63:
                    f.flush()
                    os.fsync(f.fileno())
                if time.time() >= until:
                    break


def dwrite(until: float, d: str = "/tmp", **_) -> None:
    path = os.path.join(d, "dwrite.bin")
    buf = mmap.mmap(-1, _MiB)          # page-aligned, as O_DIRECT wants
    buf.write(os.urandom(_MiB))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
    try:
        while time.time() < until:
            for i in range(512):
                os.pwrite(fd, buf, i * _MiB)
                if time.time() >= until:
                    break
    finally:
        os.close(fd)


KINDS = {"hog1": hog1, "cache": cache, "membw": membw, "memeat": memeat,
         "pagecache": pagecache, "metadata": metadata, "bufwrite": bufwrite, "dwrite": dwrite}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("seconds", type=float)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    ap.add_argument("--mb", type=int, default=None)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    d = tempfile.mkdtemp(prefix="inj-", dir=a.dir or "/var/tmp")
    kw = {"d": d}
    if a.mb:
        kw["mb"] = a.mb
    try:
        KINDS[a.kind](time.time() + a.seconds, **kw)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
