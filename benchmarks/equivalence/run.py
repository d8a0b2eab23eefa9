#!/usr/bin/env python3
"""Same recordings, two versions of the code: does a refactor change what detection reports?

    python benchmarks/equivalence/run.py runs DIR OUT.json      # every DIR/<run>/ (reveal record)
    python benchmarks/equivalence/run.py jobs DIR OUT.json      # every DIR/*/jobs/<job>/ (peers)
    python benchmarks/equivalence/run.py compare A.json B.json

``runs``: each recorded run is copied (without its feature files and report) and analysed by
the code this script imports (put the version under test first on ``PYTHONPATH``), batch and
``--full``; the digest keeps each anomaly's subsystem, bounds, score and first evidence
channels.  ``jobs``: each kept multi-node job of ``benchmarks/peers/run.py --keep`` is copied
and analysed with ``reveal analyze JOBDIR`` then ``reveal report JOBDIR`` run by the same
interpreter and ``PYTHONPATH``; the digest keeps the job's peer suspects and each node's
anomalies.  The header names the commit of the imported code and whether its tree was clean.
``compare`` prints the entries that differ and exits 1 when any does.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

IGNORE = shutil.ignore_patterns("features", "report.json", "report.html")


def _code_header() -> dict:
    import reveal_plugins
    root = os.path.dirname(os.path.dirname(os.path.abspath(reveal_plugins.__file__)))
    git = ["git", "-C", root]
    rev = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout
    dirty = subprocess.run(git + ["status", "--porcelain", "--", "reveal_plugins"],
                           capture_output=True, text=True).stdout
    return {"code": root, "commit": rev.strip(), "tree_clean": not dirty.strip()}


def _anoms(rep: dict) -> list:
    return [(a["subsystem"], round(a["start"], 2), round(a["end"], 2), round(a["score"], 3),
             [e.get("channel") for e in a.get("evidence", [])[:3]])
            for a in rep.get("anomalies", [])]


def runs(src: str) -> dict:
    from reveal_plugins.detect.pipeline import analyze
    out = {}
    for n in sorted(os.listdir(src)):
        d = os.path.join(src, n)
        if not os.path.isfile(os.path.join(d, "meta.json")):
            continue
        for mode, cfg in (("batch", {}), ("full", {"full": True})):
            tmp = tempfile.mkdtemp()
            try:
                dd = os.path.join(tmp, n)
                shutil.copytree(d, dd, ignore=IGNORE)
                rep = analyze(dd, cfg)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            out[f"{n}/{mode}"] = {"status": rep["status"], "anomalies": _anoms(rep),
                                  "observations": len(rep.get("observations", [])),
                                  "flagged": rep["analysis"].get("flagged_windows")}
            print(n, mode, out[f"{n}/{mode}"]["anomalies"], flush=True)
    return out


def jobs(keep: str) -> dict:
    out = {}
    for jobdir in sorted(glob.glob(os.path.join(keep, "*", "jobs", "*"))):
        tmp = tempfile.mkdtemp()
        try:
            jd = os.path.join(tmp, os.path.basename(jobdir))
            shutil.copytree(jobdir, jd, ignore=IGNORE)
            cli = [sys.executable, "-m", "reveal_plugins.cli"]
            subprocess.run(cli + ["analyze", jd], capture_output=True, text=True, timeout=900)
            r = subprocess.run(cli + ["report", jd, "--format", "json"], capture_output=True,
                               text=True, timeout=900)
            key = os.path.basename(jobdir)
            try:
                job = json.loads(r.stdout)
            except ValueError:
                out[key] = {"error": r.stderr[-500:]}
                continue
            nodes = {}
            for n in sorted(os.listdir(jd)):
                p = os.path.join(jd, n, "report.json")
                if os.path.isfile(p):
                    with open(p) as f:
                        nodes[n] = _anoms(json.load(f))
            sus = [(s.get("node"), s.get("subsystem"), round(s.get("start", 0), 2),
                    round(s.get("end", 0), 2), round(s.get("score", 0), 3))
                   for s in (job.get("peers") or {}).get("suspects", [])]
            out[key] = {"suspects": sus, "nodes": nodes}
            print(key, sus, nodes, flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def compare(a_path: str, b_path: str) -> int:
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    ra, rb = a["results"], b["results"]
    diff = sorted(k for k in set(ra) | set(rb) if ra.get(k) != rb.get(k))
    for k in diff:
        print(f"{k}:\n  {a['header']['commit'][:10]}: {ra.get(k)}\n"
              f"  {b['header']['commit'][:10]}: {rb.get(k)}")
    print(f"{len(set(ra) | set(rb)) - len(diff)} of {len(set(ra) | set(rb))} identical")
    return 1 if diff else 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "compare":
        return compare(argv[1], argv[2])
    if len(argv) != 3 or argv[0] not in ("runs", "jobs"):
        print(__doc__, file=sys.stderr)
        return 2
    what, src, out = argv
    res = runs(src) if what == "runs" else jobs(src)
    doc = {"header": {**_code_header(), "what": what, "source": os.path.abspath(src)},
           "results": res}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{len(res)} entries -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
