"""``reveal record [--out DIR] [--interval S] [--live] -- CMD...``: run CMD under telemetry."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from .cli_options import EXIT_PROBLEM, EXIT_USAGE, add_out
from .recording import Recording, validate_interval

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGINT)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="reveal record",
        description="Run CMD under hardware telemetry, analyse the run and print the summary. "
                    "Exits with CMD's exit code.")
    add_out(ap, "DIR", "run directory (default ./reveal-runs/<time>-<host>-<pid>)")
    ap.add_argument("--interval", metavar="S", default="0.1",
                    help="sampling interval in seconds (0.01-60, default 0.1)")
    ap.add_argument("--live", action="store_true", help="also detect while the run goes on")
    ap.add_argument("--no-analyze", action="store_true", help="only record")
    ap.add_argument("--force", action="store_true",
                    help="--out DIR already holds a run: remove that run's files first "
                         "(meta.json, events.jsonl, report.json, segments/, features/; "
                         "nothing else in DIR)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...",
                    help="the command to run and record, after --")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given (usage: reveal record [options] -- CMD...)")
    if cmd[0].startswith("-") and args.cmd[:1] != ["--"]:
        ap.error(f"unknown option {cmd[0]!r}")
    try:
        interval = validate_interval(args.interval)
    except ValueError as e:
        ap.error(f"--interval: {e}")
    if args.out:
        try:
            old = existing_run(args.out)
            if old and not args.force:
                print(f"reveal record: --out {args.out} already holds a run ({old}); two runs "
                      "in one directory mix their telemetry and reports. Choose another "
                      "directory, or pass --force to remove that run first.", file=sys.stderr)
                return EXIT_USAGE
            if old:
                remove_run(args.out)
                print(f"reveal record: removed the earlier run in {args.out} (--force)",
                      file=sys.stderr)
        except OSError as e:
            print(f"reveal record: --out {args.out}: {e.strerror or e}", file=sys.stderr)
            return EXIT_PROBLEM
    with Recording(out=args.out, interval_s=interval, source="local", command=cmd,
                   live=args.live, analyze=not args.no_analyze) as rec:
        rc = run_forwarding_signals(cmd)
        rec.exit_code = rc
    return rc


#: What a run directory holds (docs: README "Run directory"); --force removes these only.
RUN_FILES = ("meta.json", "events.jsonl", "report.json", ".running")
RUN_DIRS = ("segments", "features")


def existing_run(path: str) -> str | None:
    """A description of the run already in ``path`` (its command and start), else None."""
    import json
    import time
    meta = os.path.join(path, "meta.json")
    if not os.path.lexists(meta):
        if any(os.path.lexists(os.path.join(path, n)) for n in RUN_DIRS + ("events.jsonl",)):
            return "segments or events of an earlier run"
        return None
    try:
        with open(meta) as f:
            m = json.load(f)
        run = m.get("run") or {}
        cmd = run.get("command") or (run.get("extra") or {}).get("command")
        start = m.get("start") or run.get("start")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(start)) if isinstance(
            start, (int, float)) else "unknown start"
        what = " ".join(cmd) if isinstance(cmd, list) else (cmd or "unknown command")
        return f"{what!r}, started {when}"
    except (OSError, ValueError, TypeError):
        return "an unreadable meta.json"


def remove_run(path: str) -> None:
    """Remove the run files of ``path`` (never following a symlink out of it)."""
    import shutil
    for n in RUN_FILES:
        p = os.path.join(path, n)
        if os.path.lexists(p):
            os.unlink(p)
    for n in RUN_DIRS:
        p = os.path.join(path, n)
        if os.path.islink(p):
            os.unlink(p)
        elif os.path.isdir(p):
            shutil.rmtree(p)


def run_forwarding_signals(cmd: list[str]) -> int:
    """Run ``cmd``, forwarding signals sent to us; return its exit code (128+N if killed by N).

    Ctrl-C on a terminal already reaches the child (same foreground process group), so SIGINT
    is forwarded only when we are not the terminal's foreground group.
    """
    try:
        proc = subprocess.Popen(cmd)
    except OSError as e:
        print(f"reveal record: cannot run {cmd[0]!r}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126

    def tty_foreground() -> bool:
        try:
            return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            return False

    def forward(signum, frame):
        if signum == signal.SIGINT and tty_foreground():
            return
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handler replaces default
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc
