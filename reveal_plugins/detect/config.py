"""The one typed, validated detection configuration (pydantic).

``analyze(run_dir, config)``, the ``reveal_analyze`` hook's ``config["detect"]`` and the
baseline/live helpers all go through :func:`detect_config`: a bad value is an error naming the
key and the value, an unknown key is refused (with the valid ones listed), so a typo never
silently leaves a default in force.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class LivePeersConfig(BaseModel):
    """``[detect.live.peers]``: live comparison of a multi-node job's nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="compare a multi-node job's nodes while it runs")
    max_peers: int = Field(16, ge=1, le=4096, description="peers compared with (the nearest "
                           "in host order)")
    stale_s: float = Field(10.0, gt=0, description="a peer's file older than this is left out")
    gap_s: float = Field(10.0, ge=0, description="the same node and subsystem are named again "
                         "only after this")
    horizon_s: float = Field(120.0, gt=0, description="what is published (and compared)")


class LiveConfig(BaseModel):
    """``[detect.live]``: the agent's live detection while a run goes on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    horizon_s: float = Field(120.0, gt=0, description="history kept (the reference comes "
                             "from it)")
    window_s: float = Field(3.0, gt=0, le=3600, description="window length")
    stride_s: float = Field(1.0, gt=0, le=3600, description="window stride")
    skip_s: float = Field(15.0, ge=0, description="start-up of the run (imports, data "
                          "loading) is not a reference")
    ref_gap_s: float = Field(6.0, ge=0, description="the newest seconds are never part of "
                             "the reference")
    min_reference: int = Field(15, ge=1, description="reference windows needed before "
                               "anything is flagged")
    threshold: float = Field(7.0, gt=0, description="top-2 mean |deviation| of a window")
    min_deviation: float = Field(4.0, gt=0, description="a symptom channel must move this far "
                                 "(harmful direction)")
    min_windows: int = Field(2, ge=1, description="consecutive flagged windows for a finding")
    gap_s: float = Field(10.0, ge=0, description="normal time that ends a finding")
    peers: LivePeersConfig = Field(default_factory=LivePeersConfig)


class PeersConfig(BaseModel):
    """``[detect.peers]``: a multi-node job's nodes compared with each other at job end."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_s: float = Field(3.0, gt=0, le=3600, description="window length")
    stride_s: float = Field(1.0, gt=0, le=3600, description="window stride")
    threshold: float = Field(4.0, ge=0, description="robust z of a symptom against the peers")
    min_z: float = Field(3.0, ge=0, description="smallest z a channel needs to count at all")
    own_fraction: float = Field(0.5, ge=0, description="the node's own change must explain "
                                "this share of the residual")
    min_fraction: float = Field(1.0, ge=0, description="x the symptoms' practical minimum")
    min_windows: int = Field(5, ge=1, description="flagged windows a suspect needs")
    gap_s: float = Field(3.0, ge=0, description="flagged windows closer than this merge")
    symptom_windows: int = Field(5, ge=1, description="windows needed when no cause on the "
                                 "node itself is in evidence")
    warmup_s: float = Field(10.0, ge=0, description="start of the run not compared")
    cooldown_s: float = Field(3.0, ge=0, description="end of the run not compared")
    max_share: float = Field(0.34, ge=0, description="more nodes than this flagged at once: "
                             "not one node's problem")
    min_slowdown_pct: float = Field(10.0, ge=0, description="symptoms alone, with iteration "
                                    "markers: the job must have slowed this much")


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
    baseline_threshold: float = Field(6.0, gt=0, description="a window this far (mean of its "
                                      "two largest robust z) from a cross-run baseline is "
                                      "flagged")
    max_anomalies: int = Field(50, ge=1, description="anomalies kept in a report (highest "
                               "scores first)")
    core_quantile: float = Field(0.6, gt=0, le=1, description="detectors are fitted on this "
                                 "central share of the windows")
    require_symptom: bool = Field(True, description="an event needs an evidence family "
                                  "(symptom, foreign load, impact, baseline)")
    foreign_z: float = Field(4.0, gt=0, description="foreign load above its normal level by "
                             "this many robust spreads")
    min_slowdown_pct: float = Field(10.0, ge=0, description="least iteration slowdown that "
                                    "counts as impact")
    min_anomaly_s: float = Field(10.0, ge=0, description="evidence shorter than this is an "
                                 "observation unless the iterations slowed (short-lived "
                                 "system work is no anomaly)")
    recurring_min_bursts: int = Field(3, ge=2, description="brief anomalies of one "
                                      "subsystem that come back at least this often (each "
                                      "within 3 x min_anomaly_s of the last) are one anomaly")
    recurring_min_duty: float = Field(0.25, gt=0, le=1, description="such bursts are joined "
                                      "only when together they last min_anomaly_s and fill "
                                      "at least this share of their span (a cron job's "
                                      "seconds a minute do not)")
    stream_after_s: float = Field(3600.0, ge=0, description="runs longer than this are "
                                  "analysed from their feature store in bounded memory")
    fit_windows: int = Field(6000, ge=100, description="a streamed analysis fits its "
                             "detectors on at most this many windows (every k-th)")
    full: bool = Field(False, description="recompute the features from the raw segments "
                       "(reveal analyze --full)")
    detectors: dict[str, dict[str, Any]] = Field(default_factory=dict, description=
                                                 "per-detector keyword arguments")
    live: LiveConfig = Field(default_factory=LiveConfig, description="[detect.live]")
    peers: PeersConfig = Field(default_factory=PeersConfig, description="[detect.peers]")

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
        ``config["detectors"][name]``, where :func:`~reveal_plugins.detect.batch.detectors.builtin_detectors` and site
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


def site_detect(environ: Any = None) -> tuple[DetectConfig, str | None]:
    """The ``[detect]`` table of the site configuration (:mod:`reveal_plugins.site_config`)
    and the file it came from; a bad or unknown key is a ValueError naming file, table, key
    and value."""
    from .. import site_config
    return site_config.table("detect", DetectConfig, environ=environ)


def with_site_defaults(config: dict[str, Any], environ: Any = None) -> dict[str, Any]:
    """``config`` over the keys the site's ``[detect]`` table sets (sub-tables merged key by
    key): the caller's settings win, the file's win over the defaults."""
    site, _ = site_detect(environ)
    return _merge(site.model_dump(exclude_unset=True), config)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
