"""The faults the peer benchmark injects, from outside the job, the way a person checking it would.

Each variant is a command run on one node after ``ready``, built from that node's line of
``examples/multinode.sh`` (``node= netns= dev= cpus=``): processes are pinned to the node's CPU
set (``taskset``) and started in its network namespace; shapers go on its interface.  Several
tools per kind, so that a detector tuned on one tool's signature is caught out: ``DEV`` holds
the variants the dev split draws from, the test split draws from all of them (the ``held_out``
ones only there).
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass

EXPECT = {"cpu": "cpu", "network": "network", "memory": "memory", "io": "storage"}


@dataclass(frozen=True)
class Variant:
    kind: str
    name: str
    command: str          # {cpus} {ns} {dev} {n} {dur} {tmp}; a shaper: its `tc ... add` args
    shaper: bool = False
    held_out: bool = False


_PY_SPIN = "import os\nwhile True: pass"
_PY_TOUCH = ("b = bytearray(b'x') * (1536 << 20)\nk = 0\n"
             "while True:\n    k = (k + 1) % 251\n    b[::4096] = bytes([k]) * len(range(0, len(b), 4096))")
_NP_STREAM = ("import numpy as np\na = np.ones(1 << 27)\nb = np.empty_like(a)\n"
              "while True: np.copyto(b, a); a += 1.0")

VARIANTS = [
    Variant("cpu", "stress-cpu", "stress-ng --cpu {n} --timeout {dur}s -q"),
    Variant("cpu", "python-spin", "python3 -c " + shlex.quote(_PY_SPIN)),
    Variant("cpu", "dd-zero", "dd if=/dev/zero of=/dev/null bs=1M", held_out=True),
    Variant("network", "tbf-20mbit", "tbf rate 20mbit burst 32kb latency 50ms", shaper=True),
    Variant("network", "tbf-50mbit", "tbf rate 50mbit burst 32kb latency 50ms", shaper=True),
    # (netem is not built into this VM's kernel; htb is: a class shaping all traffic)
    Variant("network", "htb-30mbit", "handle 1: htb default 10 ; class add dev {dev} parent 1: "
            "classid 1:10 htb rate 30mbit", shaper=True, held_out=True),
    Variant("memory", "stress-vm", "stress-ng --vm {n} --vm-bytes 1G --vm-keep "
            "--timeout {dur}s -q"),
    Variant("memory", "python-touch", "python3 -c " + shlex.quote(_PY_TOUCH)),
    Variant("memory", "numpy-copy", "python3 -c " + shlex.quote(_NP_STREAM), held_out=True),
    Variant("io", "stress-hdd", "stress-ng --hdd {n} --hdd-bytes 512M --temp-path {tmp} "
            "--timeout {dur}s -q"),
    Variant("io", "dd-direct", "dd if=/dev/zero of={tmp}/dd.direct bs=1M count=100000 "
            "oflag=direct"),
    Variant("io", "dd-fsync", "sh -c 'while :; do dd if=/dev/zero of={tmp}/dd.sync bs=1M "
            "count=256 conv=fsync 2>/dev/null; done'", held_out=True),
]


def variants(kind: str, split: str) -> list[Variant]:
    return [v for v in VARIANTS if v.kind == kind and (split == "test" or not v.held_out)]


def inject(v: Variant, node: dict, dur: float, tmp: str) -> tuple[float, float]:
    """Run ``v`` on ``node`` for ``dur`` seconds; (start, end) wall-clock times."""
    n = len(expand(node["cpus"]))
    fmt = dict(cpus=node["cpus"], ns=node["netns"], dev=node["dev"], n=n, dur=int(dur),
               tmp=tmp)
    t0 = time.time()
    if v.shaper:
        tc = ["ip", "netns", "exec", node["netns"], "tc"]
        first, *more = v.command.format(**fmt).split(" ; ")
        try:
            subprocess.run(tc + ["qdisc", "replace", "dev", node["dev"], "root"]
                           + first.split(), check=True)
            for c in more:
                subprocess.run(tc + c.split(), check=True)
            time.sleep(dur)
        finally:
            subprocess.run(tc + ["qdisc", "del", "dev", node["dev"], "root"],
                           stderr=subprocess.DEVNULL)
        return t0, time.time()
    cmd = (f"exec ip netns exec {shlex.quote(node['netns'])} taskset -c {node['cpus']} "
           + v.command.format(**fmt))
    p = subprocess.Popen(["sh", "-c", cmd], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p.wait(timeout=dur)
    except subprocess.TimeoutExpired:
        pass
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    for f in ("dd.direct", "dd.sync"):
        try:
            os.unlink(os.path.join(tmp, f))
        except OSError:
            pass
    return t0, time.time()


def expand(cpulist: str) -> list[int]:
    out: list[int] = []
    for part in cpulist.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out
