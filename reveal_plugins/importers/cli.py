"""``reveal import reveal-tsv FILE... --out DIR [--analyze]``."""
from __future__ import annotations

import argparse
import sys

from ..cli_options import EXIT_OK, EXIT_PROBLEM, add_out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal import",
                                 description="Turn other tools' telemetry into run directories.")
    sub = ap.add_subparsers(dest="fmt", required=True)
    p = sub.add_parser("reveal-tsv", help="the Reveal paper's released telemetry (TSV)")
    p.add_argument("files", nargs="+", metavar="FILE", help="TSV files, one node's run each")
    add_out(p, "DIR", "directory to write the run directories into", required=True)
    p.add_argument("--job", help="job id stored in the runs (default: the file name)")
    p.add_argument("--user", help="user stored in the runs")
    p.add_argument("--workload", help="workload class (default: the file name)")
    p.add_argument("--analyze", action="store_true", help="analyse each run after import")
    return ap


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from .reveal_tsv import TSVFormatError, import_file

    rc = EXIT_OK
    for path in args.files:
        try:
            runs = import_file(path, args.out, args.job, args.user, args.workload)
        except (TSVFormatError, OSError) as e:
            print(f"reveal import: {e}", file=sys.stderr)
            rc = EXIT_PROBLEM
            continue
        for d in runs:
            print(f"{path} -> {d}")
            if args.analyze:
                from ..analysis import analyze_and_publish, summary_text
                rep = analyze_and_publish(d, {}, publish=False)
                print(summary_text(rep, d))
                if rep.get("status") in ("failed", "not_analysed"):
                    rc = EXIT_PROBLEM
    return rc
