"""The quiet lock the real-recording detection tests hold: another process (a benchmark taking
it with ``flock``) cannot take it meanwhile, and can once the test is done."""
import subprocess
import sys

TRY = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(3)
"""


def _other_takes(path: str) -> int:
    return subprocess.run([sys.executable, "-c", TRY, path], timeout=30).returncode


def test_a_benchmark_cannot_take_the_lock_while_a_recording_test_holds_it(tmp_path):
    from fixtures_quiet import hold_quiet_lock
    with hold_quiet_lock(str(tmp_path / "quiet.lock")) as path:
        assert _other_takes(path) == 3
    assert _other_takes(path) == 0


def test_the_recording_tests_hold_it(quiet_machine):
    assert _other_takes(quiet_machine) == 3
