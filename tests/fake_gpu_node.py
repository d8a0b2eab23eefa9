"""A fake GPU node for end-to-end runs: processes started with :func:`env` see the driver-level
fake (tests/fixtures_nvml.py) under the real ``pynvml``, with faults switched on and off at given
seconds after the process started (the agent's process is the one that samples).

    env = fake_gpu_node.env(tmp_path, gpus=8, faults=[("throttle", 3, 12.0, 10.0, {})])
    subprocess.run(["reveal", "record", "--", "sleep", "40"], env=env)

A fault is ``(kind, gpu, at_s, for_s, kwargs)``: kind ``throttle`` | ``downtrain`` | ``foreign`` |
``lose`` | ``xid``; ``for_s`` None = to the end.  All GPUs run a steady training load
(``busy()``) from the start unless ``busy=False``.
"""
from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

_BOOT = r'''
import json, os, sys, threading, time
sys.path.insert(0, {here!r})
from fixtures_nvml import FakeDriver, install_fake_nvml
_cfg = json.loads({cfg!r})
_d = FakeDriver(**_cfg["driver"])
if _cfg["busy"]:
    for _g in _d.gpus:
        _g.busy(**_cfg["busy_kwargs"])
_ctx = install_fake_nvml(_d)
_ctx.__enter__()

def _apply(kind, g, on, kw):
    gpu = _d.gpus[g]
    if kind == "throttle":
        gpu.throttle(**kw) if on else gpu.unthrottle()
    elif kind == "downtrain":
        gpu.downtrain(**kw) if on else gpu.retrain()
    elif kind == "foreign":
        pid = kw.get("pid", 1)
        if on:
            gpu.add_process(pid, mem_bytes=kw.get("mem_bytes", 20 << 30),
                            sm_util=kw.get("sm_util", 50))
            gpu.busy(sm=kw.get("job_sm", 60), **{{k: v for k, v in _cfg["busy_kwargs"].items()
                                                 if k != "sm"}})
        else:
            gpu.remove_process(pid)
            gpu.busy(**_cfg["busy_kwargs"])
    elif kind == "lose":
        gpu.lose() if on else gpu.recover()
    elif kind == "xid":
        if on:
            gpu.xid(kw.get("code", 79))

def _schedule():
    t0 = time.monotonic()
    todo = []
    for kind, g, at, dur, kw in _cfg["faults"]:
        todo.append((at, kind, g, True, kw))
        if dur is not None:
            todo.append((at + dur, kind, g, False, kw))
    for at, kind, g, on, kw in sorted(todo, key=lambda x: x[0]):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        _apply(kind, g, on, kw)

with open("/proc/self/cmdline", "rb") as _f:   # sys.argv is not complete yet for -m
    _cmd = _f.read().replace(b"\0", b" ").decode(errors="replace")
if _cfg["faults"] and os.environ.get("REVEAL_FAKE_GPU_FAULTS_IN", "agent") in _cmd:
    threading.Thread(target=_schedule, daemon=True).start()
'''


def env(tmp_path, gpus: int = 8, faults=(), busy: bool = True, busy_kwargs=None,
        base: dict | None = None, **driver) -> dict:
    """Environment for subprocesses that should run on the fake GPU node.  Faults are scheduled
    only in the node agent's process (``python -m reveal_plugins.agent.daemon``)."""
    boot = os.path.join(str(tmp_path), "fake-gpu-boot")
    os.makedirs(boot, exist_ok=True)
    cfg = {"driver": {"gpus": gpus, **driver}, "busy": busy,
           "busy_kwargs": busy_kwargs or {}, "faults": [list(f) for f in faults]}
    with open(os.path.join(boot, "sitecustomize.py"), "w") as f:
        f.write(_BOOT.format(here=HERE, cfg=json.dumps(cfg)))
    e = dict(base if base is not None else os.environ)
    e["PYTHONPATH"] = boot + (":" + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e["REVEAL_FAKE_GPU_FAULTS_IN"] = "reveal_plugins.agent.daemon"
    return e
