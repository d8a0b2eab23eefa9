"""One typed, validated detection configuration: a bad value names the key and the value, an
unknown key is refused with the valid ones listed, and the run-wide dict's other rooms pass."""
import pytest

from reveal_plugins.detect.config import FOREIGN_KEYS, detect_config
from reveal_plugins.detect.synth import SynthHost


def test_defaults_and_detector_shorthand():
    c = detect_config({"iforest": {"n_estimators": 50}, "threshold": "5"})
    assert c.threshold == 5.0 and c.window_s == 3.0
    assert c.as_dict()["detectors"] == {"iforest": {"n_estimators": 50}}
    assert "iforest" not in c.as_dict()     # one shape: under "detectors" only


@pytest.mark.parametrize("cfg, needle", [
    ({"window_s": 0}, "window_s=0"),
    ({"stride_s": "fast"}, "stride_s='fast'"),
    ({"min_windows": 0}, "min_windows=0"),
    ({"core_quantile": 2}, "core_quantile=2"),
    ({"thresold": 4}, "'thresold': unknown (valid: "),
])
def test_bad_settings_name_the_key(cfg, needle):
    with pytest.raises(ValueError) as e:
        detect_config(cfg, ignore=FOREIGN_KEYS)
    assert needle in str(e.value)


def test_analyze_refuses_unknown_key_but_keeps_other_rooms(tmp_path):
    from reveal_plugins.detect import analyze
    d = SynthHost(2, seed=3).write_run(str(tmp_path / "r"), 60)
    with pytest.raises(ValueError, match="thresold"):
        analyze(d, {"thresold": 3})
    rep = analyze(d, {"interval_s": 0.1, "source": "slurm", "threshold": 6})
    assert rep["analysis"]["threshold"] == 6.0


@pytest.mark.parametrize("given", [
    {"detectors": {"iforest": {"n_estimators": 7}, "robust_z": {"k": 2}}},  # docs/detection.md
    {"iforest": {"n_estimators": 7}, "robust_z": {"k": 2}},                 # the shorthand
])
def test_detector_settings_reach_the_detectors(tmp_path, monkeypatch, given):
    """Per-detector settings given through analyze()'s documented config reach the detectors
    the pipeline fits (they used to validate, then be flattened away: issue 23)."""
    from reveal_plugins.detect import analyze
    from reveal_plugins.detect.batch import detectors as dmod

    fitted = {}
    for cls in (dmod.IsolationForestDetector, dmod.RobustZDetector):
        orig = cls.fit

        def spy(self, X, _orig=orig):
            fitted[self.name] = self
            return _orig(self, X)
        monkeypatch.setattr(cls, "fit", spy)
    d = SynthHost(2, seed=3).write_run(str(tmp_path / "r"), 60)
    analyze(d, given)
    assert fitted["iforest"].n_estimators == 7
    assert fitted["robust_z"].k == 2
