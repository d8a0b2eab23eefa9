"""A neighbour on the node, with plain tools (issue 21, item 1): a 45-s single-threaded job
under ``reveal record`` at defaults, and two ``python -c 'while True: pass'`` hogs on the
2-core node:

* ``start15`` / ``start35``: started a second before the job, stopped 15 / 35 s into it (a
  leftover process of an earlier job; the run's own median *is* the neighbour for ``start35``);
* ``mid15``: from +15 s to +30 s of the job (the issue's reproduction: half the windows left
  after the grace are the hog's);
* ``clean``: no hog.

Each scenario is recorded ``--repeats`` times, interleaved.  A neighbour scenario counts as found
when the report has an anomaly with ``cpu.foreign.cores`` among its foreign support and
subsystem ``cpu`` (and, for ``start*``, "present from the start"); a clean run counts its
anomalies.  The CPU other people's processes used during each recording (this machine may be
shared) is measured from /proc and stored with it.

    python benchmarks/detection/neighbour.py --repeats 5 [--split test]

~50 s per recording; results in ``benchmarks/detection/results/neighbour-<split>-<date>.json``.
``tests/test_detect_neighbour.py`` records the same scenarios (one recording each).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = "import time\nt=time.time()\nwhile time.time()-t<45: pass"
HOG = "while True: pass"
#: scenario -> (hog start after the run registered, or None: before it; seconds)
SCENARIOS = {"start15": (None, 15.0), "start35": (None, 35.0), "mid15": (15.0, 15.0),
             "clean": (None, 0.0)}


class Others(threading.Thread):
    """Mean CPU (cores) of processes outside this process's tree and outside the kernel
    while it runs: other people's work on a shared machine."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop, self.samples, self.hz = threading.Event(), [], os.sysconf("SC_CLK_TCK")

    def _snap(self):
        ppid, cpu = {}, {}
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    r = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(r[6]) & 0x00200000 or r[1] == "2":     # kernel thread
                    continue
                ppid[int(p)], cpu[int(p)] = int(r[1]), int(r[11]) + int(r[12])
        me = os.getpid()

        def mine(p, n=0):
            while p > 1 and n < 64:
                if p == me:
                    return True
                p, n = ppid.get(p, 0), n + 1
            return False
        return {p: c for p, c in cpu.items() if not mine(p)}

    def run(self):
        prev, t0 = self._snap(), time.time()
        while not self.stop.wait(0.5):
            cur, t = self._snap(), time.time()
            self.samples.append(sum(max(0, c - prev[p]) for p, c in cur.items() if p in prev)
                                / self.hz / (t - t0))
            prev, t0 = cur, t

    def mean(self):
        self.stop.set()
        self.join(5)
        return sum(self.samples) / max(1, len(self.samples))


def _wait_registered(out: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not os.path.exists(os.path.join(out, "meta.json")) and time.monotonic() < deadline:
        time.sleep(0.05)


def record(out: str, hog_at: float | None = None, hog_s: float = 0.0,
           hog_cmds: list[list[str]] | None = None):
    """Record the job; two hogs for ``hog_s`` seconds, started ``hog_at`` s after the run
    registered (None: a second before `reveal record`, stopped ``hog_s`` s after the run
    registered).  ``hog_cmds``: other neighbours instead of the two busy loops (each command
    is killed at the end of its span).  Returns (report, other people's mean CPU, log)."""
    cmds = hog_cmds or [[sys.executable, "-c", HOG]] * 2
    others = Others()
    others.start()
    early = hog_s > 0 and hog_at is None
    hogs = [subprocess.Popen(c) for c in cmds] if early else []
    try:
        time.sleep(1.0 if early else 0)
        rec = subprocess.Popen([sys.executable, "-m", "reveal_plugins.cli", "record", "--out",
                                out, "--", sys.executable, "-c", JOB],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, PYTHONPATH=ROOT))
        # times count from the run's registration (its meta.json), not from `reveal record`
        # starting: on a loaded machine the agent may take seconds to come up
        _wait_registered(out)
        if hog_s > 0 and hog_at is not None:
            time.sleep(hog_at)
            hogs = [subprocess.Popen(c) for c in cmds]
            time.sleep(hog_s)
        elif early:
            time.sleep(hog_s)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    log, _ = rec.communicate(timeout=180)
    if rec.returncode != 0:
        raise RuntimeError(f"reveal record exited {rec.returncode}: {log[-3000:]}")
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f), others.mean(), log


def cpu_neighbours(rep: dict) -> list[dict]:
    """Anomalies with foreign CPU among their support."""
    return [a for a in rep["anomalies"] if "cpu.foreign.cores" in
            [f["channel"] for f in (a.get("foreign") or {}).get("support", [])]]


def verdict(name: str, rep: dict, log: str) -> dict:
    """What one recording of scenario ``name`` showed."""
    found = cpu_neighbours(rep)
    start = rep["run"]["start"]
    out = {"anomalies": len(rep["anomalies"]),
           "subsystems": [a["subsystem"] for a in rep["anomalies"]],
           "spans": [[round(a["start"] - start, 1), round(a["end"] - start, 1)]
                     for a in rep["anomalies"]]}
    if name == "clean":
        out["ok"] = not rep["anomalies"]
        return out
    a = found[0] if found else None
    ok = bool(a) and a["subsystem"] == "cpu"
    if name.startswith("start") and a:
        out["since_start"] = bool(a["foreign"].get("since_start"))
        out["summary_says"] = "present from the start" in " ".join(log.split())
        ok = ok and out["since_start"] and out["summary_says"]
    out["ok"] = ok
    return out


def main(argv=None) -> int:
    sys.path.insert(0, os.path.dirname(HERE))
    import results as bench_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    bench_results.add_args(ap)
    a = ap.parse_args(argv)
    names = [s for s in a.scenarios.split(",") if s]
    for s in names:
        if s not in SCENARIOS:
            ap.error(f"--scenarios: unknown scenario {s!r} (known: {', '.join(SCENARIOS)})")
    run = bench_results.begin("detection", a.split, argv, script=__file__)
    path = a.results or run.default_path("neighbour")
    # a SIGTERM must still stop the hogs (the finally blocks run on SystemExit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="reveal-neighbour-") as tmp:
        for i in range(a.repeats):
            for s in names:
                hog_at, hog_s = SCENARIOS[s]
                rep, others, log = record(os.path.join(tmp, f"{s}-{i}"), hog_at, hog_s)
                v = {"scenario": s, "repeat": i, "others_cores": round(others, 3),
                     **verdict(s, rep, log)}
                runs.append(v)
                print(json.dumps(v), flush=True)
                summary = {}
                for n in names:
                    rs = [r for r in runs if r["scenario"] == n]
                    if rs:
                        summary[n] = {"runs": len(rs), "ok": sum(r["ok"] for r in rs)}
                run.write(path, {"job": "45-s single-threaded busy loop, `reveal record` "
                                        "defaults; two `python -c 'while True: pass'` hogs",
                                 "summary": summary, "runs": runs},
                          complete=i == a.repeats - 1 and s == names[-1])
    print(json.dumps(summary, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
