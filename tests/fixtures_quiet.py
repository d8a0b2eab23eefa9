"""The machine's quiet lock for tests that record real telemetry and judge detection on it:
the lock of ``benchmarks/quiet.py``, which the recording benchmarks take too.  While a benchmark
records, or another such test runs, a recording test waits instead of measuring the other's load
as a neighbour (and the benchmark does not record the test's)."""
import importlib.util
import pathlib

import pytest

_spec = importlib.util.spec_from_file_location(
    "reveal_bench_quiet", pathlib.Path(__file__).resolve().parent.parent / "benchmarks" /
    "quiet.py")
_quiet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_quiet)
QUIET_LOCK = _quiet.QUIET_LOCK
hold_quiet_lock = _quiet.hold


@pytest.fixture
def quiet_machine():
    """Hold ``QUIET_LOCK`` for the test (bounded by the test's own timeout)."""
    with hold_quiet_lock() as path:
        yield path
