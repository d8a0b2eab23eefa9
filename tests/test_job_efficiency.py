"""Issue 26, item 2: the job's own efficiency beside the node's figures, seff/jobstats style:
cores used vs allocated, peak memory vs the limit, plain notes -- in report.json, the text
report, the HTML page, the Slurm summary and the OTel root span."""
import json
import os
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "reveal_plugins.cli"]
BUSY = "import time\nt=time.time()\nx=bytearray(64<<20)\nwhile time.time()-t<14: pass"


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eff") / "run"
    r = subprocess.run(CLI + ["record", "--out", str(out), "--", sys.executable, "-c", BUSY],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return out, r.stdout + r.stderr


def test_a_single_threaded_job_uses_one_core_of_the_node(busy_run, report_schema_validate):
    out, log = busy_run
    rep = report_schema_validate(json.load(open(out / "report.json")))
    cpu, mem = rep["efficiency"]["cpu"], rep["efficiency"]["memory"]
    assert 0.75 <= cpu["cores_used_mean"] <= 1.1, cpu
    assert cpu["cores_allocated"] == os.cpu_count() and "whole node" in cpu["allocated_from"]
    assert 64 << 20 <= mem["peak_bytes"] < 1 << 30, mem
    assert "Job efficiency" in log and "cores used on average" in log, log[-2000:]


def test_a_serial_job_given_eight_cores_gets_a_plain_note(busy_run, tmp_path,
                                                         report_schema_validate):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(busy_run[0], run)
    meta = json.load(open(run / "meta.json"))
    meta["run"].setdefault("extra", {})["cpus_on_node"] = "8"   # what the Prolog records
    json.dump(meta, open(run / "meta.json", "w"))
    r = subprocess.run(CLI + ["analyze", str(run), "--no-publish"], capture_output=True,
                       text=True, timeout=120)
    rep = report_schema_validate(json.load(open(run / "report.json")))
    eff = rep["efficiency"]
    assert eff["cpu"]["cores_allocated"] == 8 and "Slurm" in eff["cpu"]["allocated_from"]
    assert any("of 8 cores" in n and "serial" in n for n in eff["notes"]), eff["notes"]
    # every reader shows it
    from reveal_plugins.otel.trace import root_attributes
    from reveal_plugins.report.html import _efficiency
    from reveal_plugins.slurm.sink import render_summary
    attrs = root_attributes(rep, meta)
    assert attrs["reveal.job.cpu.cores_allocated"] == 8
    assert any("of 8 cores" in n for n in attrs["reveal.job.efficiency_notes"])
    assert "of 8 cores" in render_summary(rep)
    assert "Job efficiency" in _efficiency(rep) and "of 8 cores" in _efficiency(rep)
    assert r.returncode == 0
