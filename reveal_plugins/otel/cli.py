"""``reveal otel``: re-send finished runs as traces, show the effective export configuration.

    reveal otel export [DIR|JOBID...] [--failed] [--spool DIR] [--endpoint URL]
                       [--protocol grpc|http/protobuf] [--header K=V]... [--timeout S]
                       [--max-anomalies N] [--dry-run]
    reveal otel config

``export`` is for after a backend outage: it reads ``report.json`` and ``meta.json`` of each run
directory (or each node's directory of a Slurm job id under the spool) and sends the same trace
(same ids) the sink would have sent, waiting up to the request timeout (not the 1 s job-end
budget).  Exit status: 0 all sent, 1 a run unreadable or some export failed, 2 bad usage or
configuration.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..cli_options import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, add_format
from .config import (OtelConfigError, config_file_path, load_config, parse_headers,
                     redact_url)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reveal otel", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="(re-)send finished runs as OpenTelemetry traces")
    e.add_argument("targets", nargs="*", metavar="DIR|JOBID",
                   help="run directory (holding report.json) or Slurm job id")
    e.add_argument("--failed", action="store_true",
                   help="also every run under the spool whose last export failed (otel.json)")
    e.add_argument("--spool", metavar="DIR", help="spool for job ids and --failed "
                                                  "(default $REVEAL_SPOOL or /var/spool/reveal)")
    e.add_argument("--endpoint", metavar="URL", help="OTLP base URL (default: OTEL_EXPORTER_OTLP_ENDPOINT or "
                                      "[otel] endpoint of the config file)")
    e.add_argument("--protocol", choices=("http/protobuf", "grpc"),
                   help="OTLP transport (default: OTEL_EXPORTER_OTLP_PROTOCOL or [otel] "
                        "protocol, http/protobuf)")
    e.add_argument("--header", action="append", default=[], metavar="K=V",
                   help="extra request header (repeatable)")
    e.add_argument("--timeout", type=float, metavar="S", help="request timeout in seconds")
    e.add_argument("--max-anomalies", type=int, metavar="N",
                   help="anomaly spans per run, highest scores first (default: [otel] "
                        "max_anomalies, 200)")
    e.add_argument("--dry-run", action="store_true",
                   help="print the spans as JSON instead of sending them")
    c = sub.add_parser("config", help="print the effective export configuration")
    add_format(c, default="json")
    return p


def _failed_runs(spool: str | None) -> list[str]:
    """Run directories under ``<spool>/jobs/*/*`` whose ``otel.json`` says the export failed."""
    from ..spool import spool_root
    from .export import read_status
    root = os.path.join(spool or spool_root(), "jobs")
    out = []
    for job in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        jd = os.path.join(root, job)
        for host in sorted(os.listdir(jd)) if os.path.isdir(jd) else []:
            d = os.path.join(jd, host)
            st = read_status(d)
            if st is not None and not st.get("ok"):
                out.append(d)
    return out


def _run_dirs(target: str, spool: str | None = None) -> list[str]:
    if os.path.isdir(target):
        return [target]
    from ..spool import JOB_ID_RE, job_run_dirs
    if JOB_ID_RE.match(target):
        dirs = job_run_dirs(target, spool)
        if not dirs:
            raise FileNotFoundError(f"job {target}: no run directory under the spool "
                                    f"(REVEAL_SPOOL or /var/spool/reveal)")
        return dirs
    raise FileNotFoundError(f"{target}: no such run directory")


def _load_report(run_dir: str) -> dict[str, Any]:
    path = os.path.join(run_dir, "report.json")
    try:
        with open(path) as f:
            report = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found (analyse the run first: reveal analyze "
                                f"{run_dir})") from None
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(report, dict) or report.get("schema") != "reveal.report/1":
        got = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise ValueError(f"{path}: schema = {got!r}, expected 'reveal.report/1'")
    return report


def _span_json(s: Any) -> dict[str, Any]:
    return {"name": s.name, "trace_id": format(s.context.trace_id, "032x"),
            "span_id": format(s.context.span_id, "016x"),
            "parent_span_id": format(s.parent.span_id, "016x") if s.parent else None,
            "start": s.start_time / 1e9, "end": s.end_time / 1e9,
            "attributes": dict(s.attributes or {}),
            "events": [{"name": e.name, "t": e.timestamp / 1e9, "attributes": dict(e.attributes)}
                       for e in s.events],
            "resource": dict(s.resource.attributes)}


def export_main(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {"endpoint": args.endpoint, "protocol": args.protocol,
                                 "timeout_s": args.timeout, "max_anomalies": args.max_anomalies}
    try:
        if args.header:
            overrides["headers"] = {k: v for h in args.header
                                    for k, v in parse_headers("--header", "--header", h).items()}
        cfg = load_config(overrides=overrides)
    except OtelConfigError as e:
        print(f"reveal otel export: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not cfg.enabled and not args.dry_run:
        print("reveal otel export: no OTLP endpoint configured: pass --endpoint URL, set "
              "OTEL_EXPORTER_OTLP_ENDPOINT, or set [otel] endpoint in $REVEAL_CONFIG / "
              "/etc/reveal/reveal.toml (or OTEL_SDK_DISABLED / [otel] enabled=false is set)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        if not args.targets and not args.failed:
            print("reveal otel export: name run directories or job ids, or pass --failed",
                  file=sys.stderr)
            return EXIT_USAGE
        dirs = [d for t in args.targets for d in _run_dirs(t, args.spool)]
        if args.failed:
            dirs += [d for d in _failed_runs(args.spool) if d not in dirs]
            if not dirs:
                print("reveal otel export: no failed exports to re-send")
                return EXIT_OK
        reports = [(d, _load_report(d)) for d in dirs]
    except (OSError, ValueError) as e:
        print(f"reveal otel export: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    from .export import export_report, read_meta
    from .trace import build_spans
    failed = 0
    for d, report in reports:
        meta = read_meta(d)
        if args.dry_run:
            print(json.dumps([_span_json(s) for s in build_spans(report, meta, cfg)], indent=1))
            continue
        try:
            o = export_report(report, meta, cfg, budget_s=None, run_dir=d)
        except ValueError as e:
            print(f"reveal otel export: {d}/report.json: {e}", file=sys.stderr)
            failed += 1
            continue
        if o.ok:
            print(f"{d}: sent {o.spans} spans to {o.endpoint} as trace {o.trace_id} "
                  f"({o.seconds:.3f} s)")
        else:
            failed += 1
            print(f"reveal otel export: {d}: export to {o.endpoint} ({o.protocol}) failed: "
                  f"{o.error}", file=sys.stderr)
    return EXIT_PROBLEM if failed else EXIT_OK


def config_main(fmt: str = "json") -> int:
    try:
        cfg = load_config()
    except OtelConfigError as e:
        print(f"reveal otel config: {e}", file=sys.stderr)
        return EXIT_USAGE
    d = {k: v for k, v in vars(cfg).items()}
    d["headers"] = {k: "***" for k in cfg.headers}  # header values are often credentials
    for k in ("endpoint", "traces_endpoint", "metrics_endpoint"):
        d[k] = redact_url(d[k]) if d[k] else d[k]
    d["traces_url"] = redact_url(cfg.signal_endpoint("traces")) if cfg.enabled else None
    d["config_file"] = config_file_path()
    if fmt == "json":
        print(json.dumps(d, indent=1, sort_keys=True))
    else:
        for k in sorted(d):
            print(f"{k:<18} {d[k]}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "export":
        return export_main(args)
    return config_main(args.format)


if __name__ == "__main__":
    sys.exit(main())
