"""``reveal probes [--json]``: which probes work on this node, and why the others do not."""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..hooks import hook
from ..types import RunInfo
from ..cli_options import add_format


def _describe(batches: list, scope: str) -> list[dict]:
    rows = []
    for batch in batches:
        for p in batch:
            try:
                p.open()
            except Exception as e:
                p.available, p.reason = False, f"open() failed: {type(e).__name__}: {e}"
            rows.append(dict(p.describe(), scope=scope,
                             subsystems=sorted({c.subsystem for c in p.channels})))
            p.close()
    return rows


def probe_inventory(include_run: bool = True) -> list[dict]:
    rows = _describe(hook().reveal_register_probes(config={}), "host")
    if include_run:
        me = RunInfo(run_id="probe-check", run_dir="", pids=[os.getpid()], uid=os.getuid())
        rows += _describe(hook().reveal_register_run_probes(run=me, config={}), "run")
    return rows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal probes",
                                 description="List probes, availability and channel counts.")
    add_format(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rows = probe_inventory()
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    width = max(len(r["name"]) for r in rows) if rows else 10
    total = 0
    for r in rows:
        state = "ok" if r["available"] else "--"
        total += r["channels"]
        detail = f"{r['channels']:4d} channels" if r["available"] else f"unavailable: {r['reason']}"
        if r.get("note"):
            detail += f"  ({r['note']})"
        print(f"{state}  {r['name']:<{width}}  {r['scope']:<4}  {detail}")
    avail = sum(r["available"] for r in rows)
    print(f"\n{avail}/{len(rows)} probes available, {total} channels")
    return 0
