"""A neighbour that was there before the job (issue 21, item 1), on real recordings: a 45-s
single-threaded job under ``reveal record`` with two busy-loop hogs started *before* it.  The
run's own median is then the neighbour, so only the absolute part of the foreign-load bar can
find it; the report must say it was present from the start.  The same job without hogs stays
clean.  This machine is shared: the CPU of other people's processes during a recording is
measured from /proc, and a clean run that had such a neighbour is recorded again (then skipped).
~1 min per recording."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks", "detection"))
from neighbour import SCENARIOS, cpu_neighbours, record, verdict  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(600)
# 15 s of hog from the start (10 s of it inside the warm-up) was missed twice in a clean-clone
# CI run (found in earlier runs): an open detection gap of issue 21, not asserted until fixed.
@pytest.mark.parametrize("hog_s", [15, 35])
def test_neighbour_present_from_the_start_is_found(tmp_path, hog_s, report_schema_validate):
    """Two hogs on the 2-core node for the first 15 s (the issue's case: the grace takes 10 s
    of them) or 35 s (the run's median *is* the neighbour): a CPU anomaly, present from the
    start, and the report says so."""
    for attempt in range(2):
        rep, others, log = record(str(tmp_path / f"run{attempt}"), hog_s)
        report_schema_validate(rep)
        found = cpu_neighbours(rep)
        if found or attempt:
            break
    assert found, (log[-3000:], others)
    a = found[0]
    assert a["subsystem"] == "cpu", a
    assert a["start"] - rep["run"]["start"] <= 16, a
    assert a["foreign"].get("since_start") and any(
        f.get("since_start") for f in a["foreign"]["support"]), a["foreign"]
    assert "present from the start of the run" in json.dumps(a["hints"]), a["hints"]
    assert "present from the start" in " ".join(log.split()), log[-3000:]   # the summary


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
