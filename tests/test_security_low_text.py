"""Low items of issue 22, second part: step ids and ``t`` values in root-written meta.json,
OTel redaction of every header value and query string, user text in the fleet report (control
characters in the text form, '$' in the HTML figures) and an unquoted HTML attribute."""
import json
import logging
import os

import pytest

from reveal_plugins.agent import protocol
from reveal_plugins.agent.runstate import RunLimits
from reveal_plugins.types import RunInfo


def _strict_json(path):
    def refuse(name):
        raise ValueError(f"{name} in {path}: not standard JSON")
    with open(path) as f:
        return json.load(f, parse_constant=refuse)


@pytest.fixture
def agent(tmp_path):
    from reveal_plugins.agent.daemon import Agent
    a = Agent(str(tmp_path / "spool"), interval_s=0.5)
    d = a.register(RunInfo(run_id="r", source="test", run_dir=str(tmp_path / "r")))
    yield a, d
    for run_id in list(a._runs):
        a.unregister(run_id, 0)


def test_step_ids_are_bounded_in_meta_json(agent):
    a, d = agent
    lim = RunLimits()
    assert not a.event("r", "step_start", step_id="s" * (64 * 1024 - 200))  # 64 KiB id
    assert not a.event("r", "step_start", step_id="x" * (lim.step_id_chars + 1))
    assert a.event("r", "step_start", step_id="x" * lim.step_id_chars)
    ok = [a.event("r", "step_start", step_id=f"s{i}") for i in range(lim.steps + 5)]
    assert ok.count(True) == lim.steps - 1
    # an exit code is a small integer or nothing in meta.json, not 64 KiB of anything
    assert a.event("r", "step_end", step_id="s1", exit_code="z" * 5000)
    a.unregister("r", 0)
    meta = _strict_json(os.path.join(d, "meta.json"))
    assert len(meta["steps"]) <= lim.steps
    assert max(len(s["step_id"]) for s in meta["steps"]) <= lim.step_id_chars
    assert all(s["exit_code"] is None or isinstance(s["exit_code"], int) for s in meta["steps"])
    assert os.path.getsize(os.path.join(d, "meta.json")) < 1024 * (lim.step_id_chars + 200)


@pytest.mark.parametrize("t", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_t_never_reaches_meta_json(agent, t):
    a, d = agent
    line = ('{"op":"event","run_id":"r","event":"step_start","step_id":"s","t":%s}' % t).encode()
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(line)
    # a caller in the same process (the torch extension, a plugin) is refused too
    assert not a.event("r", "step_start", float(t.replace("1e999", "inf")), step_id="s")
    assert not a.event("r", "step_end", float(t.replace("1e999", "inf")), step_id="s")
    assert a.event("r", "step_start", 1.5e9, step_id="s")
    a.unregister("r", 0)
    meta = _strict_json(os.path.join(d, "meta.json"))
    assert [s["start"] for s in meta["steps"]] == [1.5e9]
    with open(os.path.join(d, "events.jsonl")) as f:
        for line in f:
            json.loads(line, parse_constant=lambda n: pytest.fail(f"{n} in events.jsonl"))


# --- OTel: every header value and every query string -------------------------------------

HC_KEY = "hcteamkey4242"
SIG = "sv2020sigAbCdEf99"


def test_redaction_covers_any_header_and_query():
    from reveal_plugins.otel.config import OtelConfig, redact_headers, redact_url
    assert SIG not in redact_url(f"https://ingest.example/v1/traces?sig={SIG}&sp=r")
    assert "sp=r" not in redact_url("https://h/v1/traces?sig=x&sp=r")
    assert redact_url("https://h/v1?justatoken123") == "https://h/v1?***"
    assert redact_headers({"x-honeycomb-team": HC_KEY, "x-tenant": "lab"}) == \
        {"x-honeycomb-team": "***", "x-tenant": "***"}
    cfg = OtelConfig(enabled=True, endpoint=f"https://h:4318?sig={SIG}",
                     headers={"x-honeycomb-team": HC_KEY})
    msg = cfg.redact(f"POST https://h:4318/v1/traces?sig={SIG} failed with "
                     f"x-honeycomb-team: {HC_KEY}")
    assert HC_KEY not in msg and SIG not in msg and "***" in msg


def test_otel_json_has_no_header_value_nor_query(otel_clean_env, tmp_path, caplog, capsys,
                                                  otlp_dead_port):
    from fixtures_otlp import make_otel_meta, make_otel_report
    from reveal_plugins.otel import sink
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "report.json").write_text(json.dumps(make_otel_report()))
    (run_dir / "meta.json").write_text(json.dumps(make_otel_meta()))
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                          otlp_dead_port + f"/v1/traces?sig={SIG}&sp=r")
    otel_clean_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"x-honeycomb-team={HC_KEY}")
    caplog.set_level(logging.DEBUG)
    sink.reveal_report_ready(make_otel_report(), str(run_dir), {}, 600)
    status = (run_dir / "otel.json").read_text()
    assert not json.loads(status)["ok"]
    logs = "\n".join(r.getMessage() for r in caplog.records)
    from reveal_plugins.cli import main
    assert main(["otel", "config"]) == 0
    out = capsys.readouterr()
    for text in (status, logs, out.out + out.err):
        assert SIG not in text and HC_KEY not in text, text


# --- fleet report: user text ------------------------------------------------------------

def _summary(node, workload, hint):
    row = dict(analysed=5, anomalous=3, rate=0.6, ci_low=0.2, ci_high=0.9, users=2,
               users_affected=2, dominant_subsystem="cpu", suspect=True)
    return {"fleet": "/idx", "since": None, "until": None, "runs_analysed": 5,
            "runs_anomalous": 3, "fleet_rate": 0.6,
            "anomalies_per_subsystem": {"cpu": 3},
            "anomalies_per_day": [{"day": "2026-12-01", "subsystem": "cpu", "anomalies": 3}],
            "worst_nodes": [dict(row, node=node,
                                 drain_command=f"scontrol update NodeName={node} State=DRAIN")],
            "worst_workloads": [dict(row, workload=workload)],
            "top_findings": [{"anomalies": 3, "subsystem": "cpu", "hint": hint}],
            "suspect_nodes": [dict(row, node=node,
                                   drain_command=f"scontrol update NodeName={node}")]}


def test_fleet_text_escapes_control_characters():
    from reveal_plugins.fleet.report import format_text
    evil = "job\x1b]0;owned\x07\x1b[2J\rfake\u202eline\nSUSPECT"
    text = format_text(_summary("node\x1b[31m1", evil, f"look at {evil}"))
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert "\u202e" not in text
    body = text.splitlines()
    assert not any(line.startswith("SUSPECT") for line in body), text  # no injected lines
    assert "\\x1b" in text


def test_fleet_html_survives_mathtext_in_names():
    pytest.importorskip("matplotlib")
    from reveal_plugins.fleet.report import render_html
    name = r"$\foo$ train_$x^{2"
    html = render_html(_summary("node$\\bar$", name, "note $\\undefinedmacro$"))
    assert html.count("<svg") == 3
    assert r"$\foo$" in html  # shown as written, escaped for HTML where needed


def test_run_report_note_with_dollars_renders(tmp_path):
    pytest.importorskip("matplotlib")
    from fixtures_report import make_report, make_run
    from reveal_plugins.report.html import render_html
    from reveal_plugins.store import store
    d = str(tmp_path / "run")
    meta = make_run(d, seconds=30)
    store.append_event(d, "note", meta["start"] + 5, message=r"lr $\foo$ now $x^{2")
    html = render_html(make_report(meta), d)
    assert r"$\foo$" in html and "<svg" in html


def test_hint_severity_attribute_is_quoted():
    from reveal_plugins.report.html import _hints
    rep = {"anomalies": [{"start": 0, "hints": [
        {"severity": "info onmouseover=alert(1)", "title": "t", "action": "do it"}]}]}
    html = _hints(rep)
    assert "class='info onmouseover=alert(1)'" in html
    assert " onmouseover=" not in html.replace("class='info onmouseover=alert(1)'", "")
