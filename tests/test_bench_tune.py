"""The dev tuning of the pipeline references (``benchmarks/detection/tune.py``): it reads dev
recordings only, and picks each threshold by the stated rule."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks", "detection"))
import scoring  # noqa: E402
import tune  # noqa: E402


def _run(root, name, split):
    d = root / name
    d.mkdir()
    (d / "labels.json").write_text(json.dumps({"scenario": {"name": name, "split": split,
                                                            "inject": []}, "injections": []}))


def test_a_test_split_run_is_refused_not_skipped(tmp_path):
    _run(tmp_path, "dev-00-single", "dev")
    _run(tmp_path, "test-00-single", "test")
    with pytest.raises(SystemExit, match="test-00-single.*'test' run"):
        tune.dev_runs(str(tmp_path))


def test_no_recordings_is_an_error_naming_the_directory(tmp_path):
    with pytest.raises(SystemExit, match=str(tmp_path)):
        tune.dev_runs(str(tmp_path))


def test_best_f1_wins_then_fewer_false_events_then_nearest_default():
    row = lambda th, f1, fe: {"threshold": th, "f1": f1, "false_events_total": fe}  # noqa: E731
    assert tune.choose([row(2, 0.5, 0), row(6, 0.9, 3), row(8, 0.7, 0)], 4.0) == 6
    assert tune.choose([row(3, 0.9, 2), row(6, 0.898, 1)], 4.0) == 6
    assert tune.choose([row(3, 0.9, 1), row(6, 0.9, 1), row(4.5, 0.9, 1)], 4.0) == 4.5


def test_missing_thresholds_file_means_the_pipelines_own(tmp_path):
    assert scoring.load_thresholds(str(tmp_path / "none.json")) == {}
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"thresholds": {"pca": 5, "iforest": 3.5}}))
    assert scoring.load_thresholds(str(p)) == {"pca": 5.0, "iforest": 3.5}
