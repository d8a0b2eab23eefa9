"""The unsupervised model of one run: which channels are modelled, the robust scaler, the
detectors fitted on the core of the run, and the fused score of any window.

One owner for both paths: :func:`~reveal_plugins.detect.batch.stages.model_stage` (a run in memory) fits on all its
windows and scores them at once; :mod:`~reveal_plugins.detect.longrun.bounded` fits on a sample of stored windows and scores
the rest chunk by chunk.  Both call :func:`choose_modelled`, :func:`fit_model` and
:meth:`Model.score`, so their detections cannot drift apart.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ..evidence import attribution as attr
from .detectors import builtin_detectors, fuse, norm_params
from .features import feature_floors, fit_scaler
from .prune import prune
from .windows import STATS
from ..config import DetectConfig

log = logging.getLogger(__name__)

#: The note of a run no detector could score (every one failed): nothing was judged.
NO_DETECTOR = "no detector ran: every detector failed"

#: The note of a run where nothing varies.
NOTHING_VARIES = ("every channel is constant, empty or all-zero: nothing varies, so there is "
                  "nothing to detect within the run")


def detectors(cfg: DetectConfig) -> list:
    """The detectors of every ``reveal_detectors`` plugin (the built-ins when none answers);
    plugins receive the settings as a plain dict (the hook's public contract)."""
    try:
        from ...hooks.manager import hook

        dets = [d for lst in hook().reveal_detectors(config=cfg.as_dict())
                for d in (lst or [])]
    except Exception as e:  # plugin manager unusable: keep the built-ins
        log.warning("detector plugins unavailable (%s); using built-ins", e)
        dets = []
    return dets or builtin_detectors(cfg.as_dict())


def choose_modelled(Md: np.ndarray, det_cols: np.ndarray, names: list[str],
                    floors: np.ndarray, rels: np.ndarray, cfg: DetectConfig
                    ) -> tuple[np.ndarray, int]:
    """The channels the detectors model, from the window means ``Md`` (fit windows x
    ``det_cols``): redundant channels pruned, symptom channels kept first as representatives,
    then the channel that moves most.  Returns the columns and how many were pruned."""
    c0, s0 = attr.reference(Md, np.ones(len(Md), bool), floors[det_cols], rels[det_cols])
    with np.errstate(invalid="ignore"):
        reach = np.nan_to_num(np.nanmax(np.abs((Md - c0) / s0), axis=0, initial=0.0))
    sym = attr.symptom_mask([names[i] for i in det_cols])[0]
    prio = np.log1p(np.minimum(reach, 1e6)) + 100.0 * sym
    kept, rep = prune(Md, [names[i] for i in det_cols], cfg.prune_threshold, prio)
    return det_cols[kept], len(rep)


@dataclass
class Model:
    """Fitted scaler and detectors; :meth:`score` gives the fused score of feature rows."""

    mcols: np.ndarray
    scaler: object
    dets: list = field(default_factory=list)
    norms: list = field(default_factory=list)      # norm_params of each on the core
    names: list = field(default_factory=list)

    def score(self, F: np.ndarray) -> np.ndarray:
        """Median of the detectors' scores in robust-sigma units of their core scores."""
        if len(F) == 0:
            return np.zeros(0)
        Z = self.scaler.transform(F)
        return fuse([np.zeros(len(F)) if p is None else
                     (np.asarray(d.score_samples(Z), np.float64) - p[0]) / p[1]
                     for d, p in zip(self.dets, self.norms)])


def fit_model(F: np.ndarray, mcols: np.ndarray, floors: np.ndarray, rels: np.ndarray,
              window_s: float, cfg: DetectConfig, notes: list[str]) -> Model | None:
    """Fit on the feature rows ``F`` of the windows the detectors may learn from.

    The fit is on the core of those windows: the ones nearest the centre by feature norm.  An
    anomaly covering a good part of the run would otherwise be learnt as normal (a principal
    component, a dense region for the forest).  The scaler is refitted on the core too, so a
    long anomaly does not inflate the spreads it is measured in.  None (with a note) when no
    detector could be fitted."""
    wide = np.array([s != "mean" for s in STATS] * len(mcols))
    ffl = feature_floors(floors[mcols], window_s)
    frel = np.repeat(rels[mcols], len(STATS))
    every = np.ones(len(F), bool)
    scaler = fit_scaler(F, ffl, every, frel, wide)
    Z = scaler.transform(F)
    core = every
    for _ in range(2):
        norm = np.sqrt((Z.astype(np.float64) ** 2).sum(axis=1))
        core = norm <= np.quantile(norm, cfg.core_quantile)
        if core.sum() < 10:
            core = every
            break
        scaler = fit_scaler(F, ffl, core, frel, wide)
        Z = scaler.transform(F)
    model = Model(mcols, scaler)
    for d in detectors(cfg):
        try:
            d.fit(Z[core])
            s = np.asarray(d.score_samples(Z[core]), dtype=np.float64)
            p = norm_params(s, float(getattr(d, "score_floor", 1e-6)))
            model.dets.append(d)
            model.norms.append(p)
            model.names.append(getattr(d, "name", type(d).__name__))
        except Exception as e:  # one broken detector must not cost the analysis
            notes.append(f"detector {getattr(d, 'name', d)!r} failed: {type(e).__name__}: {e}")
    if not model.dets:
        notes.append(NO_DETECTOR)
        return None
    return model
