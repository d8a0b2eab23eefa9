"""What a detection run produces (:class:`Detection`) and how its judged anomalies are put into
it; shared by the in-memory pipeline and the long-run path, so neither imports the other's
internals."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config import DetectConfig


@dataclass
class Detection:
    """What :func:`detect` found, plus what the report needs to describe the analysis."""

    anomalies: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    analysis: dict = field(default_factory=dict)
    observations: list[dict] = field(default_factory=list)
    samples: int = 0
    t_first: float | None = None
    t_last: float | None = None


def set_anomalies(out, anomalies: list[dict], weak: int, cfg: DetectConfig) -> None:
    """The judged anomalies into ``out``: by time, at most ``max_anomalies`` (the strongest),
    numbered A1.., with notes on what was dismissed or cut (in-memory and streamed paths)."""
    if weak:
        out.notes.append(f"{weak} candidate window group(s) dismissed: no channel moved by "
                         f"{cfg.min_deviation:g} robust spreads (or its practical floor)")
    anomalies.sort(key=lambda x: x["start"])
    if len(anomalies) > cfg.max_anomalies:
        out.notes.append(f"{len(anomalies)} anomalies; kept the {cfg.max_anomalies} "
                         "strongest")
        anomalies = sorted(anomalies, key=lambda x: -x["score"])[:cfg.max_anomalies]
        anomalies.sort(key=lambda x: x["start"])
    for i, an in enumerate(anomalies, 1):
        an["id"] = f"A{i}"
    out.anomalies = anomalies
