"""Scoring of detections against injected intervals (recall, alarm-seconds precision, F1,
attribution accuracy, onset latency, false events per clean hour) and the single-detector
reference (one IsolationForest on raw samples)."""
from __future__ import annotations

import json
import os

import numpy as np

#: Live mode judges nothing before it has a reference (skip_s 15 + min_reference 15 + ref_gap_s
#: 6 = 36 s, plus one window): live latency is scored on injections starting later than this.
LIVE_READY_S = 40.0
SLACK_S = 5.0          # alarm seconds this close to an injected interval count as inside
OVERLAP_SLACK_S = 3.0  # an event this close to an interval "overlaps" it (recall)


def _overlap(a0, a1, b0, b1) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def score(runs: list[dict]) -> dict:
    """``runs``: [{"name", "clean": bool, "duration_s", "injections": [{"kind", "subsystem",
    "start", "end"}], "events": [{"start", "end", "subsystem"}], "live": [{"start",
    "detected_at", "subsystem"}] (optional)}]."""
    n_inj = hit = attr_ok = 0
    alarm = alarm_in = 0.0
    lat_end, lat_live = [], []
    live_hit = live_eligible = 0
    clean_s = clean_events = 0.0
    false_events = 0
    off_s = 0.0
    per_kind: dict[str, list[int]] = {}
    per_sub: dict[str, list[int]] = {}
    per_victim: dict[str, list[int]] = {}
    confusion: dict[str, dict[str, int]] = {}
    for r in runs:
        inj = r["injections"]
        evs = r["events"]
        for e in evs:
            d = max(0.0, e["end"] - e["start"])
            alarm += d
            inside = 0.0
            for i in inj:
                inside += _overlap(e["start"], e["end"], i["start"] - SLACK_S, i["end"] + SLACK_S)
            alarm_in += min(d, inside)
            if not any(_overlap(e["start"], e["end"], i["start"] - OVERLAP_SLACK_S,
                                i["end"] + OVERLAP_SLACK_S) > 0 for i in inj):
                false_events += 1
        if r.get("clean"):
            clean_s += r["duration_s"]
            clean_events += len(evs)
        off_s += max(0.0, r["duration_s"] - sum(i["end"] - i["start"] for i in inj))
        for i in inj:
            n_inj += 1
            k = per_kind.setdefault(i["kind"], [0, 0, 0])
            ks = per_sub.setdefault(i["subsystem"], [0, 0, 0])
            kv = per_victim.setdefault(r.get("victim") or "?", [0, 0, 0])
            row = confusion.setdefault(i["subsystem"], {})
            for c in (k, ks, kv):
                c[0] += 1
            ov = [(e, _overlap(e["start"], e["end"], i["start"] - OVERLAP_SLACK_S,
                               i["end"] + OVERLAP_SLACK_S)) for e in evs]
            ov = [x for x in ov if x[1] > 0]
            if ov:
                hit += 1
                best = max(ov, key=lambda x: x[1])[0]
                row[best["subsystem"]] = row.get(best["subsystem"], 0) + 1
                for c in (k, ks, kv):
                    c[1] += 1
                    c[2] += best["subsystem"] == i["subsystem"]
                if best["subsystem"] == i["subsystem"]:
                    attr_ok += 1
                lat_end.append(min(e["start"] for e, _ in ov) - i["start"])
            else:
                row["(missed)"] = row.get("(missed)", 0) + 1
            if r.get("t_start") is not None and i["start"] - r["t_start"] < LIVE_READY_S:
                continue
            live_eligible += 1
            lv = [x for x in r.get("live") or []
                  if i["start"] - OVERLAP_SLACK_S <= x["detected_at"] <= i["end"] + 10
                  and x["start"] <= i["end"] + OVERLAP_SLACK_S]
            if lv:
                live_hit += 1
                lat_live.append(min(x["detected_at"] for x in lv) - i["start"])
    recall = hit / n_inj if n_inj else float("nan")
    precision = alarm_in / alarm if alarm > 0 else (1.0 if hit == 0 else float("nan"))
    f1 = (2 * precision * recall / (precision + recall)) if precision + recall > 0 else 0.0
    return {
        "injections": n_inj, "detected": hit, "recall": recall,
        "alarm_s": round(alarm, 1), "alarm_s_inside": round(alarm_in, 1),
        "precision_alarm_s": precision, "f1": f1,
        "attribution_accuracy": attr_ok / hit if hit else float("nan"),
        "onset_latency_s_median": float(np.median(lat_end)) if lat_end else None,
        "onset_latency_s_max": float(np.max(lat_end)) if lat_end else None,
        "live_eligible": live_eligible, "live_detected": live_hit,
        "live_latency_s_median": float(np.median(lat_live)) if lat_live else None,
        "live_latency_s_max": float(np.max(lat_live)) if lat_live else None,
        "clean_hours": clean_s / 3600.0,
        "false_events_per_clean_hour": clean_events / (clean_s / 3600.0) if clean_s else None,
        "false_events_clean": int(clean_events),
        "false_events_per_clean_hour_95ub": (poisson_upper(int(clean_events)) /
                                             (clean_s / 3600.0)) if clean_s else None,
        "false_events_total": false_events,
        "false_events_per_unlabelled_hour": false_events / (off_s / 3600.0) if off_s else None,
        "per_kind": {k: {"n": v[0], "detected": v[1], "attributed": v[2]}
                     for k, v in sorted(per_kind.items())},
        "per_subsystem": {k: {"n": v[0], "detected": v[1], "attributed": v[2],
                              "recall": v[1] / v[0]} for k, v in sorted(per_sub.items())},
        "per_victim": {k: {"n": v[0], "detected": v[1], "attributed": v[2]}
                       for k, v in sorted(per_victim.items())},
        "confusion": confusion,
    }


def poisson_upper(k: int, conf: float = 0.95) -> float:
    """Two-sided ``conf`` upper bound of a Poisson mean after observing ``k`` events."""
    from scipy.stats import chi2

    return float(chi2.ppf(1 - (1 - conf) / 2, 2 * k + 2) / 2)


def _reference_matrix(run_dir: str):
    from reveal_plugins.detect.batch.prepare import prepare
    from reveal_plugins.store.store import load_run

    data = load_run(run_dir)
    fr = data.frame
    P = prepare(fr.t, fr.values, fr.channels)
    if len(P.t) < 20 or P.X.shape[1] == 0:
        return P, None
    X = P.X.astype(np.float64)
    med = np.nanmedian(X, axis=0)
    iqr = np.nanpercentile(X, 75, axis=0) - np.nanpercentile(X, 25, axis=0)
    sd = np.nanstd(X, axis=0)
    scale = np.where(iqr > 0, iqr, np.where(sd > 0, sd, 1.0))
    return P, np.nan_to_num((X - med) / scale)


def _events(P, Z, flag, min_s: float = 0.5, gap_s: float = 1.0) -> list[dict]:
    """Flagged samples merged into events; subsystem = prefix of the channel with the largest
    |z| over the event."""
    events = []
    idx = np.nonzero(flag)[0]
    if len(idx) == 0:
        return []
    groups = [[idx[0], idx[0]]]
    for i in idx[1:]:
        if P.t[i] - P.t[groups[-1][1]] <= gap_s:
            groups[-1][1] = i
        else:
            groups.append([i, i])
    for a, b in groups:
        s, e = float(P.t[a]), float(P.t[b]) + P.interval_s
        if e - s < min_s:
            continue
        z = np.abs(Z[a:b + 1]).mean(axis=0)
        sub = P.names[int(np.argmax(z))].split(".", 1)[0]
        events.append({"start": s, "end": e, "subsystem": sub})
    return events


def _mad_flag(score: np.ndarray, k: float = 5.0) -> np.ndarray:
    med = np.median(score)
    mad = 1.4826 * np.median(np.abs(score - med)) or float(np.std(score)) or 1.0
    return score > med + k * mad


def reference_detectors(run_dir: str) -> dict[str, list[dict]]:
    """The simple references, on the same recordings and the same per-sample robust-scaled
    rates/gauges: one IsolationForest (scikit-learn defaults, contamination='auto'), PCA
    reconstruction error (components for 90 % of the variance) and the distance to the
    nearest of 8 k-means centres; PCA and k-means flag scores above median + 5 MAD."""
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA
    from sklearn.ensemble import IsolationForest

    P, Z = _reference_matrix(run_dir)
    if Z is None:
        return {"iforest": [], "pca": [], "kmeans": []}
    out = {"iforest": _events(P, Z, IsolationForest(random_state=0).fit(Z).predict(Z) == -1)}
    pca = PCA(n_components=0.9, svd_solver="full").fit(Z)
    rec = pca.inverse_transform(pca.transform(Z))
    out["pca"] = _events(P, Z, _mad_flag(((Z - rec) ** 2).sum(axis=1)))
    km = KMeans(n_clusters=8, n_init=3, random_state=0).fit(Z)
    out["kmeans"] = _events(P, Z, _mad_flag(km.transform(Z).min(axis=1)))
    return out


class KMeansDetector:
    """Distance to the nearest of 8 k-means centres of the fitted windows: the partition view
    of the per-sample k-means reference, as a window detector."""

    name = "kmeans"
    score_floor = 1.0

    def __init__(self, k: int = 8):
        self.k = k

    def fit(self, X):
        from sklearn.cluster import KMeans
        self.km = KMeans(n_clusters=min(self.k, max(1, len(X))), n_init=3,
                         random_state=0).fit(X)
        return self

    def score_samples(self, X):
        return self.km.transform(X).min(axis=1)


#: The pipeline's own detectors, and k-means, each run alone inside the whole pipeline.
PIPELINE_DETECTORS = ("robust_z", "pca", "iforest", "kmeans")


def _only_detector(name: str, impl):
    """A plugin whose hook wrapper leaves the pipeline one detector: the others' results are
    dropped (or k-means used instead of all); everything else (windows, scaling, the core,
    score normalisation, threshold, events, judging) stays as it is."""
    import types

    @impl(wrapper=True)
    def reveal_detectors(config):
        lists = yield
        if name == "kmeans":
            return [[KMeansDetector()]]
        return [[d for lst in lists for d in (lst or []) if d.name == name]]

    return types.SimpleNamespace(reveal_detectors=reveal_detectors)


#: Per-detector thresholds of the pipeline references, chosen on dev by ``tune.py``.
THRESHOLDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "thresholds.json")


def load_thresholds(path: str = THRESHOLDS) -> dict[str, float]:
    """``{detector: threshold}`` tuned on dev; empty (the pipeline's own threshold for all)
    when no tuning was committed."""
    try:
        with open(path) as f:
            return {k: float(v) for k, v in json.load(f)["thresholds"].items()}
    except FileNotFoundError:
        return {}


def pipeline_events(run_dir: str, name: str | None = None,
                    threshold: float | None = None) -> dict:
    """The report of the whole pipeline on ``run_dir`` with only detector ``name`` (all of
    them when None) and the fused-score ``threshold`` (the pipeline's default when None)."""
    import pluggy

    from reveal_plugins.detect import analyze
    from reveal_plugins.hooks import PROJECT
    from reveal_plugins.hooks.manager import get_plugin_manager

    config = {"threshold": threshold} if threshold is not None else None
    if name is None:
        return analyze(run_dir, config)
    pm = get_plugin_manager()
    pm.register(_only_detector(name, pluggy.HookimplMarker(PROJECT)), name=f"bench-only-{name}")
    try:
        return analyze(run_dir, config)
    finally:
        pm.unregister(name=f"bench-only-{name}")


def pipeline_references(run_dir: str, thresholds: dict[str, float] | None = None
                        ) -> dict[str, list[dict]]:
    """Events of the whole pipeline with only one detector (``PIPELINE_DETECTORS``), on the
    same recording: what the detector contributes once windows, scaling, event grouping,
    warm-up and judging are the same for all.  Each detector's threshold is the one
    ``tune.py`` chose for it on dev (``thresholds``; the pipeline's own when absent)."""
    thresholds = load_thresholds() if thresholds is None else thresholds
    return {name: events_of(pipeline_events(run_dir, name, thresholds.get(name)))
            for name in PIPELINE_DETECTORS}


def events_of(rep: dict) -> list[dict]:
    return [{"start": a["start"], "end": a["end"], "subsystem": a["subsystem"]}
            for a in rep["anomalies"]]


def run_base(rep: dict, labels: dict) -> dict:
    """What :func:`score` needs of a run besides its events: clean or not, length, the
    injections, victim shape, split."""
    sc = labels["scenario"]
    return {"name": sc["name"], "clean": not sc["inject"],
            "duration_s": rep["run"]["end"] - rep["run"]["start"],
            "injections": labels["injections"], "victim": sc.get("victim"),
            "t_start": rep["run"]["start"], "split": sc.get("split", "test")}


def reference_iforest(run_dir: str) -> list[dict]:
    return reference_detectors(run_dir)["iforest"]


def fmt_table(ours: dict, refs: dict[str, dict]) -> str:
    rows = [("recall", "recall"), ("precision (alarm-seconds)", "precision_alarm_s"),
            ("F1", "f1"), ("attribution accuracy", "attribution_accuracy"),
            ("onset latency job-end, median s", "onset_latency_s_median"),
            ("onset latency job-end, max s", "onset_latency_s_max"),
            ("live: found / injections after its warm-up", "live_found"),
            ("onset latency live, median s", "live_latency_s_median"),
            ("onset latency live, max s", "live_latency_s_max"),
            ("clean hours", "clean_hours"),
            ("false events on clean runs", "false_events_clean"),
            ("false events per clean hour", "false_events_per_clean_hour"),
            ("  95% upper bound", "false_events_per_clean_hour_95ub"),
            ("false events (all runs, outside injections)", "false_events_total"),
            ("alarm seconds", "alarm_s")]

    def f(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    ours = dict(ours, live_found=f"{ours['live_detected']}/{ours['live_eligible']}")
    cols = [("reveal", ours)] + list(refs.items())
    out = [f"{'metric':46s}" + "".join(f"{n:>10s}" for n, _ in cols)]
    for label, k in rows:
        out.append(f"{label:46s}" + "".join(f"{f(r.get(k)):>10s}" for _, r in cols))
    out.append(f"{'injections detected':46s}" + "".join(
        f"{str(r['detected']) + '/' + str(r['injections']):>10s}" for _, r in cols))
    return "\n".join(out)


def fmt_confusion(res: dict) -> str:
    subs = sorted({c for row in res["confusion"].values() for c in row})
    out = [f"{'injected / found':18s}" + "".join(f"{c:>10s}" for c in subs)]
    for k, row in sorted(res["confusion"].items()):
        out.append(f"{k:18s}" + "".join(f"{row.get(c, 0):>10d}" for c in subs))
    return "\n".join(out)
