"""The text summary and the ``reveal report`` command: what a person reads after a run."""
import json
import os
import re
import subprocess
import sys

import jsonschema
from conftest import SCHEMA_PATH
from fixtures_report import empty_report, make_empty_run, make_report, make_run

from reveal_plugins.commands.report import main as report_main
from reveal_plugins.report.text import render_text

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _schema():
    with open(SCHEMA_PATH) as f:
        return json.load(f)


def _squash(s: str) -> str:
    return re.sub(r"\s+", " ", s)


def test_fixture_reports_follow_the_schema(report_run, tmp_path):
    _, rep = report_run
    jsonschema.validate(rep, _schema())
    meta = make_empty_run(str(tmp_path / "empty"))
    jsonschema.validate(empty_report(meta), _schema())


def test_several_anomalies_read_as_what_when_evidence_impact_and_actions(report_run):
    d, rep = report_run
    out = render_text(rep, color=False, run_dir=d)
    flat = _squash(out)
    assert not ANSI.search(out)
    # header: who, where, how long, exit code, command
    assert "job 4242" in flat and "alice@node01" in flat and "exit 0" in flat
    assert "(2 min 00 s)" in flat
    assert "python examples/train.py --model cnn --seconds 120" in flat
    assert "not read: perf (hardware counters not supported in this VM)" in flat
    # utilization bars from the telemetry: CPU busy 45 % at rest, ~99 % for 30 s of 120 s
    cpu = next(ln for ln in out.splitlines() if " CPU " in ln and "mean" in ln)
    mean = float(re.search(r"(\d+) % mean", cpu).group(1))
    assert 50 <= mean <= 66 and "2 cores" in cpu and "█" in cpu
    assert re.search(r"mem .*6\.0 of 24\.0 GiB", flat)
    gpu = next(ln for ln in out.splitlines() if "GPU0" in ln)
    assert "mem 30.0/80 GiB" in gpu and "W" in gpu and "°C" in gpu
    # both anomalies, numbered by time, with when/how long/subsystem
    assert "Anomalies (2)" in flat
    a1 = flat.index("#1 CPU")
    a2 = flat.index("#2 storage")
    assert a1 < a2
    assert "+0:40 → +1:10" in flat and "30 s, 25 % of run" in flat
    assert "+1:30 → +1:40" in flat and "10 s, 8 % of run" in flat
    # evidence baseline -> observed in units a person reads (PSI µs/s -> % of time)
    assert re.search(r"cpu\.psi\.some_total 1\.00 % of time → 60\.0 % of time \+14\.2σ", flat)
    assert re.search(r"gpu\.0\.util_sm 92\.0 % → 35\.0 % -7\.5σ", flat)
    assert re.search(r"storage\.sda\.write_sectors 2\.00 MB/s → 200 MB/s", flat)
    assert "1 more channel(s) moved" in flat
    # impact from the iteration markers: 0.20 s -> 0.45 s inside the CPU episode
    imp = flat[a1:a2]
    assert re.search(r"iteration time 0\.2\d s → 0\.4\d s · \+1\d\d %, 2\.\d× slower", imp)
    # hints: most severe first, with the anomaly they belong to and a concrete action
    todo = flat[flat.index("What to do"):]
    assert todo.index("CRITICAL") < todo.index("WARNING") < todo.index("INFO")
    assert "CPU contention: other processes compete with the job's threads (#1)" in todo
    assert "srun --exclusive" in todo and "iostat -x 1" in todo
    # one screen: the whole summary fits in a terminal page or two
    assert len(out.splitlines()) < 60


def test_impact_field_from_the_pipeline_wins_over_markers(report_run):
    d, rep = report_run
    rep["anomalies"][1]["impact"] = {"metric": "iteration_time", "unit": "s",
                                     "baseline": 0.2, "observed": 0.3}
    flat = _squash(render_text(rep, color=False, run_dir=d))
    assert "iteration time 0.20 s → 0.30 s · +50 %, 1.5× slower" in flat


def test_pipeline_impact_form(report_run):
    d, rep = report_run
    rep["anomalies"][0]["impact"] = {"iteration_time_pct": 120.0, "iteration_time_s": 0.44,
                                     "iteration_time_baseline_s": 0.2, "iterations": 66,
                                     "text": "iteration time +120% during this anomaly"}
    flat = _squash(render_text(rep, color=False))
    assert "iteration time 0.20 s → 0.44 s · +120 %, 2.2× slower · 66 iterations affected" in flat


def test_colour_only_when_asked_or_on_a_terminal(report_run, monkeypatch):
    d, rep = report_run
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = render_text(rep, color=True, run_dir=d)
    assert ANSI.search(coloured)
    assert ANSI.sub("", coloured) == render_text(rep, color=False, run_dir=d)
    # default (None): stdout here is captured, not a terminal
    assert not ANSI.search(render_text(rep, run_dir=d))


def test_report_without_run_dir_still_reads(report_run):
    _, rep = report_run
    flat = _squash(render_text(rep, color=False))
    assert "Utilization" not in flat
    assert "#1 CPU" in flat and "What to do" in flat
    assert "cpu.psi.some_total" in flat


def test_run_without_anomalies_says_so(tmp_path):
    d = str(tmp_path / "calm")
    meta = make_run(d, seconds=60, cpu_episode=None, io_episode=None)
    rep = make_report(meta, anomalies=False)
    out = render_text(rep, color=False, run_dir=d)
    flat = _squash(out)
    assert "No anomalies" in flat and "What to do" not in flat
    assert "checked 118 windows of 3.0 s over 31 of 49 channels" in flat
    cpu_mean = float(re.search(r"CPU .*? (\d+) % mean", flat).group(1))
    assert 40 <= cpu_mean <= 50  # the calm run's 45 % busy


def test_empty_run_explains_why_there_is_nothing(tmp_path):
    d = str(tmp_path / "empty")
    meta = make_empty_run(d)
    out = render_text(empty_report(meta), color=False, run_dir=d)
    flat = _squash(out)
    assert "exit 1" in flat and "bob@node01" in flat
    assert "No telemetry was recorded for this run" in flat
    assert "lasted 0.05 s" in flat and "0.10 s" in flat  # how long, and the sample interval
    assert "Traceback" not in out and "nan" not in flat.lower()


def test_cli_text_json_and_out(report_run, tmp_path, capsys):
    d, rep = report_run
    assert report_main([d]) == 0
    out = capsys.readouterr().out
    assert "#1 CPU" in out and not ANSI.search(out)
    assert report_main([d, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == rep
    dest = tmp_path / "sub" / "r.txt"
    assert report_main([d, "--out", str(dest), "--color", "always"]) == 0
    assert ANSI.search(dest.read_text())
    # a report.json path works too
    assert report_main([os.path.join(d, "report.json")]) == 0
    assert "Utilization" in capsys.readouterr().out  # its run dir was found next to it


def test_cli_job_id_gives_one_section_per_node(tmp_path, capsys, monkeypatch):
    spool = tmp_path / "spool"
    for i, host in enumerate(("gpu01", "gpu02")):
        d = str(spool / "jobs" / "777" / host)
        meta = make_run(d, seconds=60, host=host, job_id="777", seed=i,
                        cpu_episode=(20, 40) if host == "gpu02" else None, io_episode=None)
        rep = make_report(meta, anomalies=host == "gpu02")
        if host == "gpu02":
            rep["anomalies"] = rep["anomalies"][:1]
        with open(os.path.join(d, "report.json"), "w") as f:
            json.dump(rep, f)
    monkeypatch.setenv("REVEAL_SPOOL", str(spool))
    assert report_main(["777"]) == 0
    out = capsys.readouterr().out
    flat = _squash(out)
    assert "Job 777: 2 nodes (gpu01, gpu02), 1 anomaly in all" in flat
    assert flat.index("alice@gpu01") < flat.index("No anomalies") < flat.index("alice@gpu02")
    assert flat.index("alice@gpu02") < flat.index("#1 CPU")
    assert report_main(["777", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "reveal.job-report/1" and doc["job_id"] == "777"
    assert [r["run"]["nodes"] for r in doc["reports"]] == [["gpu01"], ["gpu02"]]


def test_cli_errors_name_the_problem(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REVEAL_SPOOL", str(tmp_path / "spool"))
    assert report_main(["999"]) == 1
    err = capsys.readouterr().err
    assert "job 999" in err and str(tmp_path / "spool" / "jobs" / "999") in err
    assert report_main([str(tmp_path / "nope")]) == 1
    assert "no such directory" in capsys.readouterr().err
    bad = tmp_path / "run"
    bad.mkdir()
    (bad / "meta.json").write_text("{}")
    (bad / "report.json").write_text('{"schema": "reveal.report/1",\n "run": }')
    assert report_main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert "report.json" in err and "line 2" in err
    (bad / "report.json").write_text('{"schema": "reveal.report/1", "run": {}}')
    assert report_main([str(bad)]) == 1
    assert "missing key(s) telemetry, anomalies, summary" in capsys.readouterr().err


def test_reveal_command_dispatches_report(report_run):
    d, _ = report_run
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "report", d],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "What to do" in r.stdout and not ANSI.search(r.stdout)
    assert r.stderr == ""  # no progress noise when not on a terminal


def test_real_pipeline_output_renders(tmp_path):
    """The detection pipeline's own report (its units, impact form, notes) reads right."""
    from reveal_plugins.analysis import analyze_and_publish
    d = str(tmp_path / "run")
    make_run(d, seconds=180, interval=0.1, cpu_episode=(60, 100), io_episode=(130, 145),
             gpus=0)
    rep = analyze_and_publish(d, publish=False)
    with open(SCHEMA_PATH) as f:
        jsonschema.validate(rep, json.load(f))
    flat = _squash(render_text(rep, color=False, run_dir=d))
    cpu = [a for a in rep["anomalies"] if a["subsystem"] == "cpu"]
    assert cpu, rep["summary"]
    assert re.search(r"#\d CPU \+[01]:\d\d → \+1:\d\d", flat)
    # impact from the pipeline's iteration markers: 0.2 s -> 0.45 s
    assert re.search(r"iteration time 0\.2\d s → 0\.4\d s · \+1\d\d %, 2\.\d× slower", flat)
    # counters shown in readable units, never raw µs/s or ticks/s
    assert "us/s" not in flat and "ticks/s" not in flat
    assert "What to do" in flat and "CRITICAL" in flat
    assert re.search(r"checked \d+ windows of 3\.0 s", flat)


def test_user_strings_cannot_drive_the_admins_terminal(tmp_path):
    """Job name, command and step ids are the user's: escape sequences, BEL, newlines and bidi
    overrides in them are shown as escapes, never emitted (issue 13)."""
    d = str(tmp_path / "run")
    meta = make_run(d)
    rep = make_report(meta)
    evil = "train\x1b]0;owned\x07\x1b[2J\nReveal report  job 1 · exit 0\u202e"
    rep["run"]["command"] = ["python", evil]
    rep["run"]["job_name"] = evil
    rep["run"]["steps"] = [{"step_id": evil, "start": rep["run"]["start"], "end": None},
                           {"step_id": "1", "start": rep["run"]["start"] + 5, "end": None}]
    with open(os.path.join(d, "report.json"), "w") as f:
        json.dump(rep, f)
    for out in (render_text(rep, color=False, run_dir=d),
                subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "report", d],
                               capture_output=True, text=True, check=True).stdout):
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", out), repr(out)
        assert r"train\x1b]0;owned\x07\x1b[2J\x0aReveal report" in out
        assert out.count("Reveal report") == 1 + out.count(r"\x0aReveal report")


def test_slurm_summary_escapes_user_strings(tmp_path):
    from reveal_plugins.slurm.sink import render_summary
    meta = make_run(str(tmp_path / "run"))
    rep = make_report(meta)
    rep["run"]["steps"] = [{"step_id": "0\x1b[2J\rfake", "start": rep["run"]["start"],
                            "end": rep["run"]["end"]}]
    out = render_summary(rep)
    assert "\x1b" not in out and "\r" not in out and r"0\x1b[2J\x0dfake" in out


def test_what_was_seen_and_let_go_is_listed_with_its_reason(report_run):
    """"No anomalies" next to a run that slowed down leaves a person guessing: the summary
    lists the strongest observations with what explains them in a few words (the HTML gives
    the full sentence), at most three, the others counted."""
    from reveal_plugins.report.html import render_html
    d, rep = report_run
    t0 = rep["run"]["start"]
    ev = [{"channel": "storage.run.write_bytes", "deviation": 9.0, "baseline": 0.0,
           "observed": 35e6, "unit": "bytes/s"}]
    rep["observations"] = [
        {"start": t0 + 20, "end": t0 + 30, "subsystem": "storage", "score": 9.0, "evidence": ev,
         "reason": "own_io", "why_not_anomaly": "the run's own I/O explains it: a checkpoint"},
        {"start": t0 + 1, "end": t0 + 8, "subsystem": "cpu", "score": 7.0, "evidence": [],
         "reason": "edge", "why_not_anomaly": "contiguous with the start-up or teardown"},
        {"start": t0 + 100, "end": t0 + 104, "subsystem": "network", "score": 8.0,
         "evidence": [], "reason": "brief", "why_not_anomaly": "brief: 4 s of evidence"},
        {"start": t0 + 50, "end": t0 + 52, "subsystem": "memory", "score": 1.0,
         "evidence": [], "reason": "own_activity", "why_not_anomaly": "activity changed"},
    ]
    out = render_text(rep, color=False, run_dir=d)
    part = out[out.index("Seen, not anomalies (4)"):]
    lines = part.splitlines()[1:5]
    assert "+0:01 → +0:08" in lines[0] and "start-up or teardown" in lines[0]
    assert "+0:20 → +0:30" in lines[1] and "own I/O phase" in lines[1]
    assert "storage.run.write_bytes 0 MB/s → 35.0 MB/s" in lines[1]
    assert "+1:40 → +1:44" in lines[2] and "too brief" in lines[2]
    assert "1 more" in lines[3] and "activity" not in part.split("1 more")[0]
    html = render_html(rep, d)
    assert "Seen, not anomalies (4)" in html
    assert "the run&#x27;s own I/O explains it: a checkpoint" in html
    assert len(out.splitlines()) < 60
