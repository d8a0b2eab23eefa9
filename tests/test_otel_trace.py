"""Report -> trace, checked in memory: the tree an operator searches, its names, attributes,
real times and hint events."""
import json
import time

import jsonschema
import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from conftest import SCHEMA_PATH
from fixtures_otlp import make_otel_meta, make_otel_report
from reveal_plugins.otel.config import OtelConfig
from reveal_plugins.otel.export import export_report
from reveal_plugins.otel.trace import build_spans

T0 = 1_700_000_000.0


def _exported(report, meta=None, cfg=None):
    mem = InMemorySpanExporter()
    outcome = export_report(report, meta, cfg or OtelConfig(enabled=True), exporter=mem)
    assert outcome.ok and outcome.spans == len(mem.get_finished_spans())
    return {s.name: s for s in mem.get_finished_spans()}, list(mem.get_finished_spans())


def test_handmade_reports_follow_the_schema():
    schema = json.loads(SCHEMA_PATH.read_text())
    for r in (make_otel_report(), make_otel_report(200), make_otel_report(source="local")):
        jsonschema.validate(r, schema)


def test_tree_is_run_then_steps_then_anomalies():
    by_name, spans = _exported(make_otel_report(), make_otel_meta())
    assert [s.name for s in spans] == ["slurm job", "step 0", "step 1", "anomaly gpu",
                                       "anomaly network", "anomaly storage"]
    root = by_name["slurm job"]
    assert root.parent is None
    assert len({s.context.trace_id for s in spans}) == 1
    for step in ("step 0", "step 1"):
        assert by_name[step].parent.span_id == root.context.span_id
    # a1 has no step_id but starts inside step 0; a2 names step 1; a3 is after every step
    assert by_name["anomaly gpu"].parent.span_id == by_name["step 0"].context.span_id
    assert by_name["anomaly network"].parent.span_id == by_name["step 1"].context.span_id
    assert by_name["anomaly storage"].parent.span_id == root.context.span_id


def test_spans_carry_the_runs_real_times_not_export_time():
    by_name, _ = _exported(make_otel_report(), make_otel_meta())
    ns = 1_000_000_000
    assert by_name["slurm job"].start_time == int(T0 * ns)
    assert by_name["slurm job"].end_time == int((T0 + 100) * ns)
    assert (by_name["step 1"].start_time, by_name["step 1"].end_time) == (int((T0 + 41) * ns),
                                                                          int((T0 + 95) * ns))
    gpu = by_name["anomaly gpu"]
    assert (gpu.start_time, gpu.end_time) == (int((T0 + 10) * ns), int((T0 + 16) * ns))
    assert all(s.end_time < time.time() * ns - 3600 * ns for s in by_name.values())


def test_root_attributes_and_resource():
    by_name, _ = _exported(make_otel_report(), make_otel_meta())
    root = by_name["slurm job"]
    a = root.attributes
    assert a["reveal.source"] == "slurm"
    assert a["slurm.job.id"] == "4242" and a["reveal.job.id"] == "4242"
    assert a["user.name"] == "alice"
    assert list(a["reveal.nodes"]) == ["node1"]
    assert a["process.command_line"] == "python train.py --epochs 3"
    assert list(a["process.command_args"]) == ["python", "train.py", "--epochs", "3"]
    assert a["process.exit.code"] == 0
    assert a["reveal.telemetry.samples"] == 1000 and a["reveal.telemetry.channels"] == 412
    assert a["reveal.telemetry.interval_s"] == 0.1
    assert a["reveal.telemetry.bytes_stored"] == 1_600_000
    assert list(a["reveal.telemetry.probes.unavailable"]) == ["nvml"]
    assert a["reveal.anomaly.count"] == 3 and a["reveal.anomaly.max_score"] == 7.25
    res = root.resource.attributes
    assert res["service.name"] == "reveal"
    assert res["host.name"] == "node1"
    assert res["reveal.scheduler"] == "slurm" and res["slurm.cluster.name"] == "testcluster"
    assert root.status.status_code == StatusCode.UNSET


def test_anomaly_span_has_subsystem_score_and_top_evidence():
    by_name, _ = _exported(make_otel_report(), make_otel_meta(),
                           OtelConfig(enabled=True, max_evidence=2))
    a = by_name["anomaly gpu"].attributes
    assert a["reveal.anomaly.subsystem"] == "gpu"
    assert a["reveal.anomaly.score"] == 7.25
    assert a["reveal.anomaly.id"] == "a1"
    assert (a["reveal.anomaly.start"], a["reveal.anomaly.end"]) == (T0 + 10, T0 + 16)
    # sorted by |deviation|, cut to max_evidence
    assert list(a["reveal.anomaly.evidence.channels"]) == ["gpu.0.clock_sm", "gpu.0.temperature"]
    assert list(a["reveal.anomaly.evidence.deviations"]) == [-6.5, 5.1]
    assert list(a["reveal.anomaly.evidence.observed"]) == [1410.0, 87.0]
    assert a["reveal.anomaly.top_channel"] == "gpu.0.clock_sm"
    assert a["reveal.anomaly.evidence.count"] == 3
    assert a["reveal.anomaly.severity"] == "critical"


def test_hints_are_span_events_with_what_why_and_action():
    by_name, _ = _exported(make_otel_report(), make_otel_meta())
    ev = by_name["anomaly gpu"].events
    assert [e.name for e in ev] == ["hint", "hint"]
    first = ev[0].attributes
    assert first["reveal.hint.title"] == "GPU 0 thermally throttled"
    assert first["reveal.hint.severity"] == "critical"
    assert first["reveal.hint.action"].startswith("check airflow")
    assert first["reveal.hint.why"]
    assert ev[0].timestamp == int((T0 + 10) * 1e9)
    assert by_name["anomaly storage"].events == ()


def test_failed_run_and_failed_step_are_errors():
    by_name, _ = _exported(make_otel_report(exit_code=137), make_otel_meta())
    assert by_name["slurm job"].status.status_code == StatusCode.ERROR
    assert "137" in by_name["slurm job"].status.description
    # step 1 exited 3 according to meta.json
    assert by_name["step 1"].status.status_code == StatusCode.ERROR
    assert by_name["step 1"].attributes["process.exit.code"] == 3
    assert by_name["step 0"].status.status_code == StatusCode.UNSET


def test_ids_are_stable_across_re_exports_and_shared_by_a_jobs_nodes():
    r, m = make_otel_report(), make_otel_meta()
    a = [(s.context.trace_id, s.context.span_id) for s in build_spans(r, m)]
    b = [(s.context.trace_id, s.context.span_id) for s in build_spans(r, m)]
    assert a == b
    other_node = json.loads(json.dumps(m))
    other_node["host"] = {"hostname": "node2"}
    c = build_spans(r, other_node)
    assert c[0].context.trace_id == a[0][0]          # same job -> same trace
    assert c[0].context.span_id != a[0][1]           # one root span per node
    local = make_otel_report(source="local")
    assert build_spans(local, None)[0].context.trace_id != a[0][0]


def test_local_run_without_steps_or_meta():
    r = make_otel_report(source="local")
    r["run"]["steps"] = []
    by_name, spans = _exported(r)
    assert spans[0].name == "reveal record"
    assert "slurm.job.id" not in spans[0].attributes
    assert spans[0].resource.attributes["reveal.scheduler"] == "none"
    assert all(s.parent.span_id == spans[0].context.span_id for s in spans[1:])


def test_not_a_report_is_a_clear_error():
    with pytest.raises(ValueError, match="run.start"):
        build_spans({"schema": "reveal.report/1", "run": {}})


def test_many_anomalies_build_fast():
    r = make_otel_report(1000)
    t = time.perf_counter()
    spans = build_spans(r, make_otel_meta(), OtelConfig(enabled=True, max_anomalies=1000))
    dt = time.perf_counter() - t
    assert len(spans) == 1 + 2 + 1000
    assert dt < 2.0, f"building 1003 spans took {dt:.2f} s"
    assert InMemorySpanExporter().export(spans) == SpanExportResult.SUCCESS


def test_huge_reports_keep_the_highest_scores_with_stable_ids():
    r = make_otel_report(50)
    full = {s.attributes.get("reveal.anomaly.id"): s.context.span_id
            for s in build_spans(r, make_otel_meta())}
    cut = build_spans(r, make_otel_meta(), OtelConfig(enabled=True, max_anomalies=10))
    anomalies = [s for s in cut if s.name.startswith("anomaly ")]
    assert len(anomalies) == 10
    kept = sorted((float(s.attributes["reveal.anomaly.score"]) for s in anomalies), reverse=True)
    assert kept == sorted((a["score"] for a in r["anomalies"]), reverse=True)[:10]
    assert cut[0].attributes["reveal.anomaly.count"] == 50
    assert cut[0].attributes["reveal.anomaly.exported"] == 10
    # a span's id depends on what it is, not on how many others were exported
    assert all(full[s.attributes["reveal.anomaly.id"]] == s.context.span_id for s in anomalies)


def test_root_covers_steps_that_outlive_the_telemetry():
    """On Slurm the first step can start before the agent registered the run."""
    r = make_otel_report()
    r["run"]["steps"][0]["start"] = T0 - 0.5
    r["run"]["steps"].append({"step_id": "extern", "start": T0 - 0.6, "end": T0 + 100.2})
    root = build_spans(r, make_otel_meta())[0]
    assert root.start_time == int((T0 - 0.6) * 1e9) and root.end_time == int((T0 + 100.2) * 1e9)
    assert root.attributes["reveal.telemetry.start"] == T0
    assert root.attributes["reveal.telemetry.end"] == T0 + 100


def test_anomaly_goes_to_the_innermost_step():
    r = make_otel_report()
    r["run"]["steps"][:0] = [{"step_id": "extern", "start": T0, "end": T0 + 100},
                             {"step_id": "batch", "start": T0 + 0.5, "end": T0 + 99}]
    spans = build_spans(r, make_otel_meta())
    by_id = {s.context.span_id: s.name for s in spans}
    gpu = next(s for s in spans if s.name == "anomaly gpu")
    assert by_id[gpu.parent.span_id] == "step 0"
    storage = next(s for s in spans if s.name == "anomaly storage")   # after step 1: in batch
    assert by_id[storage.parent.span_id] == "step batch"


def test_recurring_bursts_reach_the_anomaly_span():
    """An anomaly made of recurring bursts (``recurring`` and ``title`` as
    ``detect.batch.stages.recurring`` writes them) carries both on its span."""
    rep = make_otel_report(1)
    an = dict(rep["anomalies"][0], subsystem="cpu",
              title="recurring: 5 bursts of ~6 s, one every ~20 s (35 % of this span)",
              recurring={"bursts": 5, "burst_s": 6.0, "every_s": 20.0, "duty_pct": 35})
    an.pop("gpu", None)
    rep["anomalies"] = [an]
    by_name, _ = _exported(rep, make_otel_meta())
    a = by_name["anomaly cpu"].attributes
    assert a["reveal.anomaly.title"].startswith("recurring: 5 bursts")
    assert a["reveal.anomaly.recurring.bursts"] == 5
    assert a["reveal.anomaly.recurring.every_s"] == 20.0
