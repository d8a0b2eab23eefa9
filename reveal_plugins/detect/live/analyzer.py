"""Live mode: cheap detection on a recent horizon while the run goes on.

The agent creates one :class:`LiveAnalyzer` per run registered with live mode and calls
:meth:`LiveAnalyzer.update` every ~2 s with the raw rows since the previous call.  Each new
3-s window (1-s stride) is compared with the run's own recent normal windows (robust level and
spread, with the same practical floors as the batch analysis); a finding is returned once
``min_windows`` consecutive windows deviate *and* show a symptom (pressure, stall, loss,
throttling).  A finding is reported once; the next one can only start after the signals have
been back to normal for ``gap_s``.  Cost per call: one pass over the horizon (default 120 s).
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Sequence

import numpy as np

from ...types import ChannelMeta
from ..evidence import attribution as attr
from ..evidence import foreign as fl
from ..config import LiveConfig
from ..batch.features import channel_floors, rel_floors, robust_center_scale
from ..batch.prepare import PER_CORE, add_derived, to_rates
from ..batch.windows import sliding_windows

log = logging.getLogger(__name__)

#: The documented defaults (:class:`~reveal_plugins.detect.config.LiveConfig`, ``[detect.live]``).
LIVE_DEFAULTS: dict[str, Any] = LiveConfig().model_dump(exclude={"peers"})


class LiveAnalyzer:
    """Incremental detector for one run (see module docstring)."""

    def __init__(self, channels: Sequence[ChannelMeta], interval_s: float,
                 config: dict | None = None):
        live_cfg = (config or {}).get("live") if isinstance(config, dict) else None
        if isinstance(live_cfg, LiveConfig):
            settings = live_cfg
        else:   # a bad or unknown key is an error naming it (the agent then logs it)
            settings = LiveConfig.model_validate(live_cfg or {})
        cfg = {k: float(v) for k, v in settings.model_dump(exclude={"peers"}).items()}
        self.cfg = cfg
        self.metas = list(channels)
        self.interval_s = float(interval_s) if interval_s and interval_s > 0 else 1.0
        cap = int((cfg["horizon_s"] + 2 * cfg["window_s"]) / self.interval_s) + 8
        self._cap = max(cap, 64)
        self._t = np.zeros(0)
        self._X: np.ndarray | None = None      # rates + derived metrics of the horizon
        self._last_raw: np.ndarray | None = None
        self._t_first: float | None = None
        self._last_end = -np.inf          # end of the newest window already judged
        self._flagged: dict[float, np.ndarray] = {}   # window start -> deviations
        self._run: list[float] = []       # starts of the current run of flagged windows
        self._other: list[float] = []     # ...of those pointing at another subsystem
        self._active_until = -np.inf      # an emitted finding is still going on until then
        self._active: dict | None = None
        self._n = 0
        self._names: list[str] | None = None
        self._floors: np.ndarray | None = None

    # -- public --------------------------------------------------------------------------

    def update(self, t: np.ndarray, rows: np.ndarray) -> list[dict]:
        """Add raw rows (counters cumulative); return NEW findings (schema anomaly dicts)."""
        try:
            return self._update(np.asarray(t, dtype=np.float64),
                                np.asarray(rows, dtype=np.float64).reshape(len(t), -1))
        except Exception as e:  # live mode must never break the agent
            log.warning("live analysis failed: %s: %s", type(e).__name__, e)
            return []

    def horizon(self) -> tuple[np.ndarray, np.ndarray, list[str], list[str]] | None:
        """The prepared samples held (rates and derived metrics of the last ``horizon_s``),
        with their names and units; None before the first update.  The live peer comparison
        (:mod:`reveal_plugins.detect.live.peers`) publishes them."""
        names = getattr(self, "_h_names", None)
        if self._X is None or names is None or not len(self._t):
            return None
        return self._t, self._X, names, self._h_units

    # -- internals -----------------------------------------------------------------------

    def _update(self, t: np.ndarray, rows: np.ndarray) -> list[dict]:
        if len(t) == 0:
            return []
        if rows.shape[1] != len(self.metas):
            raise ValueError(f"rows have {rows.shape[1]} columns, expected {len(self.metas)}")
        if self._t_first is None:
            self._t_first = float(t[0])
        keep = t > (self._t[-1] if len(self._t) else -np.inf)
        t, rows = t[keep], rows[keep]
        if len(t) == 0:
            return []
        # Rates (and derived metrics) only for the new rows, from the previous raw row.
        if self._last_raw is not None:
            tt = np.concatenate([[self._t[-1]], t])
            rr = np.vstack([self._last_raw[None, :], rows])
        else:
            tt, rr = t, rows
        Xn, names, units, _, _ = to_rates(tt, rr, self.metas, self.interval_s)
        Xn, names, units = add_derived(Xn, names, units, tt)
        self._h_names, self._h_units = names, units
        if self._last_raw is not None:
            Xn = Xn[1:]
        self._last_raw = rows[-1].copy()
        if self._X is None or self._X.shape[1] != Xn.shape[1]:
            self._X = np.zeros((0, Xn.shape[1]), np.float32)
            self._t = self._t[:0]
        self._t = np.concatenate([self._t, t])[-self._cap:]
        self._X = np.concatenate([self._X, Xn])[-self._cap:]
        X = self._X
        cfg = self.cfg
        now = float(self._t[-1])
        if now - self._t_first < cfg["skip_s"] + cfg["min_reference"] + cfg["ref_gap_s"]:
            return []
        if self._names != names:
            self._names, self._floors = names, channel_floors(names, units)
            self._rels = rel_floors(units)
            self._units = units
            self._mask = attr.symptom_mask(names)
            self._job_share = np.array([bool(attr.JOB_SHARE.match(n)) for n in names])
            self._per_core = np.array([bool(PER_CORE.match(n)) for n in names], bool)
        # Windows on a grid anchored at the run's first sample, so starts are stable.
        stride = cfg["stride_s"]
        t0 = self._t_first + stride * np.ceil((self._t[0] - self._t_first) / stride)
        win = sliding_windows(self._t, X, cfg["window_s"], stride, self.interval_s, t0=t0,
                              stats=("mean",))
        if len(win) == 0:
            return []
        means = win.stats["mean"].astype(np.float64)
        ref = (win.valid & (win.start >= self._t_first + cfg["skip_s"])
               & (win.end <= now - cfg["ref_gap_s"])
               & ~np.isin(np.round(win.start, 3), list(self._flagged)))
        if ref.sum() < cfg["min_reference"]:
            return []
        center, scale = robust_center_scale(means[ref], self._floors, self._rels)
        self._fam = fl.family(means, self._names, ref, win.start, cfg["min_deviation"])
        fex = self._fam.excess
        new = (win.valid & (win.end > self._last_end + 1e-9) & (win.end <= now + 1e-9)
               & ~ref & (win.start >= self._t_first + cfg["skip_s"]))
        if self._last_end == -np.inf:   # first judgement: only what follows the reference
            new &= win.start > float(win.start[ref].max())
        out: list[dict] = []
        for i in np.nonzero(new)[0]:
            self._last_end = float(win.end[i])
            dev = np.nan_to_num((means[i] - center) / scale)
            dev[self._per_core] = 0.0
            a = np.abs(dev)
            top = np.sort(a)[-2:].mean() if len(a) >= 2 else float(a.max(initial=0))
            strength = attr.symptom_strength(dev, means[i], center, self._mask,
                                             cfg["min_deviation"])
            # the job's own CPU share dropping alone is too ambiguous on a 2-s decision
            harmful = bool(np.any((strength > 0) & ~self._job_share))
            # a process outside the run taking CPU, memory or I/O is evidence of its own
            f_ex = float(fex[i].max(initial=0.0)) if fex.shape[1] else 0.0
            if f_ex >= 1.0:
                harmful = True
                top = max(top, f_ex * cfg["threshold"])
            # a symptom well past its practical minimum counts as that many min_deviations
            top = max(top, float(strength.max(initial=0.0)) * cfg["min_deviation"])
            key = round(float(win.start[i]), 3)
            if top >= cfg["threshold"] and harmful:
                self._flagged[key] = dev
                self._run.append(key)
                self._active_until = float(win.end[i]) + cfg["gap_s"]
                if self._active is None and len(self._run) >= cfg["min_windows"]:
                    out += self._finding(win, means, center, scale, float(win.mid[i]))
                elif self._active is not None:
                    # a different subsystem taking over while flags go on is a new finding
                    hits = strength > 0
                    sub, _ = attr.choose_subsystem(dev, self._names, hits)
                    hit_subs = {attr.subsystem_of(self._names[j]) for j in np.nonzero(hits)[0]
                                if not attr.JOB_SHARE.match(self._names[j])}
                    # only when the new side has symptoms of its own
                    moved = sub != self._active["subsystem"] and sub in hit_subs
                    self._other = self._other + [key] if moved else []
                    if len(self._other) >= 2 * cfg["min_windows"]:
                        self._run, self._other = list(self._other), []
                        out += self._finding(win, means, center, scale, float(win.mid[i]))
            else:
                self._run = []
                self._other = []
                if self._active is not None and float(win.end[i]) > self._active_until:
                    self._active = None
        # forget flags that left the horizon
        lo = float(self._t[0]) - cfg["window_s"]
        self._flagged = {k: v for k, v in self._flagged.items() if k >= lo}
        return out

    def _finding(self, win, means, center, scale, mid_last: float) -> list[dict]:
        """The finding of the flagged windows in ``self._run`` (one), or none when the run's
        own I/O explains them (the job-end analysis's rule, :func:`attribution.own_io`)."""
        from ..pipeline import hints_for

        starts = self._run
        rows = np.isin(np.round(win.start, 3), starts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # all-NaN columns stay NaN
            observed = np.nanmean(means[rows], axis=0)
        dev = attr.deviations(observed, center, scale)
        dev[self._per_core] = 0.0
        names, units = self._names, self._units
        hits = attr.symptom_hits(dev, observed, center, self._mask, self.cfg["min_deviation"])
        sub, scores = attr.choose_subsystem(dev, names, hits)
        idx = np.nonzero(rows)[0]
        fsup = self._fam.support(idx)
        # the job-end analysis's rule (stages.judge): by each family's share of the span
        fsub = fl.subsystem(fsup, self._fam.share(idx), [names[j] for j in np.nonzero(hits)[0]])
        if fsub:
            sub = fsub
        if not fsup and attr.own_io(dev, observed, center, names, hits,
                                    self.cfg["min_deviation"]):
            return []
        ev = attr.evidence(dev, observed, center, names, units, prefer=sub, hits=hits)
        stride = self.cfg["stride_s"]
        start = float(starts[0]) + self.cfg["window_s"] / 2 - stride / 2
        self._n += 1
        an = {"id": f"L{self._n}", "start": start, "end": mid_last + stride / 2,
              "node": None, "step_id": None, "subsystem": sub,
              "score": round(float(np.mean(np.sort(np.abs(dev))[-2:])), 2), "evidence": ev,
              "hints": [], "live": True, "detected_at": float(self._t[-1]),
              "subsystem_scores": {k: round(v, 3) for k, v in scores.items()},
              "symptoms": [names[i] for i in attr.symptoms(
                  dev, names, self.cfg["min_deviation"], observed, center)][:6]}
        if fsup:
            an["foreign"] = {"support": fsup}
        chans = {names[i]: {"baseline": attr.num(center[i]), "observed": attr.num(observed[i]),
                            "deviation": round(float(dev[i]), 2), "unit": units[i]}
                 for i in range(len(names))}
        an["hints"] = hints_for(an, {"channels": chans, "meta": {}, "impact": None, "facts": {},
                                     "foreign": an.get("foreign")})
        self._active = an
        return [an]
