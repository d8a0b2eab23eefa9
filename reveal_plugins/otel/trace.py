"""Report -> OpenTelemetry spans: one trace per run (job -> steps -> anomalies, hints as events;
a multi-node job's peer finding as attributes and a ``peer_suspect`` event on the job span).

Plain data in (a ``reveal.report/1`` dict and, optionally, the run's ``meta.json`` dict), finished
SDK spans out; nothing here talks to the network (see :mod:`.export`).  Spans carry the run's
real start/end times, never the export time.

Ids are derived from the run's identity, so re-sending a run (``reveal otel export``) yields the
same trace and span ids, and the nodes of one Slurm job share one trace id (one root span per
node).
"""
from __future__ import annotations

import hashlib
import shlex
from typing import Any, Iterable

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import __version__
from .config import OtelConfig

SCOPE = "reveal_plugins.otel"
SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}
ROOT_NAMES = {"slurm": "slurm job", "torchrun": "torchrun launch", "local": "reveal record"}


def _ns(t: float) -> int:
    return int(round(float(t) * 1e9))


class RunIdGenerator(IdGenerator):
    """Trace and span ids derived from a run key: stable across re-exports of the same run."""

    def __init__(self, trace_key: str, span_key: str):
        self._trace_key = trace_key
        self._span_key = span_key
        self._n = 0
        self.next_key: str | None = None   # set before each start_span: ids by span identity

    @staticmethod
    def _digest(text: str, size: int) -> int:
        v = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=size).digest(), "big")
        return v or 1  # zero ids are invalid

    def generate_trace_id(self) -> int:
        return self._digest("trace|" + self._trace_key, 16)

    def generate_span_id(self) -> int:
        key, self.next_key = self.next_key, None
        if key is None:
            self._n += 1
            key = f"#{self._n}"
        return self._digest(f"span|{self._trace_key}|{self._span_key}|{key}", 8)


def _meta_run(meta: dict[str, Any] | None) -> dict[str, Any]:
    run = (meta or {}).get("run") or {}
    return run if isinstance(run, dict) else {}


def host_name(report: dict[str, Any], meta: dict[str, Any] | None) -> str:
    """The node this report was produced on."""
    host = (meta or {}).get("host")
    if isinstance(host, dict):
        for k in ("hostname", "name", "host"):
            if host.get(k):
                return str(host[k])
    elif isinstance(host, str) and host:
        return host
    mr = _meta_run(meta)
    if mr.get("host"):
        return str(mr["host"])
    nodes = report.get("run", {}).get("nodes") or ["unknown"]
    return str(nodes[0])


def cluster_name(report: dict[str, Any], meta: dict[str, Any] | None) -> str | None:
    run = report.get("run", {})
    extra = _meta_run(meta).get("extra") or {}
    for d, k in ((run, "cluster"), (extra, "cluster"), (extra, "slurm_cluster"),
                 (extra, "SLURM_CLUSTER_NAME")):
        if isinstance(d, dict) and d.get(k):
            return str(d[k])
    return None


def trace_keys(report: dict[str, Any], meta: dict[str, Any] | None) -> tuple[str, str]:
    """(trace key, span key): a job id makes the nodes of a job share a trace."""
    run = report.get("run", {})
    source = run.get("source", "local")
    host = host_name(report, meta)
    job_id = run.get("job_id") or _meta_run(meta).get("job_id")
    if job_id:
        return f"{source}|{cluster_name(report, meta) or ''}|{job_id}", host
    run_id = run.get("run_id") or _meta_run(meta).get("run_id") or ""
    return f"{source}|{run_id}|{host}|{float(run.get('start', 0)):.6f}", host


def _put(attrs: dict[str, Any], key: str, value: Any) -> None:
    """Set an attribute when the value is a valid OTel attribute value (skip None/empty)."""
    if value is None:
        return
    if isinstance(value, (list, tuple)):
        vals = [v for v in value if v is not None]
        if not vals:
            return
        if all(isinstance(v, bool) for v in vals) or all(isinstance(v, str) for v in vals):
            attrs[key] = list(vals)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            attrs[key] = [float(v) for v in vals] if any(isinstance(v, float) for v in vals) \
                else list(vals)
        else:
            attrs[key] = [str(v) for v in vals]
        return
    if isinstance(value, (str, bool, int, float)):
        attrs[key] = value
    else:
        attrs[key] = str(value)


def build_resource(report: dict[str, Any], meta: dict[str, Any] | None,
                   cfg: OtelConfig | None = None) -> Resource:
    """service.name, host.name and the scheduler's identity (plus configured attributes)."""
    cfg = cfg or OtelConfig()
    run = report.get("run", {})
    source = run.get("source", "local")
    attrs: dict[str, Any] = dict(cfg.resource_attributes)
    attrs.update({
        "service.name": cfg.service_name,
        "service.version": __version__,
        "host.name": host_name(report, meta),
        "reveal.source": source,
        "reveal.scheduler": {"slurm": "slurm", "torchrun": "torchrun"}.get(source, "none"),
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.language": "python",
    })
    _put(attrs, "reveal.job.id", run.get("job_id"))
    if source == "slurm":
        _put(attrs, "slurm.cluster.name", cluster_name(report, meta))
        _put(attrs, "slurm.job.id", run.get("job_id"))
    return Resource(attrs)


def _step_exit_codes(report: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    out = {}
    for s in (meta or {}).get("steps") or []:
        if isinstance(s, dict) and "step_id" in s:
            out[str(s["step_id"])] = s.get("exit_code")
    for s in report.get("run", {}).get("steps") or []:
        if "exit_code" in s:
            out[str(s["step_id"])] = s["exit_code"]
    return out


def _exit_status(code: Any) -> Status:
    if isinstance(code, int) and code != 0:
        return Status(StatusCode.ERROR, f"exit code {code}")
    return Status(StatusCode.UNSET)


def root_attributes(report: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    run = report.get("run", {})
    tel = report.get("telemetry", {})
    anomalies = report.get("anomalies") or []
    a: dict[str, Any] = {}
    source = run.get("source", "local")
    _put(a, "reveal.source", source)
    _put(a, "reveal.run.id", run.get("run_id") or _meta_run(meta).get("run_id"))
    _put(a, "reveal.job.id", run.get("job_id"))
    if source == "slurm":
        _put(a, "slurm.job.id", run.get("job_id"))
    _put(a, "reveal.step.id", run.get("step_id"))
    _put(a, "user.name", run.get("user"))
    nodes = run.get("nodes") or []
    _put(a, "reveal.nodes", [str(n) for n in nodes])
    _put(a, "reveal.node.count", len(nodes))
    cmd = run.get("command")
    if isinstance(cmd, list):
        _put(a, "process.command_args", [str(c) for c in cmd])
        _put(a, "process.command_line", shlex.join(str(c) for c in cmd))
    elif cmd:
        _put(a, "process.command_line", str(cmd))
    _put(a, "process.exit.code", run.get("exit_code"))
    _put(a, "reveal.duration_s", float(run.get("end", 0)) - float(run.get("start", 0)))
    for k in ("interval_s", "samples", "channels", "bytes_stored"):
        _put(a, f"reveal.telemetry.{k}", tel.get(k))
    eff = report.get("efficiency") or {}
    cpu, mem = eff.get("cpu") or {}, eff.get("memory") or {}
    _put(a, "reveal.job.cpu.cores_used", cpu.get("cores_used_mean"))
    _put(a, "reveal.job.cpu.cores_allocated", cpu.get("cores_allocated"))
    _put(a, "reveal.job.cpu.efficiency_pct", cpu.get("efficiency_pct"))
    _put(a, "reveal.job.memory.peak_bytes", mem.get("peak_bytes"))
    _put(a, "reveal.job.memory.limit_bytes", mem.get("limit_bytes"))
    for g in eff.get("gpus") or []:
        _put(a, f"reveal.job.gpu.{g['index']}.util_mean_pct", g.get("util_mean_pct"))
    if eff.get("notes"):
        _put(a, "reveal.job.efficiency_notes", [str(n) for n in eff["notes"]])
    probes = tel.get("probes") or []
    _put(a, "reveal.telemetry.probes.available",
         sorted(p["name"] for p in probes if p.get("available")))
    _put(a, "reveal.telemetry.probes.unavailable",
         sorted(p["name"] for p in probes if not p.get("available")))
    _put(a, "reveal.anomaly.count", len(anomalies))
    if anomalies:
        _put(a, "reveal.anomaly.max_score", max(float(x.get("score", 0)) for x in anomalies))
        _put(a, "reveal.anomaly.subsystems", sorted({x.get("subsystem") for x in anomalies
                                                      if x.get("subsystem")}))
    _put(a, "reveal.summary", report.get("summary"))
    notes = report.get("notes")
    if isinstance(notes, list):
        _put(a, "reveal.notes", [str(n) for n in notes])
    analysis = report.get("analysis")
    if isinstance(analysis, dict):
        for k in ("windows", "threshold", "channels_in", "window_s", "stride_s"):
            if isinstance(analysis.get(k), (int, float)):
                _put(a, f"reveal.analysis.{k}", analysis[k])
        gp = analysis.get("gpu_peers")     # the job's GPUs on this node against each other
        if isinstance(gp, dict) and (gp.get("gpus") or 0) >= 2:
            _put(a, "reveal.gpu_peers.gpus", gp.get("gpus"))
            _put(a, "reveal.gpu_peers.suspect_gpus", sorted(
                {int(x["gpu"]) for x in gp.get("suspects") or [] if isinstance(x, dict)}))
            _put(a, "reveal.gpu_peers.shared", len(gp.get("shared") or []))
    extra = _meta_run(meta).get("extra") or {}
    for k in ("cluster", "partition", "account", "gpus"):
        v = run.get(k) if run.get(k) is not None else (extra.get(k) if isinstance(extra, dict)
                                                       else None)
        _put(a, f"reveal.{k}", v)
    return a


def anomaly_attributes(an: dict[str, Any], max_evidence: int) -> dict[str, Any]:
    a: dict[str, Any] = {}
    _put(a, "reveal.anomaly.id", an.get("id"))
    _put(a, "reveal.anomaly.subsystem", an.get("subsystem"))
    _put(a, "reveal.anomaly.score", float(an.get("score", 0)))
    _put(a, "reveal.anomaly.start", float(an["start"]))
    _put(a, "reveal.anomaly.end", float(an["end"]))
    _put(a, "reveal.anomaly.duration_s", float(an["end"]) - float(an["start"]))
    _put(a, "reveal.anomaly.node", an.get("node"))
    _put(a, "reveal.step.id", an.get("step_id"))
    _put(a, "reveal.anomaly.title", an.get("title"))
    rec = an.get("recurring")
    if isinstance(rec, dict):   # bursts that came back (each brief) joined into one
        for k in ("bursts", "burst_s", "every_s", "duty_pct"):
            _put(a, f"reveal.anomaly.recurring.{k}", rec.get(k))
    g = an.get("gpu")
    if isinstance(g, dict):     # the GPU it is about (NVML index, identity, rank on it)
        for k in ("index", "uuid", "pci_bus_id", "name", "rank"):
            _put(a, f"reveal.anomaly.gpu.{k}", g.get(k))
        if isinstance(an.get("peers"), dict):
            _put(a, "reveal.anomaly.gpu.peers_compared", an["peers"].get("compared"))
    ev = sorted(an.get("evidence") or [], key=lambda e: -abs(float(e.get("deviation", 0))))
    top = ev[:max_evidence]
    if top:
        _put(a, "reveal.anomaly.evidence.channels", [str(e["channel"]) for e in top])
        _put(a, "reveal.anomaly.evidence.deviations", [float(e["deviation"]) for e in top])
        _put(a, "reveal.anomaly.top_channel", str(top[0]["channel"]))
        _put(a, "reveal.anomaly.top_deviation", float(top[0]["deviation"]))
        if all(e.get("baseline") is not None and e.get("observed") is not None for e in top):
            _put(a, "reveal.anomaly.evidence.baselines", [float(e["baseline"]) for e in top])
            _put(a, "reveal.anomaly.evidence.observed", [float(e["observed"]) for e in top])
    _put(a, "reveal.anomaly.evidence.count", len(ev))
    hints = an.get("hints") or []
    _put(a, "reveal.hint.count", len(hints))
    if hints:
        _put(a, "reveal.anomaly.severity",
             max((h.get("severity", "info") for h in hints),
                 key=lambda s: SEVERITY_ORDER.get(s, 0)))
    return a


def peer_attributes(report: dict[str, Any]) -> dict[str, Any]:
    """The job's peer comparison on a node's root (job) span: ``report["job_peers"]`` is set by
    the job-level analysis (:func:`reveal_plugins.detect.peers.job.annotate_reports`)."""
    a: dict[str, Any] = {}
    p = report.get("job_peers")
    if not isinstance(p, dict):
        return a
    _put(a, "reveal.peers.nodes", p.get("nodes"))
    _put(a, "reveal.peers.suspect", bool(p.get("suspect")))
    _put(a, "reveal.peers.suspect_nodes", p.get("suspect_nodes"))
    _put(a, "reveal.peers.summary", p.get("summary"))
    return a


def peer_event_attributes(sp: dict[str, Any], max_evidence: int) -> dict[str, Any]:
    """One peer suspect as a span event: node, rank, subsystem, span, evidence against the
    peers' median, impact."""
    a: dict[str, Any] = {}
    for k in ("node", "rank", "gpu", "subsystem", "score", "start", "end", "id"):
        _put(a, f"reveal.peer.{k}", sp.get(k))
    ev = list(sp.get("evidence") or [])[:max_evidence]
    if ev:
        _put(a, "reveal.peer.evidence.channels", [str(e["channel"]) for e in ev])
        _put(a, "reveal.peer.evidence.deviations", [float(e["deviation"]) for e in ev])
        if all(e.get("observed") is not None and e.get("peers") is not None for e in ev):
            _put(a, "reveal.peer.evidence.observed", [float(e["observed"]) for e in ev])
            _put(a, "reveal.peer.evidence.peers", [float(e["peers"]) for e in ev])
    imp = sp.get("impact") or {}
    _put(a, "reveal.peer.iteration_time_pct", imp.get("iteration_time_pct"))
    hints = sp.get("hints") or []
    if hints:
        _put(a, "reveal.peer.hint", hints[0].get("title"))
        _put(a, "reveal.peer.action", hints[0].get("action"))
    return a


def hint_attributes(h: dict[str, Any]) -> dict[str, Any]:
    a: dict[str, Any] = {}
    for k in ("title", "severity", "why", "action", "rule", "id"):
        _put(a, f"reveal.hint.{k}", h.get(k))
    return a


def _step_for(an: dict[str, Any], steps: Iterable[tuple[str, float, float]]) -> str | None:
    sid = an.get("step_id")
    steps = list(steps)
    if sid is not None and any(s[0] == str(sid) for s in steps):
        return str(sid)
    t = float(an["start"])
    # innermost step: on Slurm the extern and batch steps span the numbered ones
    holding = [(e - b, s) for s, b, e in steps if b <= t <= e]
    return min(holding)[1] if holding else None


def build_spans(report: dict[str, Any], meta: dict[str, Any] | None = None,
                cfg: OtelConfig | None = None) -> list[ReadableSpan]:
    """The finished spans of one run, root first.

    Anomalies hang under the step they belong to (their ``step_id``, else the step whose time
    range holds their start), else under the root.
    """
    cfg = cfg or OtelConfig()
    run = report.get("run")
    if not isinstance(run, dict) or "start" not in run or "end" not in run:
        raise ValueError("report has no run.start/run.end (not a reveal.report/1 document)")
    start, end = float(run["start"]), float(run["end"])
    # The root covers its steps: on Slurm the first step can start before the agent registered
    # the run (the Prolog runs at the first step), and the extern step ends after the run.
    tel_start, tel_end = start, end
    for s in run.get("steps") or []:
        start = min(start, float(s["start"]))
        if s.get("end") is not None:
            end = max(end, float(s["end"]))
    memory = InMemorySpanExporter()
    tkey, skey = trace_keys(report, meta)
    ids = RunIdGenerator(tkey, skey)
    provider = TracerProvider(resource=build_resource(report, meta, cfg),
                              id_generator=ids,
                              span_limits=SpanLimits(max_events=1000, max_attributes=256),
                              shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(SCOPE, __version__)

    source = run.get("source", "local")
    ids.next_key = "root"
    root = tracer.start_span(ROOT_NAMES.get(source, f"{source} run"), kind=SpanKind.INTERNAL,
                             attributes=root_attributes(report, meta), start_time=_ns(start))
    root.set_status(_exit_status(run.get("exit_code")))
    if report.get("status") == "failed":   # a crashed analysis is not a clean run
        root.set_status(Status(StatusCode.ERROR,
                               f"analysis failed: {report.get('status_reason')}"))
    root.set_attribute("reveal.analysis.status", str(report.get("status", "ok")))
    root.set_attribute("reveal.telemetry.start", tel_start)
    root.set_attribute("reveal.telemetry.end", tel_end)
    for k, v in peer_attributes(report).items():
        root.set_attribute(k, v)
    for sp in (report.get("job_peers") or {}).get("suspects") or []:
        if isinstance(sp, dict) and isinstance(sp.get("start"), (int, float)):
            root.add_event("peer_suspect", attributes=peer_event_attributes(
                sp, cfg.max_evidence), timestamp=_ns(sp["start"]))
    root_ctx = trace_api.set_span_in_context(root)

    exit_codes = _step_exit_codes(report, meta)
    step_spans = {}
    step_ranges = []
    for s in run.get("steps") or []:
        sid = str(s["step_id"])
        s_end = float(s["end"]) if s.get("end") is not None else end
        attrs: dict[str, Any] = {}
        _put(attrs, "reveal.step.id", sid)
        _put(attrs, "reveal.job.id", run.get("job_id"))
        _put(attrs, "process.exit.code", exit_codes.get(sid))
        _put(attrs, "reveal.duration_s", s_end - float(s["start"]))
        ids.next_key = f"step|{sid}"
        sp = tracer.start_span(f"step {sid}", context=root_ctx, kind=SpanKind.INTERNAL,
                               attributes=attrs, start_time=_ns(s["start"]))
        sp.set_status(_exit_status(exit_codes.get(sid)))
        step_spans[sid] = (sp, s_end)
        step_ranges.append((sid, float(s["start"]), s_end))

    anomalies = list(report.get("anomalies") or [])
    if len(anomalies) > cfg.max_anomalies:  # keep a job end's export within its budget
        anomalies = sorted(anomalies, key=lambda x: -float(x.get("score", 0)))[:cfg.max_anomalies]
        root.set_attribute("reveal.anomaly.exported", len(anomalies))
    for n, an in enumerate(sorted(anomalies, key=lambda x: float(x["start"]))):
        sid = _step_for(an, step_ranges)
        ids.next_key = f"anomaly|{an.get('id', n)}"
        parent = step_spans[sid][0] if sid is not None else root
        sp = tracer.start_span(f"anomaly {an.get('subsystem', 'unknown')}",
                               context=trace_api.set_span_in_context(parent),
                               kind=SpanKind.INTERNAL,
                               attributes=anomaly_attributes(an, cfg.max_evidence),
                               start_time=_ns(an["start"]))
        for h in an.get("hints") or []:
            sp.add_event("hint", attributes=hint_attributes(h), timestamp=_ns(an["start"]))
        sp.end(end_time=_ns(an["end"]))

    for sp, s_end in step_spans.values():
        sp.end(end_time=_ns(s_end))
    root.end(end_time=_ns(end))
    spans = list(memory.get_finished_spans())
    # root first, then steps, then anomalies: readable in tests and in exporters' batches
    return sorted(spans, key=lambda s: (0 if s.parent is None else
                                        1 if s.name.startswith("step ") else 2,
                                        s.start_time or 0))


def build_peer_spans(suspect: dict[str, Any], run: dict[str, Any],
                     cfg: OtelConfig | None = None) -> list[ReadableSpan]:
    """A live peer suspect as one short span ("peer suspect", with a ``peer_suspect`` event)
    in the job's trace (same trace id as the job's spans at its end: the ids come from the
    job's identity), sent while the job still runs.  ``run`` is the node's RunInfo dict."""
    cfg = cfg or OtelConfig()
    report = {"run": {"source": run.get("source", "local"), "job_id": run.get("job_id"),
                      "nodes": [run.get("host") or "unknown"], "start": 0.0, "end": 0.0,
                      "run_id": run.get("run_id")}}
    meta = {"run": run}
    tkey, skey = trace_keys(report, meta)
    ids = RunIdGenerator(tkey, skey)
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=build_resource(report, meta, cfg), id_generator=ids,
                              shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(SCOPE, __version__)
    ids.next_key = f"peer|{suspect.get('node')}|{suspect.get('subsystem')}|" \
                   f"{float(suspect['start']):.3f}"
    t_end = float(suspect.get("detected_at") or suspect["end"])
    attrs = peer_event_attributes(suspect, cfg.max_evidence)
    attrs["reveal.live"] = True
    sp = tracer.start_span("peer suspect", kind=SpanKind.INTERNAL, attributes=attrs,
                           start_time=_ns(suspect["start"]))
    sp.add_event("peer_suspect", attributes=attrs, timestamp=_ns(t_end))
    sp.end(end_time=_ns(t_end))
    return list(memory.get_finished_spans())
