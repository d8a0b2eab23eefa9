"""``reveal fleet {index,nodes,baseline,report}``: questions about many runs (docs/fleet.md)."""
from __future__ import annotations

import argparse
import calendar
import json
import sys
import time


def _when(s: str) -> float:
    """A period bound: unix seconds, ``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM[:SS]`` (UTC)."""
    try:
        return float(s)
    except ValueError:
        pass
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return float(calendar.timegm(time.strptime(s, fmt)))
        except ValueError:
            continue
    raise argparse.ArgumentTypeError(f"not a time: {s!r} (unix seconds or YYYY-MM-DD[THH:MM])")


def _period(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--since", type=_when, metavar="WHEN", help="runs started at/after (UTC)")
    ap.add_argument("--until", type=_when, metavar="WHEN", help="runs started before (UTC)")


def main(argv: list[str]) -> int:
    from .dask_runtime import add_options
    ap = argparse.ArgumentParser(prog="reveal fleet",
                                 description="Fleet analysis over many runs (on Dask).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("index", help="collect runs into a Parquet fleet index (incremental)")
    p.add_argument("paths", nargs="+", metavar="SPOOL_OR_RUN_DIR")
    p.add_argument("--out", required=True, metavar="FLEET")
    p.add_argument("--no-features", action="store_true",
                   help="identity and findings only (no window features: faster)")
    add_options(p)
    p = sub.add_parser("nodes", help="rank nodes by anomaly rate across jobs and users")
    p.add_argument("fleet", metavar="FLEET")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--min-users", type=int, default=2,
                   help="users hit before a node is a suspect (default 2)")
    p.add_argument("--min-bad", type=int, default=3,
                   help="anomalous runs before a node is a suspect (default 3)")
    p.add_argument("--json", action="store_true")
    _period(p)
    add_options(p)
    p = sub.add_parser("baseline", help="one baseline per workload class from healthy runs")
    p.add_argument("fleet", metavar="FLEET")
    p.add_argument("--by", choices=("workload", "partition", "node"), default="workload")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--min-runs", type=int, default=3)
    p.add_argument("--max-runs", type=int, default=200)
    add_options(p)
    p = sub.add_parser("report", help="summary of a period, with plots")
    p.add_argument("fleet", metavar="FLEET")
    p.add_argument("--format", choices=("text", "json", "html"), default="text")
    p.add_argument("--out", metavar="FILE")
    p.add_argument("--top", type=int, default=10)
    _period(p)
    add_options(p)
    args = ap.parse_args(argv)

    from .dask_runtime import FleetRuntimeError, client_from_args, security_from_args
    from .index import FleetError
    progress = False if args.no_progress else None
    try:
        security = security_from_args(args)   # refused before anything is read or started
        if args.cmd in ("nodes", "baseline", "report"):
            from .index import check_fleet
            check_fleet(args.fleet)   # before a cluster is started for nothing
        if args.cmd == "index":   # the cluster starts only if some run is new or changed
            from .index import build_index
            r = build_index(args.paths, args.out, lambda: client_from_args(args, security),
                            features=not args.no_features, progress=progress)
            print(f"fleet index {args.out}: {r['found']} run(s) found, {r['indexed']} "
                  f"indexed ({r['changed']} changed), {r['unchanged']} unchanged, "
                  f"{r['errors']} with errors; {r['runs']} in the index "
                  f"({r['seconds']:.1f} s)")
            return 0
        with client_from_args(args, security) as client:
            if args.cmd == "nodes":
                from .nodes import format_text, node_ranking
                res = node_ranking(args.fleet, client, args.since, args.until, progress,
                                   args.min_users, args.min_bad)
                if args.json:
                    json.dump(res, sys.stdout, indent=1)
                    print()
                else:
                    print(format_text(res, args.top), end="")
                return 0
            if args.cmd == "baseline":
                from .baseline import fit_fleet_baselines
                idx = fit_fleet_baselines(args.fleet, args.out, client, args.by,
                                          args.min_runs, args.max_runs, progress)
                for cls, b in idx["baselines"].items():
                    print(f"{args.out}/{b['file']}: {cls!r}, {b['runs']} run(s), "
                          f"{b['channels']} channels")
                for cls, why in idx["skipped"].items():
                    print(f"skipped {cls!r}: {why}")
                return 0
            from .report import fleet_summary, format_text, render_html
            s = fleet_summary(args.fleet, client, args.since, args.until, args.top, progress)
            text = (json.dumps(s, indent=1, default=str) + "\n" if args.format == "json"
                    else render_html(s) if args.format == "html" else format_text(s))
            if args.out:
                with open(args.out, "w") as f:
                    f.write(text)
                print(f"wrote {args.out}")
            else:
                sys.stdout.write(text)
            return 0
    except (FleetError, FleetRuntimeError, OSError) as e:
        print(f"reveal fleet {args.cmd}: {e}", file=sys.stderr)
        return 2
