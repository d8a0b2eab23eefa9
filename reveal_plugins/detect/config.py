"""The one typed, validated detection configuration (pydantic).

``analyze(run_dir, config)``, the ``reveal_analyze`` hook's ``config["detect"]`` and the
baseline/live helpers all go through :func:`detect_config`: a bad value is an error naming the
key and the value, an unknown key is refused (with the valid ones listed), so a typo never
silently leaves a default in force.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class DetectConfig(BaseModel):
    """Settings of the batch pipeline (defaults in brackets are the documented ones)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_s: float = Field(3.0, gt=0, le=3600, description="window length (paper: 3 s)")
    stride_s: float = Field(1.0, gt=0, le=3600, description="window stride (paper: 1 s)")
    prune_threshold: float = Field(0.5, gt=0, le=1, description="|r| above which correlated "
                                   "channels are pruned (paper: 0.5)")
    threshold: float = Field(4.0, gt=0, description="fused score (robust sigmas of the "
                             "detectors' own scores)")
    low_fraction: float = Field(0.5, gt=0, le=1, description="neighbours of a flagged window "
                                "down to this share of it join")
    min_windows: int = Field(3, ge=1, description="flagged windows an event needs")
    gap_s: float = Field(3.0, ge=0, description="flagged windows closer than this merge")
    warmup_s: float = Field(10.0, ge=0, description="start of every run/step not flagged")
    cooldown_s: float = Field(3.0, ge=0, description="end of every run/step not flagged")
    min_deviation: float = Field(4.0, gt=0, description="an event needs a channel this far "
                                 "out (floored robust units)")
    baseline_threshold: float = Field(6.0, gt=0)
    max_anomalies: int = Field(50, ge=1)
    core_quantile: float = Field(0.6, gt=0, le=1, description="detectors are fitted on this "
                                 "central share of the windows")
    require_symptom: bool = Field(True, description="an event needs an evidence family "
                                  "(symptom, foreign load, impact, baseline)")
    foreign_z: float = Field(4.0, gt=0, description="foreign load above its normal level by "
                             "this many robust spreads")
    min_slowdown_pct: float = Field(10.0, ge=0, description="least iteration slowdown that "
                                    "counts as impact")
    stream_after_s: float = Field(3600.0, ge=0, description="runs longer than this are "
                                  "analysed from their feature store in bounded memory")
    fit_windows: int = Field(6000, ge=100, description="a streamed analysis fits its "
                             "detectors on at most this many windows (every k-th)")
    full: bool = Field(False, description="recompute the features from the raw segments "
                       "(reveal analyze --full)")
    detectors: dict[str, dict[str, Any]] = Field(default_factory=dict, description=
                                                 "per-detector keyword arguments")
    live: dict[str, Any] | None = Field(None, description="live-mode settings (detect.live)")

    @model_validator(mode="before")
    @classmethod
    def _detector_shorthand(cls, data: Any) -> Any:
        # {"iforest": {...}} at the top level is the documented shorthand for detectors=...
        if isinstance(data, dict):
            data = dict(data)
            for name in ("robust_z", "pca", "iforest"):
                if name in data:
                    data.setdefault("detectors", {})
                    data["detectors"] = {**data["detectors"], name: data.pop(name)}
        return data

    def as_dict(self) -> dict[str, Any]:
        """The plain dict the stages and the detector plugins receive
        (``reveal_detectors(config)``).  One shape: per-detector settings stay under
        ``config["detectors"][name]``, where :func:`.detectors.builtin_detectors` and site
        detectors read them (the shorthand ``{"iforest": {...}}`` is folded in on input)."""
        return self.model_dump()


#: Keys of a run-wide configuration that belong to other rooms (recording, agent, sinks).
FOREIGN_KEYS = frozenset({"interval_s", "gpus", "baseline", "otel", "slurm", "agent",
                          "record", "detect", "spool", "source"})


def detect_config(config: dict[str, Any] | DetectConfig | None,
                  ignore: frozenset[str] = frozenset()) -> DetectConfig:
    """Validate ``config``; ``ignore`` names keys owned by other parts of a shared dict."""
    if isinstance(config, DetectConfig):
        return config
    data = {k: v for k, v in (config or {}).items() if k not in ignore and v is not None}
    try:
        return DetectConfig(**data)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(x) for x in err.get("loc", ())) or "?"
        if err.get("type") == "extra_forbidden":
            valid = ", ".join(sorted(DetectConfig.model_fields))
            raise ValueError(f"detection setting {key!r}: unknown (valid: {valid})") from None
        raise ValueError(f"detection setting {key}={err.get('input')!r}: "
                         f"{err.get('msg')}") from None
