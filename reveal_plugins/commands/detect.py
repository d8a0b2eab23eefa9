"""``reveal analyze DIR|JOBDIR [--baseline FILE] [--window S] [--stride S] [--json]`` and
``reveal baseline fit RUN_DIR... --out FILE``."""
from __future__ import annotations

import argparse
import json
import sys

from ..cli_options import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, add_format, add_out
from ..site_config import SiteConfigError


def _positive(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {s!r}")
    return v


def _check_writable_as_root(run_dir: str) -> None:
    """As root, refuse up front a run directory that root does not own (a user's directory
    may hold symlinks planted where report.json, otel.json... would be written): raises
    RunDirError naming the directory and its owner.  ``reveal report DIR`` still shows the
    analysis without writing anything there."""
    import errno
    import os

    from ..store.rundir import RunDirError, open_dir
    if os.geteuid() != 0:
        return
    try:
        os.close(open_dir(run_dir))
    except RunDirError as e:
        if e.errno not in (errno.EPERM, errno.ELOOP):
            return          # missing, not a directory: read_meta says so in its own words
        raise RunDirError(e.errno, f"{e.strerror}; or `reveal report {run_dir}` to see the "
                          "analysis without writing") from None


def build_analyze_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal analyze",
                                 description="Analyse a run directory, write report.json and "
                                             "print a one-screen summary.")
    ap.add_argument("run_dir", metavar="DIR", help="run directory, or a job directory holding "
                    "one run directory per node")
    ap.add_argument("--baseline", metavar="FILE",
                    help="baseline from `reveal baseline fit` (flags runs abnormal throughout)")
    ap.add_argument("--window", type=_positive, metavar="S", help="window length (default 3)")
    ap.add_argument("--stride", type=_positive, metavar="S", help="window stride (default 1)")
    add_format(ap)
    ap.add_argument("--no-publish", action="store_true", help="do not call the report sinks")
    ap.add_argument("--full", action="store_true",
                    help="recompute the window features from the raw segments (streaming, "
                    "bounded memory) instead of using the ones stored while the run went on")
    return ap


def analyze_main(argv: list[str]) -> int:
    args = build_analyze_parser().parse_args(argv)
    from ..store.rundir import RunDirError
    from ..store.store import StoreError
    from ..detect.batch.baseline import BaselineError

    cfg: dict = {}
    if args.window:
        cfg["window_s"] = args.window
    if args.stride:
        cfg["stride_s"] = args.stride
    if args.full:
        cfg["full"] = True
    nodes = job_node_dirs(args.run_dir)
    if nodes:
        return analyze_job_main(args.run_dir, nodes, cfg, args)
    try:
        _check_writable_as_root(args.run_dir)
        if args.baseline:   # fail early and clearly on a bad baseline file
            from ..detect.batch.baseline import load
            load(args.baseline)
        try:
            from ..analysis import analyze_and_publish
        except ImportError:
            analyze_and_publish = None
        if analyze_and_publish is not None:
            report = analyze_and_publish(args.run_dir, cfg, baseline=args.baseline,
                                         publish=not args.no_publish)
        else:  # pragma: no cover - the lead's module is part of the package
            from ..detect import analyze
            report = analyze(args.run_dir, cfg, args.baseline)
    except SiteConfigError as e:     # the site's reveal.toml: what the operator must fix
        print(f"reveal analyze: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (StoreError, BaselineError, ValueError, RunDirError) as e:
        print(f"reveal analyze: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    failed = report.get("status") in ("failed", "not_analysed")
    if args.format == "json":
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        try:
            from ..analysis import summary_text
            print(summary_text(report, args.run_dir))
        except ImportError:  # pragma: no cover
            print(report.get("summary", ""))
    if failed:
        what = "FAILED" if report.get("status") == "failed" else "NOT ANALYSED"
        print(f"reveal analyze: {args.run_dir}: {what}: "
              f"{report.get('status_reason')}", file=sys.stderr)
        return EXIT_PROBLEM
    return EXIT_OK


def job_node_dirs(path: str) -> list[str]:
    """The run directories of a job directory (``<spool>/jobs/<job>/<node>/`` or collected
    copies side by side); [] when ``path`` is a run directory itself or holds none."""
    import os

    from ..store import store
    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, store.META)):
        return []
    return sorted(os.path.join(path, d) for d in os.listdir(path)
                  if os.path.isfile(os.path.join(path, d, store.META))
                  and not os.path.islink(os.path.join(path, d)))


def analyze_job_main(job_dir: str, nodes: list[str], cfg: dict, args) -> int:
    """``reveal analyze JOBDIR``: every node's run directory as ``reveal analyze DIR`` would,
    then the peer comparison; ``JOBDIR/job-report.json`` holds the job report."""
    import os

    from ..analysis import analyze_and_publish
    from ..store.rundir import RunDirError, write_file
    from ..store.store import StoreError
    from ..detect.peers.job import job_report
    items, failed = [], []
    try:
        for d in nodes:
            _check_writable_as_root(d)
            rep = analyze_and_publish(d, cfg, baseline=args.baseline, publish=False)
            if rep.get("status") == "failed":
                failed.append(d)
            items.append((rep, d))
        doc = job_report(items, os.path.basename(os.path.normpath(job_dir)))
    except (StoreError, ValueError, RunDirError) as e:
        print(f"reveal analyze: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    from ..analysis import publish
    for rep, d in items:    # each node's report now carries the job's verdict (job_peers)
        publish(rep, d, cfg, sinks=not args.no_publish)
    try:
        _check_writable_as_root(job_dir)
        write_file(job_dir, "job-report.json", (json.dumps(doc, indent=1) + "\n").encode())
    except (OSError, RunDirError) as e:
        print(f"reveal analyze: job-report.json not written: {e}", file=sys.stderr)
    if args.format == "json":
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        try:
            from ..report.text import render_job_text
            print(render_job_text(items, doc["job_id"], peers=doc.get("peers")), end="")
        except ImportError:   # pragma: no cover - the renderer is part of the package
            for rep, d in items:
                print(f"{d}: {rep.get('summary', '')}")
            print(doc.get("summary") or "")
    for d in failed:
        print(f"reveal analyze: analysis of {d} FAILED", file=sys.stderr)
    return EXIT_PROBLEM if failed else EXIT_OK


def build_baseline_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal baseline",
                                 description="Learn what healthy runs of a workload look like.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    fit = sub.add_parser("fit", help="fit a baseline from healthy run directories")
    fit.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                     help="run directories of healthy runs of one workload")
    add_out(fit, "FILE", "where to write the baseline (JSON)", required=True)
    fit.add_argument("--window", type=_positive, metavar="S",
                     help="window length in seconds (default 3; analyses using the baseline "
                          "must use the same)")
    fit.add_argument("--stride", type=_positive, metavar="S",
                     help="window stride in seconds (default 1)")
    fit.add_argument("--name", help="workload class name stored in the baseline")
    show = sub.add_parser("show", help="print a baseline's summary")
    show.add_argument("file", metavar="FILE", help="a baseline from `reveal baseline fit`")
    add_format(show)
    return ap


def baseline_main(argv: list[str]) -> int:
    args = build_baseline_parser().parse_args(argv)
    from ..store.store import StoreError
    from ..detect.batch.baseline import BaselineError, fit_baseline, load, save

    try:
        if args.cmd == "show":
            b = load(args.file)
            if args.format == "json":
                doc = {k: b.get(k) for k in ("name", "window_s", "stride_s", "windows",
                                             "runs")}
                doc["channels"] = [c.get("name") for c in b["channels"]]
                print(json.dumps(doc, indent=1))
                return EXIT_OK
            print(f"{args.file}: {len(b['runs'])} run(s), {len(b['channels'])} channels, "
                  f"window {b['window_s']:g} s / stride {b['stride_s']:g} s, "
                  f"{b.get('windows', 0)} windows" + (f", workload {b['name']!r}"
                                                        if b.get("name") else ""))
            return EXIT_OK
        cfg = {}
        if args.window:
            cfg["window_s"] = args.window
        if args.stride:
            cfg["stride_s"] = args.stride
        b = fit_baseline(args.run_dirs, cfg, name=args.name)
        save(b, args.out)
    except (StoreError, BaselineError, ValueError, OSError) as e:
        print(f"reveal baseline: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    print(f"baseline written to {args.out}: {len(b['runs'])} run(s), {len(b['channels'])} "
          f"channels, {b['windows']} windows")
    return EXIT_OK
