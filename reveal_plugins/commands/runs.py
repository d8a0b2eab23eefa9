"""``reveal runs``: the recent runs and Slurm jobs the caller may read, newest first.

It looks in ``./reveal-runs`` (where ``reveal record`` puts runs by default), in any ``--dir``
given, and in the spool's ``jobs/<job>/<node>/``.  Directories the caller cannot read are left
out without a word (another user's runs are 0700): the list is what *you* may open with
``reveal report``.  Symlinked entries are skipped, so a listing as root never follows a path a
user planted."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..cli_options import EXIT_OK, EXIT_PROBLEM, add_format, parse_when

DEFAULT_LOCAL = "reveal-runs"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal runs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", action="append", default=[], metavar="DIR",
                    help="also list the runs under DIR (repeatable; default ./reveal-runs)")
    ap.add_argument("--spool", metavar="DIR",
                    help="spool root for Slurm jobs (default $REVEAL_SPOOL or /var/spool/reveal)")
    ap.add_argument("--user", metavar="NAME", help="only this user's runs")
    ap.add_argument("--since", type=parse_when, metavar="WHEN",
                    help="only runs started at/after WHEN (unix seconds, YYYY-MM-DD[THH:MM] "
                         "UTC, or an age: 2h, 3d)")
    ap.add_argument("--limit", type=int, default=20, metavar="N",
                    help="at most N runs, newest first (default 20; 0: all)")
    add_format(ap)
    return ap


def _candidates(local_dirs: list[str], spool: str) -> list[str]:
    out: list[str] = []
    for root in local_dirs:
        out += _children(root, depth=1)
    out += _children(os.path.join(spool, "jobs"), depth=2)
    return out


def _children(root: str, depth: int) -> list[str]:
    """Directories ``depth`` levels under ``root`` that hold a meta.json; no symlinks."""
    level = [root]
    for _ in range(depth):
        nxt = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    nxt += [e.path for e in it if e.is_dir(follow_symlinks=False)]
            except OSError:     # missing, or not ours to read
                continue
        level = nxt
    return [d for d in level if os.path.isfile(os.path.join(d, "meta.json"))]


def _status(d: str) -> tuple[str, int | None]:
    """(status, anomalies) from report.json; "running" or "not analysed yet" without one."""
    from ..store.store import MAX_REPORT_BYTES, StoreError, is_running, parse_json, read_bounded
    path = os.path.join(d, "report.json")
    try:
        rep = parse_json(read_bounded(path, MAX_REPORT_BYTES, "report")[0], path)
    except FileNotFoundError:
        return ("running" if is_running(d) else "not analysed yet"), None
    except (OSError, StoreError, ValueError):
        return "report unreadable", None
    if not isinstance(rep, dict):
        return "report unreadable", None
    return str(rep.get("status", "?")), len(rep.get("anomalies") or [])


def list_runs(local_dirs: list[str], spool: str, user: str | None = None,
              since: float | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """One row per readable run directory, newest first."""
    from ..store.store import StoreError, read_meta
    rows = []
    for d in _candidates(local_dirs, spool):
        if not os.access(os.path.join(d, "meta.json"), os.R_OK):
            continue
        try:
            meta = read_meta(d)
        except (OSError, StoreError, ValueError):
            continue
        run = meta.get("run") or {}
        start = meta.get("start")
        if user and run.get("user") != user:
            continue
        if since is not None and not (isinstance(start, (int, float)) and start >= since):
            continue
        end = meta.get("end")
        status, n = _status(d)
        rows.append({"run_dir": os.path.abspath(d), "run_id": run.get("run_id"),
                     "job_id": run.get("job_id"), "user": run.get("user"),
                     "host": meta.get("host") or run.get("host"), "start": start,
                     "duration_s": (end - start) if isinstance(end, (int, float)) and
                     isinstance(start, (int, float)) else None,
                     "source": run.get("source"), "status": status, "anomalies": n,
                     "command": run.get("command")})
    rows.sort(key=lambda r: r["start"] or 0, reverse=True)
    return rows[:limit] if limit > 0 else rows


def format_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no runs you may read (looked in ./reveal-runs, --dir and the spool)\n"
    lines = [f"{'STARTED (UTC)':<17} {'DURATION':>8} {'JOB/RUN':<22} {'USER':<10} "
             f"{'NODE':<12} {'STATUS':<16} {'ANOM':>4}  DIRECTORY"]
    for r in rows:
        st = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["start"])) if r["start"] else "?"
        dur = f"{r['duration_s']:.0f} s" if r["duration_s"] is not None else "-"
        who = str(r["job_id"] or r["run_id"] or "?")[:22]
        n = "-" if r["anomalies"] is None else str(r["anomalies"])
        lines.append(f"{st:<17} {dur:>8} {who:<22} {str(r['user'] or '?')[:10]:<10} "
                     f"{str(r['host'] or '?')[:12]:<12} {r['status'][:16]:<16} {n:>4}  "
                     f"{r['run_dir']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.limit < 0:
        ap.error(f"--limit {args.limit}: must be >= 0")
    from ..spool import spool_root
    local = args.dir or [DEFAULT_LOCAL]
    for d in args.dir:
        try:
            os.listdir(d)
        except OSError as e:
            print(f"reveal runs: --dir {d}: {e.strerror}", file=sys.stderr)
            return EXIT_PROBLEM
    rows = list_runs(local, args.spool or spool_root(), args.user, args.since, args.limit)
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        sys.stdout.write(format_text(rows))
    return EXIT_OK
