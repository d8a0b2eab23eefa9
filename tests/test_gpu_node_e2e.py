"""A faulty GPU among eight, end to end: `reveal record` on a fake GPU node (the driver-level fake
under the real binding, in the agent's own process), faults switched on at given times on GPUs
drawn at random, the report read back.  Each fault must be named on the GPU it was put on."""
import json
import os
import random
import subprocess
import sys

import pytest

pytest.importorskip("pynvml")

import fake_gpu_node  # noqa: E402

pytestmark = pytest.mark.slow


def _gpus_named(report: dict, t0: float, t1: float) -> set[int]:
    """GPU indices that GPU findings overlapping [t0, t1] name (their identity or evidence)."""
    out: set[int] = set()
    for a in report["anomalies"]:
        if a["end"] < t0 or a["start"] > t1:
            continue
        g = a.get("gpu") or {}
        if isinstance(g.get("index"), int):
            out.add(g["index"])
        elif a.get("subsystem") == "gpu":
            out |= {int(e["channel"].split(".")[1]) for e in a.get("evidence", [])
                    if e["channel"].startswith("gpu.") and e["channel"].split(".")[1].isdigit()}
    return out


def test_each_gpu_fault_is_named_on_the_gpu_it_was_put_on(tmp_path):
    seed = int(os.environ.get("REVEAL_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    a, b, c, d = rng.sample(range(8), 4)
    faults = [("throttle", a, 12.0, 10.0, {"reason": "power"}),
              ("downtrain", b, 30.0, 10.0, {"gen": 3, "width": 8}),
              ("foreign", c, 48.0, 10.0, {"mem_bytes": 30 << 30, "sm_util": 45}),
              ("lose", d, 66.0, None, {})]
    env = fake_gpu_node.env(tmp_path, gpus=8, faults=faults)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "record", "--out", str(out),
                        "--", "sleep", "80"], env=env, capture_output=True, text=True,
                       timeout=400, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    t0 = meta["start"]
    # the agent's clock for the faults starts a little before the run: allow 3 s of slack
    why = f"seed {seed}: throttle {a}, downtrain {b}, foreign {c}, lost {d}\n{r.stdout[-4000:]}"
    for kind, g, at, dur, _ in faults:
        end = at + (dur if dur is not None else 10.0)
        named = _gpus_named(report, t0 + at - 3, t0 + end + 3)
        assert g in named, f"{kind} on GPU {g} not named ({named}); {why}"
        wrong = named - {x[1] for x in faults}
        assert not wrong, f"{kind}: GPUs {wrong} named though healthy; {why}"
