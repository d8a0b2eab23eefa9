"""Issue 26, item 3: ``reveal record --out DIR`` of a directory that holds a run is refused (two
runs in one directory mixed: meta.json overwritten, events appended, the old report kept);
``--force`` removes that run's files first and nothing else."""
import json
import os
import subprocess
import sys

CLI = [sys.executable, "-m", "reveal_plugins.cli", "record"]


def _record(*args):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120)


def test_out_of_an_existing_run_is_refused_then_replaced_with_force(tmp_path):
    out = tmp_path / "run"
    r = _record("--out", str(out), "--no-analyze", "--", "sleep", "1")
    assert r.returncode == 0, r.stderr
    (out / "notes.txt").write_text("mine\n")         # not a run file: never touched
    r = _record("--out", str(out), "--", "true")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "already holds a run ('sleep 1'" in r.stderr and "--force" in r.stderr, r.stderr
    assert json.load(open(out / "meta.json"))["run"]["command"] == ["sleep", "1"]
    r = _record("--out", str(out), "--force", "--no-analyze", "--", "true")
    assert r.returncode == 0, r.stderr
    assert json.load(open(out / "meta.json"))["run"]["command"] == ["true"]
    events = [json.loads(x) for x in open(out / "events.jsonl")]
    assert sum(e["event"] == "run_start" for e in events) == 1, events
    assert not (out / "report.json").exists()
    assert (out / "notes.txt").read_text() == "mine\n"


def test_force_does_not_follow_a_symlinked_segments_dir(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.parquet").write_text("x")
    os.symlink(elsewhere, out / "segments")
    (out / "meta.json").write_text("{}")
    r = _record("--out", str(out), "--force", "--no-analyze", "--", "true")
    assert r.returncode == 0, r.stderr
    assert (elsewhere / "keep.parquet").exists()
