"""``reveal compare A B``: what differs between two runs of the same workload.

Meant for "it was faster yesterday": the channels whose typical level moved most between the
two runs (each run's middle 80 %, so start-up and teardown do not dominate), the iteration
time where the runs carry markers, wall time, exit codes, steps and the verdicts.  A channel
counts as changed when its median moved by at least ``--min-change`` of run A's level and by
at least three of the runs' pooled spreads (so a noisy channel does not fill the list)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

from ..cli_options import EXIT_OK, EXIT_PROBLEM, add_format

TRIM = 0.10          # each end of a run left out of the channel levels
MIN_SPREADS = 3.0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", metavar="A", help="run directory (the reference)")
    ap.add_argument("run_b", metavar="B", help="run directory (the one to explain)")
    ap.add_argument("--top", type=int, default=15, metavar="N",
                    help="channels listed, largest change first (default 15)")
    ap.add_argument("--min-change", type=float, default=0.10, metavar="FRACTION",
                    help="smallest relative change of a channel's median listed (default 0.10)")
    add_format(ap)
    return ap


def _levels(run_dir: str) -> tuple[dict[str, tuple[float, float, str]], dict[str, Any]]:
    """{channel: (median, spread, unit)} over the run's middle, and facts about the run."""
    from ..detect.batch.prepare import load_prepared
    from ..report.views import iteration_times
    from ..store.store import (MAX_REPORT_BYTES, StoreError, parse_json, read_bounded,
                               read_events, read_meta)
    from ..types import ChannelMeta
    meta = read_meta(run_dir)
    metas = [ChannelMeta.from_dict(c) for c in meta.get("channels", [])]
    P, _, _, _ = load_prepared(run_dir, metas)
    levels: dict[str, tuple[float, float, str]] = {}
    if len(P.t) >= 5:
        lo, hi = np.quantile(P.t, [TRIM, 1 - TRIM])
        m = (P.t >= lo) & (P.t <= hi)
        X = P.X[m]
        for j, name in enumerate(P.names):
            x = X[:, j]
            x = x[np.isfinite(x)]
            if len(x) < 3:
                continue
            q1, med, q3 = np.percentile(x, [25, 50, 75])
            levels[name] = (float(med), float(q3 - q1) / 1.349, P.units[j])
    events = read_events(run_dir)
    _, dt = iteration_times(events)
    run = meta.get("run") or {}
    start, end = meta.get("start"), meta.get("end")
    facts = {"run_dir": os.path.abspath(run_dir), "command": run.get("command"),
             "host": meta.get("host"), "exit_code": meta.get("exit_code"),
             "duration_s": (end - start) if isinstance(start, (int, float))
             and isinstance(end, (int, float)) else None,
             "samples": int(len(P.t)),
             "iteration_s": float(np.median(dt)) if len(dt) >= 3 else None,
             "iterations": int(len(dt)),
             "steps": len(meta.get("steps") or []),
             "status": None, "anomalies": None, "cpu_efficiency": None}
    path = os.path.join(run_dir, "report.json")
    try:   # bounded, no symlink followed: the run directory may be another user's
        rep = parse_json(read_bounded(path, MAX_REPORT_BYTES, "report")[0], path)
        facts["status"] = rep.get("status")
        facts["anomalies"] = len(rep.get("anomalies") or [])
        cpu = (rep.get("efficiency") or {}).get("cpu") or {}
        facts["cpu_efficiency"] = cpu.get("efficiency")
    except (OSError, StoreError, ValueError, AttributeError):
        pass
    return levels, facts


def compare(run_a: str, run_b: str, top: int = 15, min_change: float = 0.10) -> dict[str, Any]:
    la, fa = _levels(run_a)
    lb, fb = _levels(run_b)
    changed = []
    for name in sorted(set(la) & set(lb)):
        (ma, sa, unit), (mb, sb, _) = la[name], lb[name]
        spread = max(float(np.hypot(sa, sb)), 1e-9)
        delta = mb - ma
        rel = delta / abs(ma) if abs(ma) > 1e-12 else (np.inf if abs(delta) > 1e-12 else 0.0)
        z = abs(delta) / spread
        if abs(rel) >= min_change and z >= MIN_SPREADS:
            changed.append({"channel": name, "unit": unit, "a": ma, "b": mb,
                            "change": float(rel) if np.isfinite(rel) else None,
                            "spreads": float(min(z, 1e6))})
    changed.sort(key=lambda c: (-(abs(c["change"]) if c["change"] is not None else 1e9),
                                -c["spreads"]))
    notes = []
    if fa["command"] and fb["command"] and fa["command"] != fb["command"]:
        notes.append("the two runs ran different commands: differences may be the workload's")
    ia, ib = fa["iteration_s"], fb["iteration_s"]
    iteration = ({"a": ia, "b": ib, "ratio": ib / ia} if ia and ib else None)
    return {"a": fa, "b": fb, "iteration": iteration,
            "only_in_a": sorted(set(la) - set(lb)), "only_in_b": sorted(set(lb) - set(la)),
            "channels_compared": len(set(la) & set(lb)), "changed": changed[:max(top, 0)],
            "changed_total": len(changed), "notes": notes}


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}"


def format_text(doc: dict[str, Any]) -> str:
    a, b = doc["a"], doc["b"]
    out = [f"A: {a['run_dir']}", f"B: {b['run_dir']}", ""]
    rows = [("wall time", a["duration_s"], b["duration_s"], "s"),
            ("exit code", a["exit_code"], b["exit_code"], ""),
            ("iteration time (median)", a["iteration_s"], b["iteration_s"], "s"),
            ("job CPU efficiency", a["cpu_efficiency"], b["cpu_efficiency"], ""),
            ("anomalies", a["anomalies"], b["anomalies"], "")]
    for label, va, vb, unit in rows:
        if va is None and vb is None:
            continue
        out.append(f"{label:<26} {_num(va):>10} {_num(vb):>10} {unit}")
    out.append(f"{'status':<26} {str(a['status'] or '-'):>10} {str(b['status'] or '-'):>10}")
    if doc["iteration"]:
        out.append(f"iterations in B take {doc['iteration']['ratio']:.2f}x those of A")
    out += [f"note: {n}" for n in doc["notes"]]
    out.append("")
    if doc["changed"]:
        out.append(f"channels that moved (of {doc['channels_compared']} in both runs; median "
                   "of each run's middle 80 %):")
        for c in doc["changed"]:
            ch = "new" if c["change"] is None else f"{c['change']:+.0%}"
            out.append(f"  {c['channel']:<40} {_num(c['a']):>10} -> {_num(c['b']):<10} "
                       f"{c['unit']:<10} {ch:>7}")
        if doc["changed_total"] > len(doc["changed"]):
            out.append(f"  ... and {doc['changed_total'] - len(doc['changed'])} more "
                       "(--top N)")
    else:
        out.append(f"no channel moved by both the threshold and 3 spreads (of "
                   f"{doc['channels_compared']} compared)")
    if doc["only_in_a"] or doc["only_in_b"]:
        out.append(f"channels only in A: {len(doc['only_in_a'])}, only in B: "
                   f"{len(doc['only_in_b'])} (probes differ between the runs)")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from ..store.store import StoreError
    try:
        doc = compare(args.run_a, args.run_b, args.top, args.min_change)
    except (OSError, StoreError, ValueError) as e:
        print(f"reveal compare: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    if args.format == "json":
        print(json.dumps(doc, indent=1, default=float))
    else:
        sys.stdout.write(format_text(doc))
    return EXIT_OK
