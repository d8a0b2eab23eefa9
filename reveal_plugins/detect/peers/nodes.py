"""Peer comparison: which node of a multi-node job is the odd one out.

In a synchronous job every rank waits for the slowest, so a slow node slows all of them and a
single node's own analysis cannot say *which* node it was.  Its peers can: the nodes run the
same code on the same schedule, so at any moment their hardware signals should look alike.

For every node ``i``, window ``w`` (the same wall-clock grid on all nodes) and channel ``c``:

* the **peer residual** ``r = x_i(w) - median_{j != i} x_j(w)``, minus the node's usual offset
  from its peers (its median residual over the run: rank 0 may always do a bit more);
* in robust units: ``z = r / s`` with ``s = max(MAD of the node's residuals, the channel's own
  run-level variability (median over nodes of its MAD over time), the practical floor of its
  unit, 2 % of its level)``, so a channel that swings anyway, or barely varies in a unit a
  person would call no change, is no hair trigger;
* **the node moved, alone**: a residual counts for node ``i`` only when ``i``'s own change
  against its own history (its level in the windows where it agreed with its peers) and the
  residual agree within a factor ``1/own_fraction`` (2), in the same direction.  When the
  other nodes move and ``i`` does not (they wait for it, or it waits for them), ``i`` is not
  the one that moved -- with 2 nodes this is what tells which of the two it was; when all
  moved and ``i`` a little more (a machine- or fabric-wide signal read a moment apart), the
  residual is a sliver of a shared change;
* **evidence**: a node-window is flagged when a *symptom* (pressure, stalls, loss, throttling:
  :data:`reveal_plugins.detect.evidence.attribution.SYMPTOMS`, in its harmful direction and by its
  practical minimum) or the node's *foreign load* (:mod:`reveal_plugins.detect.evidence.foreign`)
  deviates by ``z >= threshold`` from the peers; activity alone only helps choose the
  subsystem.  The job's own CPU share (``cpu.run.*``) never votes: it is the consequence;
* a **suspect** is a run of at least ``min_windows`` flagged windows of one node while at most
  ``max_share`` of the nodes are flagged at the same time.  A change every node shows at once
  (a job phase, a filesystem-wide slowdown) leaves no residual: it is reported as **shared**.

Everything here is plain arrays in, plain dicts out (:func:`compare`); loading run directories
and writing reports is :mod:`reveal_plugins.detect.peers.job`.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..evidence import attribution as attr
from ..batch.events import group, span
from ..batch.features import channel_floors, nanmedian_cols, rel_floors
from ..config import PeersConfig
from ..evidence.foreign import MINIMUM as FOREIGN_MINIMUM
from ..batch.prepare import PER_CORE
from ..batch.windows import sliding_windows

#: Documented settings (``config["peers"]``, ``[detect.peers]``: :class:`~reveal_plugins.detect.config.PeersConfig`).
DEFAULTS: dict[str, Any] = PeersConfig().model_dump()

#: The job's own CPU share: lower on a node held back, but the consequence, never the cause.
JOB_SHARE = re.compile(r"^cpu\.run\.")
_FOREIGN = re.compile(r"^(cpu|memory|storage)\.foreign\.")
#: Evidence of a cause on the node itself: what it ran that the job did not (foreign load),
#: a queueing discipline holding its packets back.  Its peers' symptoms at the same moment
#: (retransmissions towards a node that stopped answering, time spent waiting) follow from it.
_CAUSE = re.compile(r"^((cpu|memory|storage)\.foreign\.|network\.[^.]+\.qdisc_)")


@dataclass
class NodeSeries:
    """One node's prepared telemetry (rates, derived metrics) and lifecycle events."""

    node: str
    t: np.ndarray
    X: np.ndarray
    names: list[str]
    units: list[str]
    events: list[dict] = field(default_factory=list)
    rank: int | None = None
    starts: list[float] = field(default_factory=list)   # run/step starts (start-up grace)
    ends: list[float] = field(default_factory=list)


@dataclass
class PeerResult:
    """The ``peers`` section of a job report (see :meth:`as_dict`)."""

    nodes: list[dict]
    suspects: list[dict]
    shared: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    analysis: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"nodes": self.nodes, "suspects": self.suspects, "shared": self.shared,
                "notes": self.notes, "analysis": self.analysis}


def settings(config: "dict | PeersConfig | None") -> dict:
    """Defaults overlaid with ``config`` (an unknown key or a bad value is an error naming
    it)."""
    from pydantic import ValidationError
    if not isinstance(config, PeersConfig):
        try:
            config = PeersConfig.model_validate(config or {})
        except ValidationError as e:
            err = e.errors()[0]
            key = ".".join(str(x) for x in err.get("loc", ()))
            if err.get("type") == "extra_forbidden":
                raise ValueError(f"peers: unknown setting {key!r} (known: "
                                 f"{', '.join(DEFAULTS)})") from None
            raise ValueError(f"peers: {key} = {err.get('input')!r}: {err.get('msg')}") from None
    cfg = {k: float(v) for k, v in config.model_dump().items()}
    cfg["min_windows"] = int(cfg["min_windows"])
    cfg["symptom_windows"] = int(cfg["symptom_windows"])
    return cfg


def _harm_mask(names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Symptom mask of :mod:`attribution`, plus the foreign-load channels (direction up, their
    practical minimum)."""
    is_s, dirn, mins, absm = (a.copy() for a in attr.symptom_mask(names))
    for i, n in enumerate(names):
        if n in FOREIGN_MINIMUM or _FOREIGN.match(n):
            is_s[i], dirn[i] = True, 1.0
            mins[i] = FOREIGN_MINIMUM.get(n, FOREIGN_MINIMUM.get("cpu.foreign.cores", 0.25)
                                          if n.startswith("cpu.") else 4 * 1048576.0)
        if JOB_SHARE.match(n):
            is_s[i] = False
    return is_s, dirn, mins, absm


def _common_channels(nodes: Sequence[NodeSeries]) -> list[str]:
    names = [n for n in nodes[0].names if not PER_CORE.match(n)]
    for s in nodes[1:]:
        have = set(s.names)
        names = [n for n in names if n in have]
    return names


def _window_means(s: NodeSeries, cols: list[int], t0: float, cfg: dict):
    iv = float(np.median(np.diff(s.t))) if len(s.t) > 1 else cfg["stride_s"]
    return sliding_windows(s.t, s.X[:, cols], cfg["window_s"], cfg["stride_s"], iv, t0=t0,
                           stats=("mean",))


def _leave_one_out_median(V: np.ndarray) -> np.ndarray:
    """(n, m, c) -> for each node the median of the *other* nodes (all nodes from 9 on: one
    node barely moves the median of many, and the full median costs one pass)."""
    n = V.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if n > 8:
            return np.broadcast_to(np.nanmedian(V, axis=0), V.shape)
        out = np.empty_like(V)
        for i in range(n):
            out[i] = np.nanmedian(np.delete(V, i, axis=0), axis=0)
    return out


def compare(nodes: Sequence[NodeSeries], config: dict | None = None,
            node_anomalies: dict[str, list[dict]] | None = None) -> PeerResult:
    """Compare every node with its peers; ``node_anomalies`` (each node's own findings) only
    serve to name the *shared* episodes that every node saw at once."""
    cfg = settings(config)
    res = PeerResult(nodes=[{"node": s.node, "rank": s.rank, "suspect": False} for s in nodes],
                     suspects=[])
    res.analysis = {"nodes": len(nodes), "window_s": cfg["window_s"],
                    "stride_s": cfg["stride_s"], "threshold": cfg["threshold"]}
    if len(nodes) < 2:
        res.notes.append("peer comparison needs at least 2 nodes")
        return res
    if len({s.node for s in nodes}) < len(nodes):
        raise ValueError("peers: node names must be unique")
    names = _common_channels(nodes)
    nonempty = [s for s in nodes if len(s.t) > 1]
    if len(nonempty) < len(nodes) or not names:
        res.notes.append("peer comparison skipped: a node has no telemetry, or the nodes "
                         "share no channel")
        return res
    t0 = max(float(s.t[0]) for s in nodes)
    t1 = min(float(s.t[-1]) for s in nodes)
    wins = [_window_means(s, [s.names.index(n) for n in names], t0, cfg) for s in nodes]
    m = min(len(w) for w in wins)
    if m < 2 * cfg["min_windows"] + 5:
        res.notes.append(f"the nodes overlap for {max(0.0, t1 - t0):.0f} s only: too short "
                         "for a peer comparison")
        return res
    win = wins[0]
    ws, we = win.start[:m], win.end[:m]
    mid = 0.5 * (ws + we)
    V = np.stack([w.stats["mean"][:m].astype(np.float64) for w in wins])      # (n, m, c)
    ok = np.all([w.valid[:m] for w in wins], axis=0) & (we <= t1 + 1e-6)
    for s in nodes:
        for a in (s.starts or [float(s.t[0])]):
            ok &= ~((we > a) & (ws < a + cfg["warmup_s"]))
        for b in (s.ends or [float(s.t[-1])]):
            ok &= ~((we > b - cfg["cooldown_s"]) & (ws < b))
    res.analysis.update({"windows": int(m), "windows_compared": int(ok.sum()),
                         "channels": len(names), "start": round(t0, 3)})
    if ok.sum() < 2 * cfg["min_windows"] + 5:
        res.notes.append("too few windows in which every node was in steady state: no peer "
                         "comparison")
        return res
    units = nodes[0].units
    units = [units[nodes[0].names.index(n)] for n in names]
    Z, R, P, own_ok, expected, own_level = _scores(V, ok, names, units, cfg)
    is_s, dirn, mins, absm = _harm_mask(names)
    mins, absm = mins * cfg["min_fraction"], absm * cfg["min_fraction"]
    delta = np.nan_to_num((V - expected) * dirn, nan=0.0)
    rel = mins < 0
    with np.errstate(invalid="ignore"):
        big = np.where(rel, (delta >= -mins * np.abs(expected)) & (delta >= absm),
                       delta >= mins)
    counted = own_ok & (np.abs(Z) >= cfg["min_z"])
    hits = counted & is_s & (Z * dirn >= cfg["threshold"]) & big
    flag = hits.any(axis=2) & ok[None, :]
    cause = np.array([bool(_CAUSE.match(n)) for n in names])
    caused = (hits & cause[None, None, :]).any(axis=2) & flag
    # where some node shows a cause, peers flagged by symptoms alone are its consequences
    flag &= caused | ~caused.any(axis=0)[None, :]
    share = flag.sum(axis=0) / len(nodes)
    crowd = share > max(cfg["max_share"], 1.0 / len(nodes) + 1e-9)
    res.analysis["crowded_windows"] = int((crowd & flag.any(axis=0)).sum())
    flag &= ~crowd[None, :]
    job_share = np.array([bool(JOB_SHARE.match(n)) for n in names])
    need = min(cfg["min_windows"], cfg["symptom_windows"])
    unslowed = 0
    for i, s in enumerate(nodes):
        for a, b in group(flag[i], mid, cfg["stride_s"], cfg["gap_s"], need):
            rows = np.arange(a, b + 1)
            rows = rows[flag[i, rows]]
            # a cause on the node itself needs min_windows; symptoms alone (bursty: TCP
            # retransmissions come and go on healthy links) need symptom_windows
            symptoms_only = caused[i, rows].sum() < cfg["min_windows"]
            if symptoms_only and len(rows) < cfg["symptom_windows"]:
                continue
            sp = _suspect(s, i, rows, mid, cfg, Z, V, P, own_level, counted, hits, names,
                          units, job_share, nodes)
            # Symptoms alone (no cause on the node) while the job's iteration markers say it
            # ran as fast as ever: retransmission bursts of a healthy link, a node that is a
            # little different -- nothing the job paid for.  Without markers they stand.
            if symptoms_only and sp.get("impact") and not attr.slowed(
                    sp["impact"], cfg["min_slowdown_pct"]):
                unslowed += 1
                continue
            res.suspects.append(sp)
    if unslowed:
        res.analysis["symptoms_without_slowdown"] = unslowed
        res.notes.append(f"{unslowed} span(s) where a node's symptoms alone stood out while "
                         "the job's iterations did not slow: not named")
    res.suspects.sort(key=lambda x: -x["score"])
    for k, sp in enumerate(res.suspects, 1):
        sp["id"] = f"P{k}"
    for nd in res.nodes:
        mine = [sp for sp in res.suspects if sp["node"] == nd["node"]]
        nd["suspect"] = bool(mine)
        nd["max_score"] = max((sp["score"] for sp in mine), default=0.0)
    res.shared = shared_episodes(node_anomalies or {}, res.suspects, [s.node for s in nodes])
    return res


def _scores(V: np.ndarray, ok: np.ndarray, names: list[str], units: list[str], cfg: dict):
    """Peer residuals in robust units, and where the node's own change explains them."""
    P = _leave_one_out_median(V)
    R = V - P
    Vok = np.where(ok[None, :, None], V, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        level = nanmedian_cols(np.nanmedian(Vok, axis=1))               # (c,)
    floor = np.maximum(channel_floors(names, units),
                       rel_floors(units) * np.abs(np.nan_to_num(level)))
    # The node's usual offset from its peers and the spread of its residual.  A 20-s fault in
    # a 60-s job (or two disturbances) covers a good part of the run, so the spread comes from
    # the lowest decile of |deviation| (90 % breakdown, not the MAD's 50 %), and the offset
    # is refined on the windows where the node agreed with its peers.
    # Symptoms and foreign load have no "usual offset": nodes of one job on the same kind of
    # hardware should not differ in pressure, loss or foreign processes at all, and a node
    # that is worse from start to end is a finding, not its normal (best-rank reference).
    is_s, _, mins, _ = _harm_mask(names)
    harm = is_s[None, :]
    # a symptom's practical minimum is what counts as a change: the unit's floor must not
    # ask for more (4 x 0.1 cores would be 0.4 cores of foreign load, above its 0.25)
    absmin = is_s & (mins > 0)
    floor = np.where(absmin, np.minimum(floor, mins * cfg["min_fraction"] / max(
        cfg["threshold"], 1e-9)), floor)
    offset, spread = _offset_spread(R, ok[None, :, None], zero=harm)
    lag = max(1, int(round(cfg["window_s"] / cfg["stride_s"])))
    okm = np.broadcast_to(ok[None, :, None], R.shape)
    cause = np.array([bool(_CAUSE.match(n)) for n in names])
    scale = np.maximum(np.maximum(spread, _jitter(R, okm, lag, robust=cause)), floor[None, :])
    # The noise again, from the windows that stood out by less than min_z: a fault's edges
    # are differences too, and in a young run (live: 10-20 s of history) they are a good
    # part of all differences.  A channel that always bursts keeps its noise: its bursts are
    # within min_z of that noise in the first pass and stay in.
    quiet = okm & (np.abs(R - offset[:, None, :]) < cfg["min_z"] * scale[:, None, :])
    scale = np.maximum(np.maximum(spread, _jitter(R, quiet, lag, fallback=scale,
                                                  robust=cause)), floor[None, :])
    agree = ok[None, :, None] & (np.abs(R - offset[:, None, :]) <= cfg["min_z"]
                                 * scale[:, None, :])
    enough = agree.sum(axis=1) >= 5
    offset = np.where(enough & ~harm, _offset_spread(R, agree)[0], offset)
    resid = R - offset[:, None, :]
    # the node's own level when it agreed with its peers: its history before (and after) it
    # moved, so "which node moved" is asked against a baseline the fault did not shift
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        own_level = np.where(enough, np.nanmedian(np.where(agree, V, np.nan), axis=1),
                             np.nanmedian(Vok, axis=1))                # (n, c)
    Z = np.nan_to_num(resid / scale[:, None, :], nan=0.0, posinf=0.0, neginf=0.0)
    own = V - own_level[:, None, :]
    with np.errstate(invalid="ignore"):
        # the node moved (its own change explains the residual) and the peers did not move
        # with it (the residual is not a sliver of a change they all shared: machine- or
        # fabric-wide signals read at slightly different moments differ by a few %)
        own_ok = (np.sign(own) == np.sign(resid)) & (
            np.abs(own) >= cfg["own_fraction"] * np.abs(resid)) & (
            np.abs(resid) >= cfg["own_fraction"] * np.abs(own))
    # A cause on the node (foreign load, a qdisc queue) needs no history: its harmful
    # direction already tells the node that has it from the peers that have not, and one
    # there from the job's first window (a shaper left behind) is a finding, not its normal.
    own_ok = np.nan_to_num(own_ok, nan=0.0).astype(bool) | cause[None, None, :]
    return (Z, R, P, own_ok, P + offset[:, None, :],
            own_level)


def _jitter(R: np.ndarray, ok: np.ndarray, lag: int, fallback: np.ndarray | None = None,
            robust: np.ndarray | None = None) -> np.ndarray:
    """Noise of each residual from the differences between windows ``lag`` apart (windows
    that share no sample): sigma = 1.4826 MAD(diff) / sqrt(2).  A level shift (a fault,
    however long) moves only the few differences across its edges, while a channel that
    bursts on and off (TCP retransmissions of a busy link) shows its noise in most of them:
    bursts the node always has are no finding."""
    if R.shape[1] <= lag + 4:
        return np.zeros(R.shape[::2]) if fallback is None else fallback
    both = ok[:, lag:] & ok[:, :-lag]              # ok: (n, m, c)
    D = np.where(both, R[:, lag:, :] - R[:, :-lag, :], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mad = np.nanmedian(np.abs(D - np.nanmedian(D, axis=1, keepdims=True)), axis=1)
    out = np.nan_to_num(1.4826 * mad / np.sqrt(2.0))
    if robust is not None and robust.any():
        # causes (foreign load, a qdisc queue) have no bursts of their own to learn, and a
        # young run's few differences are half fault edges: the lowest decile (90 %
        # breakdown), as for the spread; their practical minimum guards against noise
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            q = np.nanquantile(np.abs(D[:, :, robust]), 0.10, axis=1) / 0.1257
        out[:, robust] = np.nan_to_num(q / np.sqrt(2.0))
    if fallback is not None:      # too few differences left: the first estimate stands
        out = np.where(both.sum(axis=1) >= 5, out, fallback)
    return out


def _offset_spread(R: np.ndarray, rows: np.ndarray, zero: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Median residual over ``rows`` (broadcast to R; 0 where ``zero``) and its spread from
    the lowest decile of |deviation| (sigma of a normal = q10(|x - median|) / 0.1257: it breaks
    down at 90 % contamination, not 50 %; the practical floor keeps it from being a hair
    trigger)."""
    Rr = np.where(rows, R, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        off = np.nanmedian(Rr, axis=1)
        if zero is not None:
            off = np.where(zero, 0.0, off)
        q = np.nanquantile(np.abs(Rr - off[:, None, :]), 0.10, axis=1) / 0.1257
    return np.nan_to_num(off), np.nan_to_num(q)


def _suspect(s: NodeSeries, i: int, rows: np.ndarray, mid: np.ndarray, cfg: dict,
             Z, V, P, own, counted, hits, names, units, job_share, nodes) -> dict:
    """One suspect: subsystem, evidence (node value beside the peers' median), impact."""
    z = np.where(counted[i, rows], Z[i, rows], 0.0)
    zmean = z.mean(axis=0)
    hit_any = hits[i, rows].any(axis=0)
    vote = np.where(job_share, 0.0, zmean)
    sub, sub_scores = attr.choose_subsystem(vote, names, hit_any)
    fsub = _persistent_foreign(hits[i, rows], names)
    if fsub:     # like the node's own analysis: a neighbour's memory or I/O is the cause
        # (page-cache growth is memory unless the node's foreign disk bytes rose with it)
        kind = _foreign_kind(names, V[i, rows], own[i], P[i, rows])
        sub = "storage" if "storage" in fsub or kind == "storage" else "memory"
    elif any(_FOREIGN.match(names[j]) for j in np.nonzero(hit_any)[0]):
        # foreign CPU time on the node: what that process did may show only in signals the
        # node shares with its peers (one disk, one kernel's memory) -- its own foreign I/O or
        # memory growing at the same time, beyond the practical minimum, names it
        sub = "cpu"   # its own foreign I/O or memory, when it stood out, is in fsub above
    # (foreign CPU time alone says only that something ran there; what it did -- page
    # faults, I/O wait -- is in the other channels, which choose_subsystem weighs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # all-NaN channels stay NaN
        node_v = np.nanmean(V[i, rows], axis=0)
        peer_v = np.nanmean(P[i, rows], axis=0)
    rank_key = np.abs(zmean) * np.where(hit_any, 1.0, attr.ACTIVITY_WEIGHT)
    order = np.argsort(-rank_key)
    ev = []
    for j in order[:24]:
        if len(ev) >= 8 or (abs(zmean[j]) < cfg["min_z"] and ev):
            break
        ev.append({"channel": names[j], "deviation": round(float(zmean[j]), 2),
                   "observed": attr.num(node_v[j]), "peers": attr.num(peer_v[j]),
                   "baseline": attr.num(peer_v[j]), "unit": units[j],
                   "symptom": bool(hit_any[j])})
    if not any(attr.subsystem_of(e["channel"]) == sub for e in ev[:3]):
        for j in order:
            if attr.subsystem_of(names[j]) == sub and abs(zmean[j]) >= cfg["min_z"]:
                ev = [e for e in ev if e["channel"] != names[j]]
                ev.insert(0, {"channel": names[j], "deviation": round(float(zmean[j]), 2),
                              "observed": attr.num(node_v[j]), "peers": attr.num(peer_v[j]),
                              "baseline": attr.num(peer_v[j]), "unit": units[j],
                              "symptom": bool(hit_any[j])})
                break
    start, end = span(int(rows[0]), int(rows[-1]), mid, cfg["stride_s"])
    strength = np.where(hits[i, rows], np.abs(Z[i, rows]), 0.0).max(axis=1)
    sp: dict[str, Any] = {
        "id": "", "node": s.node, "rank": s.rank, "subsystem": sub,
        "start": round(start, 3), "end": round(end, 3),
        "score": round(float(np.median(strength)), 2), "windows": int(len(rows)),
        "evidence": ev, "hints": [],
        "subsystem_scores": {k: round(v, 3) for k, v in sorted(sub_scores.items(),
                                                                key=lambda kv: -kv[1])},
        "peers_compared": len(nodes) - 1}
    gpus = sorted({e["channel"].split(".")[1] for e in ev[:3]
                   if e["channel"].startswith("gpu.") and e["channel"].split(".")[1].isdigit()})
    if gpus:
        sp["gpu"] = int(gpus[0])
    imp = job_impact([x.events for x in nodes], start, end)
    if imp:
        sp["impact"] = imp
    return sp


#: Windows a neighbour's foreign I/O or memory must stand out before it names the suspect
#: (3-s windows every second: a binary read cold at 9 MB/s for 2 s stands out in two).
PERSIST_WINDOWS = 3


def _persistent_foreign(hits: np.ndarray, names: list[str]) -> list[str]:
    """The subsystems (storage, memory) of the node's foreign I/O or memory channels that
    stood out for at least half as many windows as its foreign CPU did.  A process that reads
    its binary from disk for a second and then spins for twenty is a CPU neighbour (stress-ng
    starting on a cold page cache read 9 MB/s for 1.5 s); one that does I/O all along, even on
    little CPU, is an I/O neighbour.  It must also stand out in :data:`PERSIST_WINDOWS`
    windows at least, one of them in the later half of the span: judged live a few seconds
    after the onset, the cold read at the start is as long as the spinning so far, yet over by
    then (or all there is: two windows cannot tell a binary read from an I/O neighbour, and
    the CPU named first is corrected by the next check, see ``live.peers``)."""
    per = hits.sum(axis=0)
    later = hits[len(hits) // 2:].any(axis=0)
    cpu = max((int(per[j]) for j, n in enumerate(names)
               if n.startswith("cpu.foreign.")), default=0)
    return [attr.subsystem_of(n) for j, n in enumerate(names)
            if per[j] >= PERSIST_WINDOWS and later[j] and _FOREIGN.match(n)
            and not n.startswith("cpu.") and 2 * int(per[j]) >= cpu]


def _foreign_kind(names: list[str], rows: np.ndarray, level: np.ndarray,
                  peers: np.ndarray) -> str | None:
    """storage / memory when the node's foreign disk bytes / memory rose (against its own
    level) by their practical minimum during the rows *and* stand that much above the peers'
    median: foreign I/O every node sees (one shared disk, writes of the job's own tooling) says
    nothing about what the suspect's foreign CPU did.  None otherwise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        node = np.nanmean(rows, axis=0)
        change, above = node - level, node - np.nanmean(peers, axis=0)
    for sub, chans in (("storage", ("storage.foreign.write_bytes", "storage.foreign.read_bytes",
                                    "storage.foreign.dirtied_bytes")),
                       ("memory", ("memory.foreign.used",))):
        for ch in chans:
            if ch in names:
                j, m = names.index(ch), FOREIGN_MINIMUM[ch]
                if np.nan_to_num(change[j]) >= m and np.nan_to_num(above[j]) >= m:
                    return sub
    return None


def job_impact(events_per_node: Sequence[list[dict]], start: float, end: float
               ) -> dict | None:
    """Iteration time of the job (all ranks' markers) during [start, end] against outside:
    in a synchronous job every rank pays for the slow one."""
    events = [e for evs in events_per_node for e in evs if e.get("event") == "iteration"]
    return attr.iteration_impact(events, start, end, [(start, end)])


def shared_episodes(node_anomalies: dict[str, list[dict]], suspects: list[dict],
                    nodes: list[str]) -> list[dict]:
    """Spans where *every* node's own analysis found an anomaly at the same time and no node
    stood out from its peers: a job phase or a shared resource (filesystem, fabric), not a
    suspect node."""
    if len(nodes) < 2 or any(not node_anomalies.get(n) for n in nodes):
        return []
    out = []
    for a in node_anomalies[nodes[0]]:
        s0, s1 = float(a["start"]), float(a["end"])
        subs = {a.get("subsystem")}
        for n in nodes[1:]:
            over = [b for b in node_anomalies[n] if b["start"] <= s1 and b["end"] >= s0]
            if not over:
                break
            s0 = max(s0, min(float(b["start"]) for b in over))
            s1 = min(s1, max(float(b["end"]) for b in over))
            subs |= {b.get("subsystem") for b in over}
        else:
            if s1 > s0 and not any(sp["start"] <= s1 and sp["end"] >= s0 for sp in suspects):
                sub = a.get("subsystem") if len(subs) > 1 else next(iter(subs))
                out.append({"start": round(s0, 3), "end": round(s1, 3), "subsystem": sub,
                            "nodes": list(nodes),
                            "text": "every node at once: a job phase or a shared resource, "
                                    "not one node"})
    return out
