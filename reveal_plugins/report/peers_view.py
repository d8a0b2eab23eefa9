"""The peer comparison of a multi-node job in the text and HTML reports.

Text: one line per node, the suspect marked, its evidence (node value beside the peers'
median) and the job's iteration time meanwhile; shared episodes said to be no suspect.
HTML: one timeline per subsystem with a suspect, a line per node (the suspect in colour, its
peers grey), the suspect's span shaded.
"""
from __future__ import annotations

import html as _html
from typing import Any, Callable

import numpy as np

from . import fmt

MAX_CHANNELS = 3          # evidence channels drawn per subsystem


def _ev_text(e: dict) -> str:
    unit = e.get("unit") or ""
    return (f"{e['channel']} {fmt.number(e.get('observed'), unit)} vs peers' "
            f"{fmt.number(e.get('peers'), unit)}")


def text_block(peers: dict | None, style: Callable[..., str] | None = None) -> str:
    """The job's peer section as text ('' when there is none)."""
    if not peers:
        return ""
    s = style or (lambda text, *a: text)
    nodes = peers.get("nodes") or []
    sus = peers.get("suspects") or []
    by_node: dict[str, list[dict]] = {}
    for sp in sus:
        by_node.setdefault(sp["node"], []).append(sp)
    width = max([len(fmt.printable(n["node"])) for n in nodes] + [4])
    lines = [s(f"Peer comparison ({len(nodes)} nodes, each window against the same window "
               "on the other nodes):", "bold")]
    for nd in nodes:
        name = fmt.printable(nd["node"]).ljust(width)
        rk = f"rank {nd['rank']}" if nd.get("rank") is not None else ""
        mine = by_node.get(nd["node"], [])
        if not mine:
            lines.append(f"   {name}  {rk:<8} {s('ok', 'green')}")
            continue
        for k, sp in enumerate(mine):
            head = "=> " if k == 0 else "   "
            ev = "; ".join(_ev_text(e) for e in sp["evidence"][:2])
            imp = sp.get("impact") or {}
            tail = (f"; job iteration time {imp['iteration_time_pct']:+.0f}%"
                    if imp.get("iteration_time_pct") is not None else "")
            lines.append(s(head, "red", "bold") + f"{name if k == 0 else ' ' * width}  "
                         f"{rk if k == 0 else '':<8} "
                         + s(f"SUSPECT {sp['subsystem'].upper()}", "red", "bold")
                         + f"  {fmt.clock(sp['start'])}-{fmt.clock(sp['end'])} "
                         f"({fmt.duration(sp['end'] - sp['start'])})  score {sp['score']:g}"
                         f"\n{' ' * (width + 15)}{ev}{tail}")
    for sh in peers.get("shared") or []:
        lines.append(f"   shared: {sh['subsystem']} {fmt.clock(sh['start'])}-"
                     f"{fmt.clock(sh['end'])} on all {len(sh['nodes'])} nodes at once: a job "
                     "phase or a shared resource, not a suspect node")
    if sus:
        h = (sus[0].get("hints") or [None])[0]
        if h:
            lines.append(f"   -> {fmt.printable(h['action'])}")
    elif not nodes or any(("skipped" in x or "too" in x or "failed" in x)
                          for x in peers.get("notes") or []):
        lines += [f"   {fmt.printable(x)}" for x in (peers.get("notes") or [])[:2]]
    else:
        lines.append("   no node stood out from its peers")
    return "\n".join(lines) + "\n\n"


# -- HTML ---------------------------------------------------------------------------------------

def _esc(x: Any) -> str:
    return _html.escape(str(x), quote=True)


def html_section(peers: dict | None, progress=None) -> str:
    """The job's peer section (table, and timelines when the nodes' telemetry is readable)."""
    if not peers:
        return ""
    from .htmlkit import COLORS, SUBSYSTEM_TITLES
    sus = peers.get("suspects") or []
    rows = []
    for nd in peers.get("nodes") or []:
        mine = [sp for sp in sus if sp["node"] == nd["node"]]
        verdict = ("<b style='color:#d62728'>suspect: " + ", ".join(
            f"{_esc(sp['subsystem'])} {_esc(fmt.clock(sp['start']))}–"
            f"{_esc(fmt.clock(sp['end']))}" for sp in mine) + "</b>") if mine else "ok"
        ev = "<br>".join(_esc(_ev_text(e)) for e in (mine[0]["evidence"][:3] if mine else []))
        rows.append(f"<tr><td>{_esc(nd['node'])}</td><td>{_esc(nd.get('rank', ''))}</td>"
                    f"<td>{verdict}</td><td class=small>{ev}</td></tr>")
    parts = ["<section class=peers id=peers><h2>Peer comparison</h2>",
             f"<p class=verdict>{_esc(peers.get('summary', ''))}</p>",
             "<table><tr><th>node</th><th>rank</th><th>verdict</th><th>evidence (node vs "
             "peers' median)</th></tr>" + "".join(rows) + "</table>"]
    for sh in peers.get("shared") or []:
        parts.append(f"<p class=muted>Shared: {_esc(sh['subsystem'])} "
                     f"{_esc(fmt.clock(sh['start']))}–{_esc(fmt.clock(sh['end']))} on all "
                     f"{len(sh['nodes'])} nodes at once — a job phase or a shared resource, "
                     "not a suspect node.</p>")
    try:
        figs = timelines(peers, progress)
    except Exception as e:     # telemetry unreadable: the table says what was found
        figs = []
        parts.append(f"<p class=muted>timelines unavailable: {_esc(type(e).__name__)}: "
                     f"{_esc(e)}</p>")
    for sub, svg in figs:
        cap = SUBSYSTEM_TITLES.get(sub, sub) + " — a line per node, the suspect in colour"
        parts.append(f"<figure><figcaption style='color:{COLORS.get(sub, '#333')}'>"
                     f"{_esc(cap)}</figcaption>{svg}</figure>")
    parts.append("</section>")
    return "\n".join(parts)


def timelines(peers: dict, progress=None) -> list[tuple[str, str]]:
    """[(subsystem, svg)]: per subsystem with a suspect, its strongest evidence channels as
    3-s means, one line per node."""
    sus = peers.get("suspects") or []
    nodes = [nd for nd in peers.get("nodes") or [] if nd.get("run_dir")]
    if not sus or len(nodes) < 2:
        return []
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from ..detect.peers.job import load_node
    from ..detect.batch.windows import sliding_windows
    from .htmlkit import COLORS, RC, figure_svg, mmss
    from matplotlib.ticker import FuncFormatter, MaxNLocator
    subs: dict[str, list[str]] = {}
    for sp in sus:
        chans = subs.setdefault(sp["subsystem"], [])
        for e in sp["evidence"]:
            if e["channel"] not in chans and len(chans) < MAX_CHANNELS:
                chans.append(e["channel"])
    series = {}
    for nd in nodes:
        if progress is not None:
            progress.update(f"reading {nd['node']} for the peer timelines")
        s = load_node(nd["run_dir"], nd["node"])
        series[nd["node"]] = s
    t0 = min(float(s.t[0]) for s in series.values() if len(s.t))
    t1 = max(float(s.t[-1]) for s in series.values() if len(s.t))
    out = []
    for sub, chans in subs.items():
        color = COLORS.get(sub, "#d62728")
        with plt.rc_context(RC):
            fig, axes = plt.subplots(len(chans), 1, sharex=True, squeeze=False,
                                     figsize=(10.5, 0.35 + 1.3 * len(chans)))
            for ax, ch in zip(axes[:, 0], chans):
                for name, s in series.items():
                    if ch not in s.names:
                        continue
                    w = sliding_windows(s.t, s.X[:, [s.names.index(ch)]], 3.0, 1.0,
                                        stats=("mean",))
                    bad = any(sp["node"] == name and sp["subsystem"] == sub for sp in sus)
                    ax.plot(w.mid - t0, w.stats["mean"][:, 0].astype(np.float64),
                            color=color if bad else "#9aa3b0",
                            linewidth=1.8 if bad else 0.9, zorder=3 if bad else 2,
                            label=name if bad else None)
                for sp in sus:
                    if sp["subsystem"] == sub:
                        ax.axvspan(sp["start"] - t0, sp["end"] - t0, color=color, alpha=0.12,
                                   linewidth=0)
                unit = next((e.get("unit") for sp in sus for e in sp["evidence"]
                             if e["channel"] == ch), "")
                ax.set_title(ch, loc="left", fontsize=9, pad=3)
                ax.set_ylabel(unit or "", fontsize=8)
                ax.yaxis.set_major_locator(MaxNLocator(3))
                ax.grid(axis="y", color="#e6e9ee", linewidth=0.6)
            axes[0, 0].legend(loc="upper right", fontsize=8, frameon=False)
            axes[-1, 0].set_xlim(0, max(t1 - t0, 1e-3))
            axes[-1, 0].xaxis.set_major_formatter(FuncFormatter(mmss))
            axes[-1, 0].set_xlabel("time since the first node started (m:ss)", fontsize=8)
            fig.tight_layout(h_pad=0.6)
            try:
                out.append((sub, figure_svg(fig, f"peers-{sub}-")))
            finally:
                plt.close(fig)
    return out


# -- GPUs of one job on one node (report["analysis"]["gpu_peers"], anomaly["gpu"]) -------------

def gpu_identity(g: dict | None) -> str:
    """``GPU 3 · rank 3 · GPU-8f2c… · 00000000:41:00.0 · NVIDIA H200`` ('' without an index)."""
    if not isinstance(g, dict) or g.get("index") is None:
        return ""
    parts = [f"GPU {g['index']}"]
    if g.get("rank") is not None:
        parts.append(f"rank {g['rank']}")
    elif g.get("ranks"):
        parts.append("ranks " + ",".join(str(r) for r in g["ranks"]))
    parts += [str(g[k]) for k in ("uuid", "pci_bus_id", "name") if g.get(k)]
    return fmt.printable(" · ".join(parts))


def _gpu_peers(report: dict) -> dict | None:
    gp = (report.get("analysis") or {}).get("gpu_peers")
    return gp if isinstance(gp, dict) and (gp.get("gpus") or 0) >= 2 else None


def _gpu_short(g: dict) -> str:
    return f"GPU {g.get('index', g.get('gpu'))}" + (
        f" (rank {g['rank']})" if g.get("rank") is not None else "")


def gpu_text_lines(report: dict, style: Callable[..., str] | None = None) -> list[str]:
    """The GPU peer comparison of one run as a few lines ([] with fewer than 2 GPUs): the GPUs
    that stood out from their siblings, the others, the phases every GPU shared."""
    gp = _gpu_peers(report)
    if not gp:
        return []
    s = style or (lambda text, *a: text)
    t0 = float(report["run"]["start"])
    out = ["", s("GPU peers", "bold") + s(f"  ({gp['gpus']} GPUs of this job, each window "
                                         "against the same window on its siblings)", "dim")]
    sus = gp.get("suspects") or []
    named = {x["gpu"] for x in sus}
    for x in sorted(sus, key=lambda x: x["start"]):
        out.append("  " + s("=> ", "red", "bold") + s(f"{_gpu_short(x):<16}", "bold")
                   + f" {fmt.offset(x['start'] - t0)} → {fmt.offset(x['end'] - t0)}  "
                   + fmt.printable(", ".join(x.get("channels") or [])))
    rest = [g for g in gp.get("compared") or [] if g.get("index") not in named]
    if rest:
        out.append("     " + s("ok", "green") + ": " + ", ".join(_gpu_short(g) for g in rest))
    for sh in gp.get("shared") or []:
        out.append(f"     shared: {fmt.printable(sh.get('metric', ''))} "
                   f"{fmt.offset(sh['start'] - t0)} → {fmt.offset(sh['end'] - t0)} on all "
                   f"{len(sh.get('gpus') or [])} GPUs at once: the job's own phase, not one GPU")
    if not sus and not gp.get("shared"):
        out.append("     no GPU stood out from its siblings")
    for n in (gp.get("notes") or [])[:1]:
        out.append(s(f"     note: {fmt.printable(n)}", "dim"))
    return out


def gpu_html_section(report: dict) -> str:
    """The GPU peer comparison of one run as a table ('' with fewer than 2 GPUs)."""
    gp = _gpu_peers(report)
    if not gp:
        return ""
    t0 = float(report["run"]["start"])
    sus: dict[int, list[dict]] = {}
    for x in gp.get("suspects") or []:
        sus.setdefault(x["gpu"], []).append(x)
    rows = []
    for g in gp.get("compared") or []:
        mine = sus.get(g.get("index"), [])
        verdict = ("<b style='color:#d62728'>stood out: " + ", ".join(
            f"{_esc(fmt.offset(x['start'] - t0))}–{_esc(fmt.offset(x['end'] - t0))}"
            for x in mine) + "</b>") if mine else "ok"
        ev = "<br>".join(_esc(c) for c in (mine[0].get("channels") or [])) if mine else ""
        rows.append(f"<tr><td>{_esc(g.get('index'))}</td><td>{_esc(g.get('rank', ''))}</td>"
                    f"<td class=small>{_esc(g.get('uuid', ''))}<br>"
                    f"{_esc(g.get('pci_bus_id', ''))}</td><td>{verdict}</td>"
                    f"<td class=small>{ev}</td></tr>")
    parts = ["<h3>GPU peers</h3><p class='muted small'>Each GPU of the job against the same "
             "windows on its siblings (median of the others): a GPU that stands out is named; "
             "a change every GPU shows at once is the job's own phase.</p>",
             "<table><tr><th>GPU</th><th>rank</th><th>UUID / PCI</th><th>verdict</th>"
             "<th>evidence</th></tr>" + "".join(rows) + "</table>"]
    for sh in gp.get("shared") or []:
        parts.append(f"<p class=muted>Shared: {_esc(sh.get('metric', ''))} "
                     f"{_esc(fmt.offset(sh['start'] - t0))}–{_esc(fmt.offset(sh['end'] - t0))}"
                     f" on all {len(sh.get('gpus') or [])} GPUs at once — the job's own phase, "
                     "not one GPU.</p>")
    for n in (gp.get("notes") or [])[:1]:
        parts.append(f"<p class='muted small'>{_esc(n)}</p>")
    return "\n".join(parts)
