"""A neighbour on the node (issue 21, item 1), on real recordings: a 45-s single-threaded job
under ``reveal record`` with two busy-loop hogs started *before* it or in its middle
(``benchmarks/detection/neighbour.py`` records the same scenarios repeatedly).  With hogs there
first, the run's own median is the neighbour, so only the absolute part of the foreign-load bar
can find it; the report must say it was present from the start.  The same job without hogs
stays clean.  This machine is shared: the CPU of other people's processes during a recording is
measured from /proc, and a clean run that had such a neighbour is recorded again (then skipped).
~1 min per recording."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks", "detection"))
from neighbour import SCENARIOS, cpu_neighbours, record, verdict  # noqa: E402


# records real telemetry: not while a benchmark or another such test records
pytestmark = pytest.mark.usefixtures("quiet_machine")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["start15", "start35", "mid15"])
def test_neighbour_is_found(tmp_path, scenario, report_schema_validate):
    """Two hogs on the 2-core node: for the first 15 s (10 of them in the start-up grace) or
    35 s (the run's median *is* the neighbour) of the job, or from +15 s to +30 s (the
    issue's plain-tools case): a CPU anomaly; the two that were there first are "present from
    the start", in the report and in the summary."""
    rep, others, log = record(str(tmp_path / "run"), *SCENARIOS[scenario])
    report_schema_validate(rep)
    v = verdict(scenario, rep, log)
    assert v["ok"], (v, log[-3000:], others)
    a = cpu_neighbours(rep)[0]
    if scenario.startswith("start"):
        assert a["start"] - rep["run"]["start"] <= 16, a
        assert any(f.get("since_start") for f in a["foreign"]["support"]), a["foreign"]
        assert "present from the start of the run" in json.dumps(a["hints"]), a["hints"]
    else:
        assert not a["foreign"].get("since_start"), a["foreign"]
        assert 8 <= a["start"] - rep["run"]["start"] <= 22, a


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_clean_busy_job_has_no_anomaly(tmp_path, report_schema_validate):
    """The same job alone: no anomaly (no neighbour of its own making, no false absolute
    finding from the agent or the kernel)."""
    for attempt in range(2):
        rep, others, log = record(str(tmp_path / f"run{attempt}"))
        report_schema_validate(rep)
        if others < 0.2:
            break
    else:
        pytest.skip(f"other processes used {others:.2f} cores during both recordings: "
                    "not a clean run on this shared machine")
    assert rep["anomalies"] == [], (log[-3000:], others)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_file_storm_neighbour_is_storage(tmp_path, report_schema_validate):
    """Issue 21 (attribution): a create/write/stat/rename/unlink storm
    (``benchmarks/detection/injectors.py metadata``) from +15 s to +32 s of the job.  Nothing
    reaches the disk and its CPU is mostly kernel time; the file pages it dirtied and deleted
    (``/proc/vmstat nr_dirtied`` minus the run's own ``write_bytes``) name it ``storage``."""
    inj = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "benchmarks", "detection", "injectors.py")
    storm = [sys.executable, inj, "metadata", "17", "--dir", str(tmp_path)]
    rep, others, log = record(str(tmp_path / "run"), 15.0, 17.0, hog_cmds=[storm])
    report_schema_validate(rep)
    found = [a for a in rep["anomalies"]
             if "storage.foreign.dirtied_bytes" in
             [f["channel"] for f in (a.get("foreign") or {}).get("support", [])]]
    assert found, (rep["anomalies"], log[-3000:], others)
    assert found[0]["subsystem"] == "storage", found[0]
    assert 8 <= found[0]["start"] - rep["run"]["start"] <= 22, found[0]
