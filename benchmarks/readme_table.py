#!/usr/bin/env python3
"""README's "Measured" table, rendered from the committed results files.

    python benchmarks/readme_table.py            # print the table
    python benchmarks/readme_table.py --write    # replace it in README.md (between the markers)
    python benchmarks/readme_table.py --check    # exit 1 when README.md differs (the test does this)
    python benchmarks/readme_table.py --commands # how to rerun every row

Every row names its results file(s), the commit and the split they were measured at.  A row's
file is chosen among the files matching its pattern (``ROWS``): complete documents that hold the
row's figures, a ``test`` result before a ``dev`` one, then the newest.  A row without any file
says "not yet re-measured" and the command that measures it; no figure is written by hand.

Results files are the benchmarks' JSON documents (:mod:`results`: ``{"header": ..., figures}``);
a few figures measured before results headers existed are read from the committed files they
were written to (``LEGACY``: text or header-less JSON; the commit that ran is what the file
recorded, or unknown, and the commit that added the file is named instead).
"""
from __future__ import annotations

import argparse
import difflib
import glob
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
README = os.path.join(ROOT, "README.md")
BEGIN = ("<!-- measured:begin (rendered by benchmarks/readme_table.py from the results files; "
         "edit those, not this table) -->")
END = "<!-- measured:end -->"
NOT_YET = "not yet re-measured"
HEAD = ("| what | figure | reference in the same run | results file | commit | split |\n"
        "| --- | --- | --- | --- | --- | --- |")


# ---------------------------------------------------------------- reading results files

def _peers_legacy(path: str, seed: int) -> dict:
    """A section of the text results of benchmarks/peers/run.py before results headers."""
    with open(path) as f:
        sections = [s.strip().splitlines() for s in f.read().split("\n\n") if s.strip()]
    head_re = re.compile(r"^# (?P<cmd>\S+ .+?)\s+\((?P<date>[^,]+), git (?P<rev>\w+), "
                         r"(?P<cores>\d+) CPUs, load (?P<load>[\d.]+)\)$")
    for lines in sections:
        m = head_re.match(lines[0])
        if not m or f"--seed {seed}" not in m["cmd"]:
            continue
        kv: dict[str, str] = {}
        kinds = {"node": [0, 0], "sub": [0, 0], "ref node": [0, 0]}
        for ln in lines[1:]:
            if ln.startswith("per kind: "):
                for part in ln[len("per kind: "):].split("; "):
                    k = re.fullmatch(r"\w+: node (\d+)/(\d+) sub (\d+)/(\d+) "
                                     r"ref node (\d+)/(\d+)", part)
                    if not k:
                        raise ValueError(f"{path}: per kind: {part!r}")
                    for i, what in enumerate(kinds):
                        kinds[what][0] += int(k[2 * i + 1])
                        kinds[what][1] += int(k[2 * i + 2])
            elif not ln.startswith(("run=", "per tool")):
                kv.update(t.split("=", 1) for t in ln.split() if "=" in t)
        frac = lambda k: int(kv[k].split("/")[0])  # noqa: E731
        n_fault, n_clean = int(kv["fault_runs"]), int(kv["clean_runs"])
        if kinds["node"][1] != n_fault:
            raise ValueError(f"{path}: per-kind counts do not add up to fault_runs")
        cmd = m["cmd"] if m["cmd"].startswith("python") else "python " + m["cmd"]
        return {
            "header": {"legacy": "text results written before results headers",
                       "benchmark": "peers", "command": cmd, "commit": m["rev"],
                       "tree_clean": None,
                       "date": m["date"].replace(" UTC", "Z").replace(" ", "T"),
                       "split": "dev", "recorded_split": "test",
                       "machine": {"cores": int(m["cores"]), "loadavg_1m_at_start":
                                   float(m["load"])}, "complete": True},
            "seed": seed, "summary": lines[1:],
            "figures": {"fault_runs": n_fault, "clean_runs": n_clean,
                        "failed_runs": int(kv["failed_runs"]),
                        "node_ok": kinds["node"][0], "subsystem_ok": kinds["sub"][0],
                        "false_suspects_clean": frac("false_suspects_clean"),
                        "live_false_clean": frac("live_false_clean"),
                        "live_latency_s_p50": float(kv["live_latency_s_p50"]),
                        "ref_node_ok": kinds["ref node"][0],
                        "ref_false_clean": frac("ref_false_clean")},
        }
    raise ValueError(f"{path}: no section with --seed {seed}")


def _kv_legacy(path: str, committed_in: str, benchmark: str) -> dict:
    """key=value text results (reliability, slurm_faults) before results headers."""
    with open(path) as f:
        lines = f.read().splitlines()
    m = re.match(r"^# (?P<cmd>python \S+(?: \S+)*?)\s+\((?P<note>.*), (?P<date>\d{4}-\d\d-\d\d)"
                 r"(?:, (?P<more>.*))?\)$", lines[0])
    if not m:
        raise ValueError(f"{path}: no header line")
    kv: dict = {}
    for ln in lines[1:]:
        for t in ln.split():
            if "=" in t:
                k, v = t.split("=", 1)
                try:
                    kv[k] = int(v)
                except ValueError:
                    kv[k] = float(v)
    modes = sorted({ln.split()[0] for ln in lines[2:] if ln and "=" not in ln})
    if modes:
        kv["modes"] = modes
    return {"header": {"legacy": "text results written before results headers",
                       "benchmark": benchmark, "command": m["cmd"], "commit": None,
                       "committed_in": committed_in, "tree_clean": None, "date": m["date"],
                       "split": "dev", "machine": {"note": m["note"]}, "complete": True},
            "figures": kv}


def _fleet_legacy(path: str, committed_in: str) -> dict:
    with open(path) as f:
        d = json.load(f)
    return {"header": {"legacy": "JSON written before results headers", "benchmark": "fleet",
                       "command": "python benchmarks/scale/fleet.py (options not recorded)",
                       "commit": None, "committed_in": committed_in, "tree_clean": None,
                       "date": d["measured"].replace(" UTC", "Z").replace(" ", "T"),
                       "split": "dev", "complete": True,
                       "machine": {"cores": d["cores"]}},
            "sizes": d["sizes"]}


#: committed files written before results headers -> how to read them (the commit that added
#: or last changed the file: ``git log --format=%h -1 -- FILE``)
LEGACY: dict[str, Callable[[str], dict]] = {
    "benchmarks/peers/results/2026-12-03.txt": lambda p: _peers_legacy(p, 31),
    "benchmarks/reliability/results/2026-12-03.txt":
        lambda p: _kv_legacy(p, "e514b33", "reliability"),
    "benchmarks/reliability/results/2026-12-03-slurm-faults.txt":
        lambda p: _kv_legacy(p, "1943878", "slurm_faults"),
    "benchmarks/scale/results-fleet.json": lambda p: _fleet_legacy(p, "4793028"),
}


def load(rel: str) -> dict:
    """A results file as ``{"header": {...}, figures...}`` (legacy formats normalised)."""
    path = os.path.join(ROOT, rel)
    if rel in LEGACY:
        return LEGACY[rel](path)
    with open(path) as f:
        d = json.load(f)
    if "header" not in d and "commit" in d and "tree_clean" in d:
        # benchmarks/gpu/probe_fake.py: its own header fields at the top level
        head = {k: d[k] for k in ("benchmark", "command", "commit", "tree_clean", "date",
                                  "machine") if k in d}
        d = dict(d, header=dict(head, split=d.get("split"), complete=True))
    if "header" not in d:
        raise ValueError(f"{rel}: no results header")
    return d


# ---------------------------------------------------------------- rows

def _med(x: float | None, fmt: str = ".1f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _ref_name(k: str) -> str:
    k = k[len("reference_"):].removeprefix("pipeline_")
    return {"iforest": "IsolationForest", "pca": "PCA", "kmeans": "k-means",
            "robust_z": "robust z"}.get(k, k)


def _detection(d: dict) -> tuple[str, str, str]:
    split = "test" if "test" in d else "dev"
    s = d[split]
    r = s["reveal"]
    kinds = len(r.get("per_kind") or {})
    victims = len(r.get("per_victim") or {})
    what = (f"detection, labeled benchmark, **{split} split** ({r['injections']} injections of "
            f"{kinds} kinds: stress-ng, own injectors, tc tbf; {victims} victim shapes; "
            f"{r['clean_hours']:.2f} h clean; seed {d.get('seed')}"
            + "".join(f", clean runs of seed {x}" for x in d.get("extra_clean_seeds") or [])
            + ")")
    live = r.get("live_latency_s_median")
    fig = (f"F1 {r['f1']:.3f}, recall {r['detected']}/{r['injections']}, attribution "
           f"{100 * r['attribution_accuracy']:.0f} %, live onset "
           f"{_med(live)} s median, {_med(r['false_events_per_clean_hour'])} false events per "
           f"clean hour (95 % bound {_med(r['false_events_per_clean_hour_95ub'], '.0f')})")
    parts = []
    tuned = " (thresholds tuned on dev)" if d.get("pipeline_reference_thresholds") else ""
    for label, pipe in (("alone, per sample", False), ("in the pipeline, alone" + tuned, True)):
        refs = {k: v for k, v in s.items() if k.startswith("reference_")
                and k.startswith("reference_pipeline_") == pipe}
        if not refs:
            continue
        fe = [v["false_events_per_clean_hour"] for v in refs.values()
              if v.get("false_events_per_clean_hour") is not None]
        ref = ", ".join(f"{_ref_name(k)} F1 {v['f1']:.2f}" for k, v in refs.items())
        if fe:
            ref += f" ({min(fe):.0f}-{max(fe):.0f} false events/h)"
        parts.append(f"{label}: {ref}")
    return what, fig, "; ".join(parts)


def _injected(d: dict) -> int:
    return sum(int((d.get(s) or {}).get("reveal", {}).get("injections") or 0)
               for s in ("test", "dev"))


def _seed_of(name: str) -> str:
    m = re.search(r"xclean(\d+)-", name)     # a rescored run keeps its seed in its name
    return m.group(1) if m else "?"


def _long_clean(d: dict) -> tuple[str, str, str]:
    """One clean run longer than ``stream_after_s`` (an hour): the streamed analysis of a
    job with its own eval and checkpoint phases, nothing injected."""
    split = "test" if "test" in d else "dev"
    r, run = d[split]["reveal"], d["runs"][0]
    what = (f"detection, one clean training run of {r['clean_hours']:.2f} h, nothing injected "
            f"({run.get('victim', '?')} victim: its own eval and checkpoint phases; analysed "
            f"{'streamed from its feature store' if run.get('streamed') else 'in memory'}; "
            f"seed {d.get('seed') or _seed_of(run['name'])}; {split} split)")
    fig = (f"{len(run['found'])} false events ({_med(r['false_events_per_clean_hour'])} per "
           f"clean hour, 95 % bound {_med(r['false_events_per_clean_hour_95ub'])}), "
           f"{len(run.get('observations') or [])} observations; analysis "
           f"{run['analysis_s']:.0f} s")
    refs = {k: v for k, v in d[split].items() if k.startswith("reference_")
            and not k.startswith("reference_pipeline_")}
    ref = ", ".join(f"{_ref_name(k)} {v['false_events_per_clean_hour']:.0f}"
                    for k, v in refs.items() if v.get("false_events_per_clean_hour") is not None)
    return what, fig, (f"per-sample detectors alone, false events per clean hour: {ref}"
                       if ref else "")


def _perf(d: dict) -> tuple[str, str, str]:
    r = [x for x in d["rows"] if x["minutes"] == 60][0]
    ref = (f"1×IsolationForest: {r['reference_seconds']:.1f} s, "
           f"{r['reference_peak_rss_mb']} MB" if "reference_seconds" in r else "")
    return (f"analysis of 1 h × {r['channels']} channels at 10 Hz",
            f"{r['seconds']:.1f} s, {r['peak_rss_mb']} MB peak", ref)


def _scale(docs: dict) -> tuple[str, str, str]:
    def one(d):
        j = d["job_end"]
        return f"{j['seconds']:.1f} s, {j['peak_rss_mb']:.0f} MB"
    fig = one(docs["7 days"]) + " (goal ≤ 60 s, ≤ 1 GB)"
    for k in ("24 h", "1 h"):
        if k in docs:
            fig += f"; {k}: {one(docs[k])}"
    ref = ""
    if "1 h" in docs and "in_memory" in docs["1 h"]:
        m = docs["1 h"]["in_memory"]
        ref = f"in-memory pipeline, 1 h: {m['seconds']:.1f} s, {m['peak_rss_mb']:.0f} MB"
    return ("analysis of 7 days × 688 channels at 10 Hz, at job end ([scale](docs/scale.md))",
            fig, ref)


def _slurm(d: dict) -> tuple[str, str, str]:
    t = {(r["phase"], r["hook"]): r for r in d["table"]}
    sp, se = t[("spank", "prolog")], t[("spank", "epilog")]
    over = sp["over_budget"] + se["over_budget"]
    scripts = max(t[("scripts", h)]["p99_ms"] for h in ("prolog", "epilog")) / 1e3
    floor = sorted(t[("ref", h)]["p50_ms"] / 1e3 for h in ("prolog", "epilog"))
    return (f"Slurm hooks, SPANK setup, {sp['n']} jobs",
            f"Prolog p99 {sp['p99_ms'] / 1e3:.2f} s, Epilog p99 {se['p99_ms'] / 1e3:.2f} s, "
            f"{over} over budget",
            f"Python script hooks: p99 {scripts:.1f} s (interpreter start alone "
            f"{floor[0]:.2f}–{floor[1]:.2f} s)")


def _torch(d: dict) -> tuple[str, str, str]:
    h = d["markers"]
    return ("iteration markers", f"{h['hook_us']:.2f} µs per optimizer step (hook alone, "
            f"thread CPU time, best block)", f"optimizer.step() of a tiny model: "
            f"{h['step_us']:.1f} µs")


def _otel(d: dict) -> tuple[str, str, str]:
    r = {x["case"]: x for x in d["record"]}
    hung = [x for k, x in r.items() if "hung" in k][0]
    down = [x for k, x in r.items() if "down" in k][0]
    off = [x for k, x in r.items() if "reference" in k][0]
    return ("OTLP backend hung / down at job end",
            f"+{hung['median_minus_ref_s']:.1f} s / +{down['median_minus_ref_s']:.2f} s",
            f"export off: `reveal record -- true` {off['median_s']:.2f} s")


def _report(d: dict) -> tuple[str, str, str]:
    return (f"HTML report of a {d['seconds'] / 3600:g} h run",
            f"~{d['run_10hz']['html_KiB']:.0f} KiB",
            f"the same at 1 Hz: ~{d['reference_1hz']['html_KiB']:.0f} KiB")


def _peers(d: dict) -> tuple[str, str, str]:
    f, h = d["figures"], d["header"]
    split = f"{h['split']} split"
    if h.get("recorded_split") and h["recorded_split"] != h["split"]:
        split += f", run as {h['recorded_split']} and looked at while the code changed"
    tools = ("several tools per kind, some held out" if h["split"] != "dev" else
             "several tools per kind")
    what = (f"peer comparison, 2-node jobs, {split} (seed {d['seed']}): {f['fault_runs']} faults "
            f"injected from outside after `ready` (cpu, tbf/htb, memory, io; {tools}) on a "
            f"random node + {f['clean_runs']} clean "
            f"([multinode](docs/multinode.md#benchmark))")
    n, c = f["fault_runs"], f["clean_runs"]
    fig = (f"right node {f['node_ok']}/{n}, right subsystem {f['subsystem_ok']}/{n}, "
           f"clean runs with a suspect: {f['false_suspects_clean']}/{c} at job end, "
           f"{f['live_false_clean']}/{c} live; live p50 {_med(f['live_latency_s_p50'])} s")
    if f.get("failed_runs"):
        fig += f" ({f['failed_runs']} runs failed)"
    ref = (f"per-node reports alone, highest score: node {f['ref_node_ok']}/{n}, "
           f"{f['ref_false_clean']}/{c} clean runs with a suspect")
    return what, fig, ref


def _reliability(d: dict) -> tuple[str, str, str]:
    f = d.get("figures") or d
    return ("root agent under a local attacker (2,000 idle conns, slow drips, oversized lines, "
            "event flood)",
            f"root ping worst {f['worst_root_ms']:.0f} ms (p99 {f['p99_root_ms']:.0f} ms), "
            f"{round(f['requests_per_s'], -2):,.0f} req/s, RSS {f['rss_mb']:.0f} MB, "
            f"{f['segments_lost']} segments lost in {f['kills']} × kill -9",
            f"no attack: ping p99 {f['baseline_p99_ms']:.1f} ms")


def _exit_abort(d: dict) -> tuple[str, str, str]:
    n, a = d["runs_per_side"], d["aborted"]
    return (f"`reveal analyze` of a 90-s run, {n} times in {d['streams']} parallel streams: "
            "aborted at exit", f"{a['current']} of {n}",
            f"revision {d['reference']['given']}, interleaved: {a['reference']} of {n}")


def _slurm_faults(d: dict) -> tuple[str, str, str]:
    f = d["figures"]
    return (f"hook faults on a real Slurm ({f['fault_kinds']} kinds × {len(f['modes'])} setups)",
            f"{f['faults_injected']} faults, {f['jobs_completed']} jobs completed, "
            f"{f['nodes_drained']} nodes drained", "")


def _fleet(d: dict) -> tuple[str, str, str]:
    n = max(d["sizes"], key=int)
    s = d["sizes"][n]
    w2 = s["dask_2w"]
    return (f"fleet pass (`index` + `nodes`), {int(n):,} runs ([fleet](docs/fleet.md))",
            f"{w2['total_s']:.0f} s with 2 embedded Dask workers ({s['speedup_2w_vs_1w']:.2f}× "
            f"one), {w2['peak_rss_mb']:.0f} MB peak (all processes)",
            f"single process, no Dask: {s['reference']['total_s']:.0f} s")


def _gpu(d: dict) -> tuple[str, str, str]:
    m = d["modes"]
    cur, old, ref = (m[k] for k in ("current_driver", "old_driver",
                                    "32bit_counters_refused_gpu"))
    fig = (f"{cur['probe']['per_sample_median_ms']:.2f} ms (current driver), "
           f"{old['probe']['per_sample_median_ms']:.2f} ms (old driver), "
           f"{ref['probe']['per_sample_median_ms']:.2f} ms (one GPU refused, 32-bit counters)")
    p = [x.get("previous") or {} for x in (cur, old, ref)]
    parts = [f"{x['per_sample_median_ms']:.2f} ms" if "per_sample_median_ms" in x else
             "fails" if "error" in x else "not measured" for x in p]
    rf = f"previous probe ({d.get('previous_rev')}): {' / '.join(parts)}"
    if "per_sample_p99_ms" in p[1]:
        rf += f"; p99 {p[1]['per_sample_p99_ms']:.0f} ms on the old driver"
    return "NVML probe, 8 GPUs on the driver-level fake: median ms per sample", fig, rf


@dataclass
class Row:
    #: the "what" shown while the row has no results file
    what: str
    #: source name -> glob pattern (relative to the repository root); the first is required
    sources: dict[str, str]
    #: docs (source name -> document; one source: the document itself) -> (what, figure, ref)
    render: Callable[[dict], tuple[str, str, str]]
    #: how to measure it
    rerun: list[str]
    #: source name -> predicate on a document: does it hold this row's figures
    need: dict[str, Callable[[dict], bool]] = field(default_factory=dict)


_TEST = "--split test"
ROWS = [
    Row("collector CPU, procfs+PSI at 10 Hz (default schedule)",
        {"": "benchmarks/telemetry/results/telemetry-*.json"},
        lambda d: ("collector CPU, procfs+PSI at 10 Hz (default schedule)",
                   f"{d['cpu']['ours_cpu_pct_median']:.2f} % of one core (goal 0.3 %: "
                   f"{'met' if d['cpu']['ours_cpu_pct_median'] <= 0.3 else '**not met**'}; "
                   f"bare reads of the same files cost "
                   f"{d['cpu']['raw_floor_cpu_pct_median']:.2f} %)",
                   f"prometheus-node-exporter scraped at 10 Hz: "
                   f"{d['cpu']['ne_cpu_pct_median']:.1f} % "
                   f"({d['cpu']['ratio_median']:.0f}× more)"),
        [f"python benchmarks/telemetry/run.py --only cpu {_TEST}"],
        {"": lambda d: "cpu" in d}),
    Row("stored telemetry",
        {"": "benchmarks/telemetry/results/telemetry-*.json"},
        lambda d: ("stored telemetry",
                   f"{d['storage']['steady_Bps_median'] / 1e3:.2f} KB/s per host "
                   f"(+{d['storage']['runs'][0]['meta_bytes'] / 1e3:.0f} KB meta.json per run)",
                   "paper: 14–22 KB/s"),
        [f"python benchmarks/telemetry/run.py --only storage {_TEST}"],
        {"": lambda d: "storage" in d}),
    Row("node agent, everything at 10 Hz (all probes, segments, features)",
        {"": "benchmarks/telemetry/results/agent-threads-*.json"},
        lambda d: ("node agent, everything at 10 Hz (all probes, segments, features)",
                   f"{d['current_total_pct_median']:.2f} % of one core (goal 0.3 %: "
                   f"{'met' if d['current_total_pct_median'] <= 0.3 else '**not met**'}; "
                   f"sampling thread "
                   f"{d['current_threads_pct_median'].get('reveal-sampler', float('nan')):.2f}"
                   f" %)",
                   (f"prometheus-node-exporter scraped at 10 Hz, same spans: "
                    f"{d['node_exporter_pct_median']:.2f} % "
                    f"({d['node_exporter_pct_median'] / d['current_total_pct_median']:.1f}× "
                    f"more); a Python loop that only wakes at 10 Hz: "
                    f"{d['idle_loop_pct_median']:.2f} %; " if "node_exporter_pct_median" in d
                    else "") +
                   ("the agent's host files read on its schedule without parsing: "
                    + ", ".join(f"in {'C' if k == 'native_read' else 'Python'} {v:.2f} %"
                                for k, v in sorted(d["read_floor_pct_median"].items()))
                    + "; " if d.get("read_floor_pct_median") else "") +
                   f"revision {d['reference']['given']} alternating with it on the same machine:"
                   f" {d['reference_total_pct_median']:.2f} % (`reveal record -- sleep 50`, "
                   f"steady part)" +
                   (f"; agent memory {d['memory_mb_median']['current']['vmrss_mb']:.0f} MB "
                    f"(reference {d['memory_mb_median']['reference']['vmrss_mb']:.0f} MB), "
                    f"`reveal record -- true` {d['record_true_s_median']['current']:.2f} s "
                    f"(reference {d['record_true_s_median']['reference']:.2f} s)"
                    if "memory_mb_median" in d else "")),
        [f"python benchmarks/telemetry/agent_threads.py {_TEST}"],
        {"": lambda d: "current_total_pct_median" in d}),
    Row("detection, labeled benchmark (injections of 15 kinds: stress-ng, own injectors, tc tbf; "
        "5 victim shapes)",
        {"": "benchmarks/detection/results/detection-*.json"}, _detection,
        ["python benchmarks/detection/run.py --split dev --out DIR  # tune on dev",
         f"python benchmarks/detection/run.py {_TEST} --seed FRESH_SEED --out DIR  "
         f"# once, on the final code"],
        {"": lambda d: _injected(d) > 0}),
    Row("detection, one clean training run longer than an hour",
        {"": "benchmarks/detection/results/detection-*.json"}, _long_clean,
        [f"python benchmarks/detection/run.py {_TEST} --seconds 3800 --extra-clean 4 "
         "--seed FRESH_SEED --only test-xcleanFRESH_SEED-03-phases --out DIR"],
        {"": lambda d: _injected(d) == 0 and len(d.get("runs") or []) == 1
         and d["runs"][0].get("duration_s", 0) > 3600}),
    Row("analysis of 1 h × 688 channels at 10 Hz",
        {"": "benchmarks/detection/results/perf-*.json"}, _perf,
        [f"python benchmarks/detection/perf.py --minutes 60 --reference {_TEST}"],
        {"": lambda d: any(r["minutes"] == 60 for r in d["rows"])}),
    Row("analysis of 7 days × 688 channels at 10 Hz, at job end ([scale](docs/scale.md))",
        {"7 days": "benchmarks/scale/results/scale-168h-*.json",
         "24 h": "benchmarks/scale/results/scale-24h-*.json",
         "1 h": "benchmarks/scale/results/scale-1h-*.json"}, _scale,
        [f"python benchmarks/scale/run.py --hours {h} {_TEST}" for h in (168, 24, 1)]),
    Row("Slurm hooks, SPANK setup, 50 jobs", {"": "benchmarks/slurm/results/slurm-*.json"},
        _slurm, [f"python benchmarks/slurm/run.py --jobs 50 {_TEST}  # root"]),
    Row("iteration markers", {"": "benchmarks/torch/results/torch-*.json"}, _torch,
        [f"python benchmarks/torch/run.py {_TEST}"]),
    Row("OTLP backend hung / down at job end", {"": "benchmarks/otel/results/otel-*.json"},
        _otel, [f"python benchmarks/otel/run.py {_TEST}"], {"": lambda d: "record" in d}),
    Row("HTML report of a 2 h run", {"": "benchmarks/report/results/report-*.json"}, _report,
        [f"python benchmarks/report/run.py {_TEST}"]),
    Row("peer comparison, 2-node jobs", {"": "benchmarks/peers/results/*"}, _peers,
        ["python benchmarks/peers/run.py --runs 24 --seconds 45 --split dev  # root",
         f"python benchmarks/peers/run.py --runs 24 --seconds 45 {_TEST} --seed FRESH_SEED"
         f"  # root, once, on the final code"],
        {"": lambda d: "figures" in d and "fault_runs" in d["figures"]}),
    Row("root agent under a local attacker",
        {"": "benchmarks/reliability/results/*"}, _reliability,
        [f"python benchmarks/reliability/run.py --seconds 30 --kills 50 {_TEST}  # root"],
        {"": lambda d: d["header"].get("benchmark") == "reliability"}),
    Row("`reveal analyze` aborted at exit", {"": "benchmarks/reliability/results/*"},
        _exit_abort, [f"python benchmarks/reliability/exit_abort.py --runs 100 {_TEST}"],
        {"": lambda d: d["header"].get("benchmark") == "exit_abort"}),
    Row("hook faults on a real Slurm", {"": "benchmarks/reliability/results/*"},
        _slurm_faults,
        [f"python benchmarks/reliability/slurm_faults.py --jobs 3 {_TEST}  # root"],
        {"": lambda d: d["header"].get("benchmark") == "slurm_faults"}),
    Row("fleet pass (`index` + `nodes`), 10,000 runs ([fleet](docs/fleet.md))",
        {"": "benchmarks/scale/results*"}, _fleet,
        [f"python benchmarks/scale/fleet.py --runs 10000 {_TEST}"],
        {"": lambda d: d["header"].get("benchmark") == "fleet"}),
    Row("NVML probe, 8 GPUs on the driver-level fake: median ms per sample",
        {"": "benchmarks/gpu/results/*.json"}, _gpu,
        [f"python benchmarks/gpu/probe_fake.py --samples 300 {_TEST}"],
        {"": lambda d: "modes" in d}),
]


def _candidates(pattern: str) -> list[str]:
    out = []
    for p in sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True)):
        if os.path.isdir(p):
            out += sorted(glob.glob(os.path.join(p, "**", "*"), recursive=True))
        else:
            out.append(p)
    rels = [os.path.relpath(p, ROOT) for p in out if os.path.isfile(p)]
    return [r for r in rels if r.endswith(".json") or r in LEGACY]


def pick(pattern: str, need: Callable[[dict], bool] | None = None) -> tuple[str, dict] | None:
    """The results file for a row: complete, holding the row's figures, test before dev, then
    the newest."""
    best = None
    for rel in _candidates(pattern):
        try:
            d = load(rel)
        except (ValueError, KeyError, OSError, AttributeError):
            continue
        h = d["header"]
        if h.get("complete") is False or (need is not None and not need(d)):
            continue
        key = (h.get("split") == "test", str(h.get("date") or ""), rel)
        if best is None or key > best[0]:
            best = (key, rel, d)
    return None if best is None else (best[1], best[2])


def _commit(h: dict) -> str:
    if h.get("commit"):
        c = h["commit"][:7]
        if h.get("tree_clean") is False:
            return f"{c} (dirty tree)"
        if h.get("tree_clean") is None:
            return f"{c} (tree state not recorded)"
        return c
    if h.get("committed_in"):
        return f"not recorded (file from {h['committed_in']})"
    return "not recorded"


def _split(h: dict) -> str:
    s = h.get("split") or "not recorded"
    if h.get("recorded_split") and h["recorded_split"] != s:
        s += f" (recorded as {h['recorded_split']})"
    return s


def render_rows() -> list[dict]:
    out = []
    for row in ROWS:
        found = {}
        for name, pattern in row.sources.items():
            got = pick(pattern, row.need.get(name))
            if got:
                found[name] = got
        first = next(iter(row.sources))
        if first not in found:
            out.append({"what": row.what, "figure": f"{NOT_YET}: `" + "`; `".join(
                c.split("  #")[0] for c in row.rerun if _TEST in c or len(row.rerun) == 1)
                + "`", "reference": "", "files": [], "rerun": row.rerun})
            continue
        docs = {k: v[1] for k, v in found.items()}
        what, fig, ref = row.render(docs[""] if list(row.sources) == [""] else docs)
        out.append({"what": what, "figure": fig, "reference": ref, "rerun": row.rerun,
                    "files": [(rel, d["header"]) for rel, d in found.values()]})
    return out


def render() -> str:
    lines = [BEGIN, HEAD]
    for r in render_rows():
        files = "<br>".join(f"[{os.path.relpath(rel, 'benchmarks')}]({rel})"
                            for rel, _ in r["files"]) or "—"
        commits = "<br>".join(_commit(h) for _, h in r["files"]) or "—"
        splits = "<br>".join(_split(h) for _, h in r["files"]) or "—"
        cells = [r["what"], r["figure"], r["reference"], files, commits, splits]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append(END)
    return "\n".join(lines)


def readme_block(text: str) -> str | None:
    i, j = text.find(BEGIN), text.find(END)
    return None if i < 0 or j < i else text[i:j + len(END)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="replace the table in README.md")
    g.add_argument("--check", action="store_true", help="exit 1 when README.md differs")
    g.add_argument("--commands", action="store_true", help="print how to rerun every row")
    a = ap.parse_args(argv)
    if a.commands:
        for r in render_rows():
            src = ", ".join(rel for rel, _ in r["files"]) or NOT_YET
            print(f"# {r['what']}  [{src}]")
            for c in r["rerun"]:
                print(c)
            print()
        return 0
    table = render()
    if not (a.write or a.check):
        print(table)
        return 0
    with open(README) as f:
        text = f.read()
    block = readme_block(text)
    if block is None:
        print(f"README.md: no {BEGIN!r} ... {END!r} block", file=sys.stderr)
        return 1
    if a.check:
        if block == table:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            block.splitlines(True), table.splitlines(True), "README.md", "rendered"))
        return 1
    with open(README, "w") as f:
        f.write(text.replace(block, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
