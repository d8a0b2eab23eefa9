"""``reveal report DIR|JOBID [--format text|json|html] [--out FILE]``.

DIR is a run directory (or a job directory holding one run directory per node, or a
report.json); JOBID is looked up in the spool (``$REVEAL_SPOOL`` or ``--spool``).  A run that
has no report.json yet is analysed first.  Several nodes give one section per node (text,
HTML) or ``{"schema": "reveal.job-report/1", "job_id", "reports": [...], "peers": {...}}``
(JSON; ``peers`` is the peer comparison of :mod:`reveal_plugins.detect.peers.job`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..store.rundir import write_file
from ..store.store import StoreError
from ..analysis import report_for
from ..report import load
from ..cli_options import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, add_format, add_out
from ..report.progress import Progress


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reveal report", description=(
        "Show a run's report: a one-screen text summary (default), the report.json, or a "
        "self-contained HTML page with timelines."))
    p.add_argument("target", metavar="DIR|JOBID",
                   help="run directory, job directory, report.json, or Slurm job id")
    add_format(p, choices=("text", "json", "html"))
    add_out(p, "FILE", "write here instead of stdout (html default: DIR/report.html)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the text summary (auto: only on a terminal, not with NO_COLOR)")
    p.add_argument("--spool", metavar="DIR", help="spool root for JOBID (default $REVEAL_SPOOL "
                   "or /var/spool/reveal)")
    p.add_argument("--reanalyze", action="store_true",
                   help="analyse again even if report.json exists")
    return p


def _write(text: str, out: str | None) -> None:
    if out in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    d = os.path.dirname(os.path.abspath(out))
    os.makedirs(d, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)


def _write_into_run_dir(text: str, reports: list) -> str:
    """The HTML page's default place: ``DIR/report.html`` of a single run, written like every
    run-directory file (never through a symlink; as root only where root owns the directory),
    else ``./report.html``.  Returns the path written."""
    base = reports[0][1] if len(reports) == 1 and reports[0][1] else None
    if base:
        try:
            return write_file(base, "report.html", text.encode("utf-8"), 0o644)
        except OSError as e:
            print(f"reveal report: not writing into the run directory: {e}; writing "
                  "./report.html instead", file=sys.stderr)
    _write(text, "report.html")
    return "report.html"


def collect(target: str, spool: str | None = None, reanalyze: bool = False,
            progress: Progress | None = None) -> tuple[list[tuple[dict, str | None]], str | None]:
    """[(report, run_dir or None)] for every node of the target, and the job id if any."""
    progress = progress or Progress(False)
    dirs, job_id = load.resolve_target(target, spool)
    out = []
    for i, d in enumerate(dirs, 1):
        if os.path.isfile(d):
            rep = load.read_report(d)
            rd = os.path.dirname(os.path.abspath(d))
            out.append((rep, rd if os.path.isfile(os.path.join(rd, "meta.json")) else None))
            continue
        has = os.path.isfile(os.path.join(d, "report.json"))
        if reanalyze or not has:
            progress.update(f"analysing {d}", i, len(dirs))
        rep = report_for(d, reanalyze=reanalyze)
        out.append((rep, d if os.path.isfile(os.path.join(d, "meta.json")) else None))
    progress.done()
    return out, job_id


def job_doc(reports: list, job_id: str | None, progress: Progress | None = None) -> dict:
    """``reveal.job-report/1``: the nodes' reports and, with 2+ run directories, the peer
    comparison (:mod:`reveal_plugins.detect.peers.job`)."""
    try:
        from ..detect.peers.job import job_report
    except ImportError:   # detection not installed: the nodes' reports only
        return {"schema": "reveal.job-report/1", "job_id": job_id,
                "reports": [r for r, _ in reports]}
    if progress is not None and sum(1 for _, d in reports if d) >= 2:
        progress.update("comparing the nodes with their peers")
    doc = job_report(reports, job_id)
    if progress is not None:
        progress.done()
    return doc


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    progress = Progress()
    try:
        reports, job_id = collect(args.target, args.spool, args.reanalyze, progress)
        if args.format == "json":
            if len(reports) == 1:
                doc = reports[0][0]
            else:
                doc = job_doc(reports, job_id, progress)
            _write(json.dumps(doc, indent=1) + "\n", args.out)
        elif args.format == "html":
            from ..report.html import render_job_html
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                print("reveal report: --format html needs matplotlib: pip install "
                      "'reveal-plugins[html]' (or: pip install matplotlib)", file=sys.stderr)
                return EXIT_USAGE
            peers = job_doc(reports, job_id, progress).get("peers") if len(reports) > 1 \
                else None
            html = render_job_html(reports, job_id, progress=progress, peers=peers)
            out = args.out
            if out is None:
                out = _write_into_run_dir(html, reports)
            else:
                _write(html, out)
            if out != "-":
                print(f"wrote {out} ({os.path.getsize(out) / 1024:.0f} KiB); open it in a "
                      "browser (works offline)", file=sys.stderr)
        else:
            from ..report.text import render_job_text
            color = {"always": True, "never": False}.get(args.color)
            if color is None and args.out not in (None, "-"):
                color = False
            if any(d for _, d in reports):
                progress.update("reading telemetry")
            peers = job_doc(reports, job_id).get("peers") if len(reports) > 1 else None
            text = render_job_text(reports, job_id, color=color, peers=peers)
            progress.done()
            _write(text, args.out)
    except (load.ReportError, StoreError, OSError, ValueError) as e:
        progress.done()
        print(f"reveal report: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    except KeyboardInterrupt:
        progress.done()
        return 130
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
