"""A multi-node job as one thing: every node's report plus the peer comparison.

``job_report(run_dirs, job_id)`` -> ``{"schema": "reveal.job-report/1", "job_id", "reports":
[per-node reports], "peers": {...}, "summary"}``.  The per-node reports come from each run
directory (its report.json, else analysed now); the peer comparison
(:mod:`reveal_plugins.detect.peers.nodes`) reads every node's telemetry through the same loader as
the node's own analysis (:func:`reveal_plugins.detect.batch.prepare.load_prepared`).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Sequence

from ...store import store
from ...types import ChannelMeta
from ..batch.boundaries import boundaries
from ..evidence.hinting import hints_for
from .nodes import NodeSeries, PeerResult, compare
from ..batch.prepare import load_prepared

log = logging.getLogger(__name__)

SCHEMA = "reveal.job-report/1"


def node_name(meta: dict) -> str:
    run = meta.get("run") or {}
    h = run.get("host") or meta.get("host")
    if isinstance(h, dict):
        h = h.get("hostname") or h.get("name")
    return str(h or "?")


def node_names(run_dirs: Sequence[str], metas: Sequence[dict]) -> list[str]:
    """Each node's host name; where two run directories carry the same host (several "nodes"
    on one machine, or collected copies) their directory names tell them apart."""
    names = [node_name(m) for m in metas]
    if len(set(names)) == len(names):
        return names
    base = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    if len(set(base)) == len(base):
        return base
    return [f"{n}#{i}" for i, n in enumerate(names)]


def ranks_of(events: list[dict]) -> list[int]:
    """Global ranks that ran on the node (``rank`` events of reveal-torchrun, iteration
    markers)."""
    out = set()
    for e in events:
        if e.get("event") in ("rank", "iteration") and isinstance(e.get("rank"), int):
            out.add(int(e["rank"]))
    return sorted(out)


def load_node(run_dir: str, name: str | None = None) -> NodeSeries:
    """A node's telemetry as the peer comparison reads it (StoreError: not a run directory)."""
    meta = store.read_meta(run_dir)
    metas = [ChannelMeta.from_dict(c) for c in meta.get("channels", [])]
    iv = meta.get("interval_s")
    P, _, _, _ = load_prepared(run_dir, metas, float(iv) if isinstance(iv, (int, float))
                               and iv > 0 else None)
    events = store.read_events(run_dir, [])
    ranks = ranks_of(events)
    s = NodeSeries(name or node_name(meta), P.t, P.X, P.names, P.units, events,
                   ranks[0] if ranks else None)
    if len(P.t):
        s.starts, s.ends = boundaries(meta, events, float(P.t[0]), float(P.t[-1]))
    return s


def peer_section(run_dirs: Sequence[str], reports: Sequence[dict] | None = None,
                 config: dict | None = None) -> dict:
    """The ``peers`` part of a job report for these run directories (never raises for bad
    data: a note says why no comparison was made)."""
    t0 = time.perf_counter()
    metas = [store.read_meta(d) for d in run_dirs]
    names = node_names(run_dirs, metas)
    try:
        nodes = [load_node(d, n) for d, n in zip(run_dirs, names)]
        own = {n: (r or {}).get("anomalies", []) for n, r in zip(names, reports or [])}
        res = compare(nodes, config, own)
        add_hints(res, nodes)
    except ValueError:
        raise                   # a bad setting: the caller names it
    except Exception as e:      # bad data must not cost the per-node reports
        log.exception("peer comparison failed")
        res = PeerResult([{"node": n, "rank": None, "suspect": False} for n in names], [],
                         notes=[f"peer comparison failed: {type(e).__name__}: {e}"])
        nodes = []
    for nd, d, s in zip(res.nodes, run_dirs, nodes or [None] * len(run_dirs)):
        nd["run_dir"] = os.path.abspath(d)
        if s is not None:
            nd["ranks"] = ranks_of(s.events)
    res.analysis["seconds"] = round(time.perf_counter() - t0, 3)
    out = res.as_dict()
    out["summary"] = peer_summary(out)
    return out


def add_hints(res: PeerResult, nodes: Sequence[NodeSeries]) -> None:
    """The node's hints as the built-in rules see its evidence against its peers, after the
    peer finding's own: take that node out of the job."""
    by = {s.node: s for s in nodes}
    for sp in res.suspects:
        s = by[sp["node"]]
        chans = {e["channel"]: {"baseline": e["peers"], "observed": e["observed"],
                                "deviation": e["deviation"], "unit": e.get("unit", "")}
                 for e in sp["evidence"]}
        an = {"subsystem": sp["subsystem"], "evidence": sp["evidence"], "start": sp["start"],
              "end": sp["end"], "node": sp["node"], "score": sp["score"],
              "families": ["peers"], "impact": sp.get("impact")}
        try:
            rules = hints_for(an, {"channels": chans, "meta": {}, "impact": sp.get("impact"),
                                   "facts": {}, "foreign": None})
        except Exception as e:  # a broken site rule must not cost the finding
            log.warning("hints for peer suspect failed: %s", e)
            rules = []
        sp["hints"] = [straggler_hint(sp, len(nodes), s)] + rules[:3]


def straggler_hint(sp: dict, n: int, s: NodeSeries) -> dict:
    pct = (sp.get("impact") or {}).get("iteration_time_pct")
    ev = sp["evidence"][0] if sp["evidence"] else None
    seen = (f"{ev['channel']} {ev['observed']:g} vs {ev['peers']:g} on the other "
            f"{n - 1} node(s)" if ev and ev.get("observed") is not None and
            ev.get("peers") is not None else "its signals differ from its peers'")
    why = (f"node {sp['node']} stood out from its peers ({sp['subsystem']}: {seen}) for "
           f"{sp['end'] - sp['start']:.0f} s; in a synchronous job every rank waits for the "
           "slowest node")
    if pct is not None:
        why += f" (the job's iteration time {pct:+.0f}% meanwhile)"
    return {"title": f"Node {sp['node']} is the straggler ({sp['subsystem']})", "why": why,
            "action": (f"look at {sp['node']} first (`reveal report` of its run directory "
                       f"for the node's own findings); to keep it out of the job: `scontrol "
                       f"update nodename={sp['node']} state=drain reason=\"reveal: "
                       f"{sp['subsystem']} straggler\"`, resubmit with `--exclude="
                       f"{sp['node']}`; torchrun elastic: restart without that node"),
            "severity": "critical" if pct is not None and pct >= 30 else "warning",
            "rule": "peer_straggler", "subsystem": sp["subsystem"]}


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def peer_summary(peers: dict) -> str:
    n = len(peers.get("nodes", []))
    sus = peers.get("suspects", [])
    parts = []
    if sus:
        for sp in sus[:3]:
            ev = sp["evidence"][0] if sp["evidence"] else {}
            rk = f" (rank {sp['rank']})" if sp.get("rank") is not None else ""
            txt = (f"node {sp['node']}{rk} is the suspect: {sp['subsystem']} from "
                   f"{_clock(sp['start'])} for {sp['end'] - sp['start']:.0f} s")
            if ev.get("observed") is not None and ev.get("peers") is not None:
                txt += (f" ({ev['channel']} {ev['observed']:.3g} vs peers' median "
                        f"{ev['peers']:.3g})")
            if sp.get("impact"):
                txt += f"; job iteration time {sp['impact']['iteration_time_pct']:+.0f}%"
            parts.append(txt)
        if len(sus) > 3:
            parts.append(f"{len(sus) - 3} more peer finding(s)")
    elif n >= 2 and not any("skipped" in x or "too" in x or "failed" in x
                            for x in peers.get("notes", [])):
        parts.append(f"no node stood out from its peers ({n} nodes compared)")
    for sh in peers.get("shared", [])[:3]:
        parts.append(f"{sh['subsystem']} episode at {_clock(sh['start'])} "
                     f"({sh['end'] - sh['start']:.0f} s) on all {len(sh['nodes'])} nodes at "
                     "once: a job phase or a shared resource, not a suspect node")
    if not parts:
        parts = [peers["notes"][0] if peers.get("notes") else "no peer comparison"]
    return "Peers: " + "; ".join(parts) + "."


def annotate(rep: dict, peers: dict, node: dict, job_id: str | None) -> None:
    """Give a node's report the job's verdict (``job_peers``): how many nodes were compared,
    the suspect nodes, this node's suspects.  The OTel sink puts it on the node's job span."""
    sus = peers.get("suspects") or []
    rep["job_peers"] = {
        "job_id": job_id, "nodes": len(peers.get("nodes") or []),
        "suspect": bool(node.get("suspect")),
        "suspect_nodes": sorted({sp["node"] for sp in sus}),
        "suspects": [sp for sp in sus if sp["node"] == node["node"]],
        "summary": peers.get("summary", "")}


def job_report(items: Sequence[tuple[dict, str | None]], job_id: str | None,
               config: dict | None = None) -> dict:
    """The job report of ``[(node report, run_dir or None)]``; the peer comparison needs the
    run directories (a node given only as a report.json is shown but not compared)."""
    reports = [r for r, _ in items]
    dirs = [(d, r) for r, d in items if d]
    if config is None and len(dirs) >= 2:     # the site's [detect.peers], else the defaults
        from ..config import site_detect
        config = site_detect()[0].peers
    doc: dict[str, Any] = {"schema": SCHEMA, "job_id": job_id, "reports": reports}
    if len(dirs) >= 2:
        doc["peers"] = peer_section([d for d, _ in dirs], [r for _, r in dirs], config)
        if len(dirs) < len(items):
            doc["peers"]["notes"].append(f"{len(items) - len(dirs)} node(s) given as a "
                                         "report only: not compared")
        doc["summary"] = doc["peers"]["summary"]
        by_dir = {nd.get("run_dir"): nd for nd in doc["peers"]["nodes"]}
        for d, r in dirs:
            nd = by_dir.get(os.path.abspath(d))
            if nd is not None:
                annotate(r, doc["peers"], nd, job_id)
    return doc

