"""``reveal fleet {index,nodes,baseline,report}``: questions about many runs (docs/fleet.md)."""
from __future__ import annotations

import argparse
import json
import sys

from ..cli_options import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, add_format, add_out, parse_when


def _period(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--since", type=parse_when, metavar="WHEN", help="runs started at/after (UTC)")
    ap.add_argument("--until", type=parse_when, metavar="WHEN", help="runs started before (UTC)")


def build_parser() -> argparse.ArgumentParser:
    from .dask_runtime import add_options
    ap = argparse.ArgumentParser(prog="reveal fleet",
                                 description="Fleet analysis over many runs (on Dask).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("index", help="collect runs into a Parquet fleet index (incremental)")
    p.add_argument("paths", nargs="+", metavar="SPOOL_OR_RUN_DIR",
                   help="spool roots (their jobs/*/* runs) or run directories")
    add_out(p, "FLEET", "the fleet index directory (created, or updated in place)",
            required=True)
    p.add_argument("--no-features", action="store_true",
                   help="identity and findings only (no window features: faster)")
    add_options(p)
    p = sub.add_parser("nodes", help="rank nodes by anomaly rate across jobs and users")
    p.add_argument("fleet", metavar="FLEET", help="a fleet index from `reveal fleet index`")
    p.add_argument("--top", type=int, default=20, metavar="N",
                   help="nodes shown in the text ranking (default 20)")
    p.add_argument("--min-users", type=int, default=2,
                   help="users hit before a node is a suspect (default 2)")
    p.add_argument("--min-bad", type=int, default=3,
                   help="anomalous runs before a node is a suspect (default 3)")
    add_format(p)
    _period(p)
    add_options(p)
    p = sub.add_parser("baseline", help="one baseline per workload class from healthy runs")
    p.add_argument("fleet", metavar="FLEET", help="a fleet index from `reveal fleet index`")
    p.add_argument("--by", choices=("workload", "partition", "node"), default="workload",
                   help="what one baseline covers (default workload)")
    add_out(p, "DIR", "directory for the baselines and their index.json", required=True)
    p.add_argument("--min-runs", type=int, default=3, metavar="N",
                   help="healthy runs a class needs for a baseline (default 3)")
    p.add_argument("--max-runs", type=int, default=200, metavar="N",
                   help="most recent healthy runs used per class (default 200)")
    add_options(p)
    p = sub.add_parser("report", help="summary of a period, with plots")
    p.add_argument("fleet", metavar="FLEET", help="a fleet index from `reveal fleet index`")
    add_format(p, choices=("text", "json", "html"))
    add_out(p, "FILE", "write here instead of stdout")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="nodes and channels listed (default 10)")
    _period(p)
    add_options(p)
    return ap


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

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
            return EXIT_OK
        with client_from_args(args, security) as client:
            if args.cmd == "nodes":
                from .nodes import format_text, node_ranking
                res = node_ranking(args.fleet, client, args.since, args.until, progress,
                                   args.min_users, args.min_bad)
                if args.format == "json":
                    json.dump(res, sys.stdout, indent=1)
                    print()
                else:
                    print(format_text(res, args.top), end="")
                return EXIT_OK
            if args.cmd == "baseline":
                from .baseline import fit_fleet_baselines
                idx = fit_fleet_baselines(args.fleet, args.out, client, args.by,
                                          args.min_runs, args.max_runs, progress)
                for cls, b in idx["baselines"].items():
                    print(f"{args.out}/{b['file']}: {cls!r}, {b['runs']} run(s), "
                          f"{b['channels']} channels")
                for cls, why in idx["skipped"].items():
                    print(f"skipped {cls!r}: {why}")
                return EXIT_OK
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
            return EXIT_OK
    except FleetRuntimeError as e:      # how the pass is to run: the options or reveal.toml
        print(f"reveal fleet {args.cmd}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (FleetError, OSError) as e:  # what it reads
        print(f"reveal fleet {args.cmd}: {e}", file=sys.stderr)
        return EXIT_PROBLEM
