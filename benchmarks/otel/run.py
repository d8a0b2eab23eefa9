"""OpenTelemetry export benchmark: ``python benchmarks/otel/run.py [--reps N]``.

1. Job-end delay: the wall time of the sink hook (what a Slurm epilog / ``reveal record`` waits)
   with export off (the reference), a healthy backend, and a backend that is down (connection
   refused), hung (accepts, never answers), slow (answers after 3 s) or refusing (HTTP 503 /
   gRPC UNAVAILABLE) — over OTLP/HTTP and gRPC; budget 1 s.
2. The whole ``reveal record -- true`` with export off vs the backend down / hung.
3. Export time for reports with many anomalies: span building and sending to a loopback
   receiver, spans per second, and the ratio against building alone.

Receivers are the test suite's real ones (``tests/fixtures_otlp.py``).  Results:
``benchmarks/otel/results/otel-<split>-<date>.json`` (``--results``; the :mod:`results` header;
``--split dev`` by default, ``test`` is refused from a dirty tree).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
sys.path.insert(0, os.path.dirname(HERE))

import grpc  # noqa: E402

import results as bench_results  # noqa: E402
from fixtures_otlp import (OtlpGrpcReceiver, OtlpHttpReceiver, make_otel_meta,  # noqa: E402
                           make_otel_report)
from reveal_plugins.otel import sink  # noqa: E402
from reveal_plugins.otel.config import load_config  # noqa: E402
from reveal_plugins.otel.export import reset_warnings, send_spans  # noqa: E402
from reveal_plugins.otel.trace import build_spans  # noqa: E402

OTEL_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def hook_times(run_dir: str, report: dict, endpoint: str | None, protocol: str, reps: int):
    for v in OTEL_VARS:
        os.environ.pop(v, None)
    if endpoint:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = protocol
    out = []
    for _ in range(reps):
        reset_warnings()
        t = time.monotonic()
        sink.reveal_report_ready(report, run_dir, {})
        out.append(time.monotonic() - t)
    return out


def bench_delay(reps: int) -> list[dict]:
    import logging
    logging.getLogger("reveal_plugins").setLevel(logging.ERROR)  # the one warning per case
    d = tempfile.mkdtemp(prefix="reveal-otel-bench-")
    report, meta = make_otel_report(), make_otel_meta()
    big = make_otel_report(5000)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    cfgfile = os.path.join(d, "empty.toml")
    open(cfgfile, "w").close()
    os.environ["REVEAL_CONFIG"] = cfgfile
    ref = hook_times(d, report, None, "http/protobuf", reps)
    ref_med = statistics.median(ref)
    print("\n== job-end delay: sink hook wall time (budget 1.0 s), "
          f"{reps} reps, report with 3 anomalies ==")
    print(f"{'case':44s} {'median s':>9s} {'max s':>8s} {'max/budget':>10s}")
    print(f"{'export off (reference)':44s} {ref_med:9.4f} {max(ref):8.4f} {max(ref) / 1.0:10.2f}")
    rows = [{"protocol": None, "case": "export off (reference)", "median_s": ref_med,
             "max_s": max(ref)}]
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    hung = f"http://127.0.0.1:{hole.getsockname()[1]}"
    for protocol in ("http/protobuf", "grpc"):
        g = protocol == "grpc"
        up = OtlpGrpcReceiver() if g else OtlpHttpReceiver()
        slow = OtlpGrpcReceiver(delay_s=3.0) if g else OtlpHttpReceiver(delay_s=3.0)
        refusing = (OtlpGrpcReceiver(refuse=grpc.StatusCode.UNAVAILABLE) if g
                    else OtlpHttpReceiver(status=503))
        cases = [("healthy", up.endpoint), ("down (connection refused)",
                                             f"http://127.0.0.1:{_free_port()}"),
                 ("hung (never answers)", hung), ("slow (answers after 3 s)", slow.endpoint),
                 ("refusing (503 / UNAVAILABLE)", refusing.endpoint)]
        cases.append(("healthy, 5000 anomalies (200 sent)", up.endpoint))
        for name, ep in cases:
            ts = hook_times(d, big if name.startswith("healthy, 5000") else report, ep,
                            protocol, reps)
            label = f"{protocol:13s} {name}"
            print(f"{label:44s} {statistics.median(ts):9.4f} {max(ts):8.4f} {max(ts):10.2f}")
            rows.append({"protocol": protocol, "case": name, "median_s": statistics.median(ts),
                         "max_s": max(ts)})
        for r in (up, slow, refusing):
            r.close()
    hole.close()
    for v in OTEL_VARS:
        os.environ.pop(v, None)
    return rows


def bench_record(reps: int) -> list[dict]:
    """Whole ``reveal record -- true`` wall time: export off vs backend down / hung."""
    import subprocess
    d = tempfile.mkdtemp(prefix="reveal-otel-bench-rec-")
    cfgfile = os.path.join(d, "empty.toml")
    open(cfgfile, "w").close()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "REVEAL_OTEL"))}
    base["REVEAL_CONFIG"] = cfgfile
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    cases = [("export off (reference)", {}),
             ("http down (connection refused)",
              {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{_free_port()}"}),
             ("grpc hung (never answers)",
              {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{hole.getsockname()[1]}",
               "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})]
    print(f"\n== job-end delay of `reveal record -- true` (whole command), {reps} reps ==")
    print(f"{'case':44s} {'median s':>9s} {'max s':>8s} {'median - ref':>12s}")
    ref = None
    rows = []
    for name, extra in cases:
        ts = []
        for i in range(reps):
            t = time.monotonic()
            subprocess.run(["reveal", "record", "--out", os.path.join(d, f"{len(ts)}-{name[:4]}-{i}"),
                            "--", "true"], env={**base, **extra}, capture_output=True,
                           timeout=120)
            ts.append(time.monotonic() - t)
        med = statistics.median(ts)
        ref = med if ref is None else ref
        print(f"{name:44s} {med:9.3f} {max(ts):8.3f} {med - ref:12.3f}")
        rows.append({"case": name, "median_s": med, "max_s": max(ts), "median_minus_ref_s":
                     med - ref})
    hole.close()
    return rows


def bench_size(sizes: list[int]) -> list[dict]:
    print("\n== export time for reports with many anomalies (loopback receiver) ==")
    print(f"{'protocol':13s} {'anomalies':>9s} {'spans':>6s} {'build s':>8s} {'send s':>8s} "
          f"{'spans/s':>9s} {'send/build':>10s}")
    meta = make_otel_meta()
    rows = []
    for protocol in ("http/protobuf", "grpc"):
        recv = OtlpGrpcReceiver() if protocol == "grpc" else OtlpHttpReceiver()
        cfg = load_config(overrides={"endpoint": recv.endpoint, "protocol": protocol,
                                     "max_anomalies": max(sizes)}, environ={})
        send_spans(build_spans(make_otel_report(3), meta, cfg), cfg)  # warm up imports
        for n in sizes:
            report = make_otel_report(n)
            t = time.perf_counter()
            spans = build_spans(report, meta, cfg)
            build = time.perf_counter() - t
            t = time.perf_counter()
            o = send_spans(spans, cfg)
            send = time.perf_counter() - t
            assert o.ok, o.error
            print(f"{protocol:13s} {n:9d} {len(spans):6d} {build:8.4f} {send:8.4f} "
                  f"{len(spans) / (build + send):9.0f} {send / build:10.2f}")
            rows.append({"protocol": protocol, "anomalies": n, "spans": len(spans),
                         "build_s": build, "send_s": send})
        recv.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="10,100,1000,5000")
    ap.add_argument("--record-reps", type=int, default=3,
                    help="reps of the whole `reveal record -- true` comparison (0: skip)")
    bench_results.add_args(ap)
    args = ap.parse_args()
    bench = bench_results.begin("otel", args.split, extra_paths=("tests/fixtures_otlp.py",))
    doc = {"reps": args.reps, "hook_delay": bench_delay(args.reps)}
    if args.record_reps:
        doc["record_reps"] = args.record_reps
        doc["record"] = bench_record(args.record_reps)
    doc["export_size"] = bench_size([int(x) for x in args.sizes.split(",")])
    print("\nresults: " + bench.write(args.results or bench.default_path(), doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
