"""The HTML report: one self-contained file (no network, no scripts) with run metadata, the
anomaly table, the hints, and timelines of the key channels per subsystem drawn by matplotlib
as inline SVG, anomalous windows shaded and labelled.

Long runs stay light: every line is reduced to at most ``MAX_POINTS`` bins (mean line plus a
min–max band, so short spikes stay visible) and SVG coordinates are rounded.
"""
from __future__ import annotations

import math
import os

import numpy as np

from . import fmt, views
from .htmlkit import (COLORS, MAX_EXTRA_PANELS, RC, SUBSYSTEM_ORDER, SUBSYSTEM_TITLES,
                      downsample, esc, figure_svg, mmss, page)
from .load import RunView, host_of, load_view
from .peers_view import gpu_html_section, gpu_identity
from .progress import Progress

class Panel:
    def __init__(self, label: str, unit: str, t: np.ndarray, y: np.ndarray, color: str,
                 step: bool = False):
        self.label, self.unit, self.t, self.y, self.color, self.step = label, unit, t, y, color, step


def _figure(panels: list[Panel], anomalies: list[tuple[int, dict]], t0: float, t_end: float,
            own: str, steps: list[dict], notes: list[tuple[float, str]] = ()):
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    fig, axes = plt.subplots(len(panels), 1, sharex=True,
                             figsize=(10.5, 0.35 + 1.25 * len(panels)), squeeze=False)
    axes = axes[:, 0]
    for k, (ax, p) in enumerate(zip(axes, panels)):
        x = p.t - t0
        tm, mean, lo, hi = downsample(x, p.y)
        if lo is not None:
            ax.fill_between(tm, lo, hi, color=p.color, alpha=0.22, linewidth=0)
        ax.plot(tm, mean, color=p.color, linewidth=1.1,
                drawstyle="steps-post" if p.step else "default")
        ax.set_ylabel(p.unit, fontsize=8)
        ax.set_title(p.label, loc="left", fontsize=9, pad=3)
        ax.yaxis.set_major_locator(MaxNLocator(3))
        ax.grid(axis="y", color="#e6e9ee", linewidth=0.6)
        ymax = np.nanmax(hi if hi is not None else mean) if np.isfinite(mean).any() else 1
        if np.isfinite(ymax) and ymax >= 0:
            ax.set_ylim(bottom=min(0, float(np.nanmin(lo if lo is not None else mean))))
        for n, a in anomalies:
            mine = a["subsystem"] == own
            ax.axvspan(a["start"] - t0, a["end"] - t0, color=COLORS.get(a["subsystem"], "#999"),
                       alpha=0.20 if mine else 0.08, linewidth=0)
            if k == 0:
                ax.annotate(f"#{n} {a['subsystem']}", xy=(a["start"] - t0, 1.0),
                            xycoords=("data", "axes fraction"), xytext=(2, -2),
                            textcoords="offset points", va="top", fontsize=8,
                            fontweight="bold" if mine else "normal",
                            color=COLORS.get(a["subsystem"], "#555"),
                            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                                  "alpha": 0.85})
        for st in steps[1:]:
            ax.axvline(st["start"] - t0, color="#888", linestyle=":", linewidth=0.8)
        for tn, msg in notes:
            ax.axvline(tn - t0, color="#555", linestyle=(0, (1, 2)), linewidth=0.9)
            if k == len(panels) - 1:
                ax.annotate(msg if len(msg) <= 48 else msg[:47] + "…", xy=(tn - t0, 0.0),
                            xycoords=("data", "axes fraction"), xytext=(2, 2),
                            textcoords="offset points", fontsize=7, color="#444",
                            bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none",
                                  "alpha": 0.8})
    axes[-1].set_xlim(0, max(t_end - t0, 1e-3))
    axes[-1].xaxis.set_major_formatter(FuncFormatter(mmss))
    axes[-1].xaxis.set_major_locator(MaxNLocator(10))
    axes[-1].set_xlabel("time since start (m:ss)", fontsize=8)
    fig.align_ylabels(axes)
    fig.tight_layout(h_pad=0.6)
    return fig


def _figures(rep: dict, view: RunView, prefix: str, progress: Progress) -> list[tuple[str, str, str]]:
    """[(subsystem, caption, svg)] for the run: a training panel when iteration markers exist,
    then one figure per subsystem (anomalous subsystems first)."""
    import matplotlib.pyplot as plt

    t0, t_end = rep["run"]["start"], rep["run"]["end"]
    if len(view.frame.t):
        t0, t_end = min(t0, float(view.frame.t[0])), max(t_end, float(view.frame.t[-1]))
    anomalies = list(enumerate(sorted(rep.get("anomalies") or [], key=lambda a: a["start"]), 1))
    series = views.key_series(view.frame)
    covered = {c for s in series for c in s.sources}
    groups: dict[str, list[Panel]] = {}
    for s in series:
        groups.setdefault(s.subsystem, []).append(
            Panel(s.label, s.unit, s.t, s.y, COLORS.get(s.subsystem, "#555"),
                  step=s.key.endswith("runq")))
    # channels named as evidence and not already shown by a key series
    extra: dict[str, int] = {}
    for _, a in anomalies:
        for e in sorted(a.get("evidence") or [], key=lambda e: -abs(e.get("deviation") or 0)):
            ch = e["channel"]
            if ch not in covered and ch not in extra:
                extra[ch] = 0
    for ch in list(extra)[:MAX_EXTRA_PANELS * 3]:
        s = views.channel_series(view.frame, ch)
        if s is None:
            continue
        sub = s.subsystem
        if sum(1 for p in groups.get(sub, []) if p.label.startswith(sub + ".")) >= MAX_EXTRA_PANELS:
            continue
        groups.setdefault(sub, []).append(Panel(f"{ch} (evidence)", s.unit, s.t, s.y,
                                                COLORS.get(sub, "#555")))
    bad = [a["subsystem"] for _, a in anomalies]
    order = sorted(groups, key=lambda g: (g not in bad, SUBSYSTEM_ORDER.index(g)
                                          if g in SUBSYSTEM_ORDER else 99))
    it_t, it_dt = views.iteration_times(view.events)
    todo: list[tuple[str, list[Panel]]] = []
    if len(it_t) >= 2:
        todo.append(("training", [Panel("iteration time (all ranks; from iteration markers)", "s",
                                        it_t, it_dt, COLORS["training"])]))
    todo += [(g, groups[g]) for g in order]
    out = []
    steps = rep["run"].get("steps") or []
    notes = [(float(e["t"]), str(e.get("message", ""))) for e in view.events
             if e.get("event") == "note" and t0 <= float(e["t"]) <= t_end][:20]
    for i, (sub, panels) in enumerate(todo, 1):
        progress.update("drawing timelines", i, len(todo))
        with plt.rc_context(RC):  # also around savefig, which reads svg.* settings
            fig = _figure(panels, anomalies, t0, t_end, sub, steps, notes)
            try:
                svg = figure_svg(fig, f"{prefix}{sub}-")
            finally:
                plt.close(fig)
        n_an = sum(1 for _, a in anomalies if a["subsystem"] == sub)
        cap = SUBSYSTEM_TITLES.get(sub, sub) + (f" — {n_an} anomal{'y' if n_an == 1 else 'ies'}"
                                               if n_an else "")
        out.append((sub, cap, svg))
    return out


# -- page sections -----------------------------------------------------------------------------

def _meta_table(rep: dict, view: RunView | None) -> str:
    run, tel = rep["run"], rep.get("telemetry", {})
    rows = []
    ident = []
    if run.get("job_id"):
        ident.append(f"job {run['job_id']}" + (f" step {run['step_id']}"
                                               if run.get("step_id") not in (None, "") else ""))
    ident.append(f"source {run.get('source', '?')}")
    rows.append(("run", " · ".join(ident)))
    rows.append(("user", run.get("user") or "?"))
    rows.append(("nodes", ", ".join(run.get("nodes") or [])))
    rows.append(("when", f"{fmt.clock(run['start'], True)} → {fmt.clock(run['end'])} "
                         f"({fmt.duration(run['end'] - run['start'])})"))
    ec = run.get("exit_code")
    rows.append(("exit code", "?" if ec is None else str(ec)))
    cmd = fmt.command_text(run.get("command"))
    if cmd:
        rows.append(("command", f"<code>{esc(cmd)}</code>"))
    steps = run.get("steps") or []
    if steps:
        rows.append(("steps", ", ".join(
            f"{esc(s['step_id'])} ({fmt.offset(s['start'] - run['start'])}"
            + (f", {fmt.duration(s['end'] - s['start'])})" if s.get("end") else ")")
            for s in steps[:20])))
    tl = (f"{tel.get('samples', 0)} samples × {tel.get('channels', 0)} channels, every "
          f"{fmt.number(tel.get('interval_s'), 's')}")
    if tel.get("bytes_stored"):
        tl += f", {fmt.number(tel['bytes_stored'] / 1e6, 'MB')} stored"
    rows.append(("telemetry", esc(tl)))
    out = ["<table class=meta>"]
    for k, v in rows:
        v = v if k in ("command", "telemetry", "steps") else esc(v)
        out.append(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>")
    out.append("</table>")
    if view is not None and len(view.frame.t):
        out.append(_bars(view))
    return "\n".join(out)


def _bar(pct: float | None) -> str:
    w = 0 if pct is None or not math.isfinite(pct) else max(0.0, min(100.0, pct))
    return f'<span class=bar><span style="width:{w:.0f}%"></span></span>'


def _bars(view: RunView) -> str:
    u = views.utilization(view.frame)
    rows = []
    if u["cpu"]:
        c = u["cpu"]
        extra = f"{c['cores']} cores" if c.get("cores") else ""
        if c.get("runq") is not None:
            extra += f" · run queue {c['runq']:.1f}"
        rows.append(("CPU", c["mean"], f"{c['mean']:.0f} % mean, {c['p95']:.0f} % p95", extra))
    if u["memory"]:
        m = u["memory"]
        rows.append(("memory", 100 * m["used_mean"] / m["total"] if m["total"] else None,
                     f"{m['used_mean']:.1f} of {m['total']:.1f} GiB",
                     f"peak {m['used_max']:.1f} GiB"))
    for g in u["gpus"]:
        extra = []
        if g["mem_used"] is not None:
            extra.append(f"mem {g['mem_used']:.1f}" + (f"/{g['mem_total']:.0f}" if g["mem_total"]
                                                       else "") + " GiB")
        if g["power"] is not None:
            extra.append(f"{g['power']:.0f} W")
        if g["temp"] is not None:
            extra.append(f"{g['temp']:.0f} °C")
        main = (f"{g['util_mean']:.0f} % mean, {g['util_p95']:.0f} % p95"
                if g["util_mean"] is not None else "utilization not read")
        rows.append((f"GPU{g['index']}", g["util_mean"], main, " · ".join(extra)))
    if not rows:
        return ""
    body = "".join(f"<tr><th>{esc(n)}</th><td>{_bar(p)}{esc(a)}</td><td class=muted>{esc(b)}</td></tr>"
                   for n, p, a, b in rows)
    return f"<h3>Utilization</h3><table class='meta bars'>{body}</table>"


def _evidence_html(rows: list[tuple[str, str, str]]) -> str:
    """Evidence lines (channel, change, deviation) as one table cell."""
    return "<br>".join(f"<code>{esc(c)}</code> {esc(ch)} <span class=muted>{esc(z)}</span>"
                       for c, ch, z in rows)


def _anomaly_table(rep: dict, view: RunView | None) -> str:
    anomalies = sorted(rep.get("anomalies") or [], key=lambda a: a["start"])
    if not anomalies:
        return ""
    t0 = rep["run"]["start"]
    channels = view.channels if view else None
    rows = []
    for n, a in enumerate(anomalies, 1):
        ev_rows, more = fmt.top_evidence(a, channels, 4)
        ev_html = _evidence_html(ev_rows) + (f"<br><span class='muted small'>+{more} more</span>"
                                             if more else "")
        impact = a.get("impact")
        if impact is None and view is not None:
            impact = views.iteration_impact(view.events, a["start"], a["end"])
        color = COLORS.get(a["subsystem"], "#777")
        title = f"<div>{esc(a['title'])}</div>" if a.get("title") else ""
        where = ", ".join(x for x in (a.get("node") if len(rep["run"].get("nodes") or []) > 1
                                      else None,
                                      f"step {a['step_id']}" if a.get("step_id") not in (None, "")
                                      else None, gpu_identity(a.get("gpu"))) if x)
        rows.append(
            f"<tr id='anomaly-{n}'><td><b>#{n}</b></td>"
            f"<td><span class=sub style='background:{color}'>{esc(a['subsystem'])}</span></td>"
            f"<td>{fmt.offset(a['start'] - t0)} → {fmt.offset(a['end'] - t0)}<br>"
            f"<span class='muted small'>{fmt.clock(a['start'])}–{fmt.clock(a['end'])}"
            f"{' · ' + esc(where) if where else ''}</span></td>"
            f"<td class=num>{fmt.duration(a['end'] - a['start'])}</td>"
            f"<td class=num>{a['score']:.1f}</td>"
            f"<td>{title}{ev_html}</td><td>{esc(fmt.impact_text(impact) or '–')}</td></tr>")
    head = ("<tr><th>#</th><th>subsystem</th><th>when</th><th>duration</th><th>score</th>"
            "<th>evidence (baseline → observed, deviation)</th><th>impact</th></tr>")
    return f"<h3>Anomalies</h3><table class=anomalies>{head}{''.join(rows)}</table>"


def _observation_table(rep: dict, view: RunView | None) -> str:
    """What the analysis saw and let go, with the reason in full (the text summary shortens
    it): the run's own phases, its start-up, a brief burst."""
    obs = sorted(rep.get("observations") or [], key=lambda o: o["start"])
    if not obs:
        return ""
    t0 = rep["run"]["start"]
    channels = view.channels if view else None
    rows = []
    for o in obs:
        ev_html = _evidence_html(fmt.top_evidence(o, channels, 2)[0])
        rows.append(f"<tr><td>{esc(o.get('subsystem') or '?')}</td>"
                    f"<td>{fmt.offset(o['start'] - t0)} → {fmt.offset(o['end'] - t0)}</td>"
                    f"<td>{esc(o.get('why_not_anomaly') or '')}</td><td>{ev_html}</td></tr>")
    head = "<tr><th>subsystem</th><th>when</th><th>why not an anomaly</th><th>evidence</th></tr>"
    return (f"<h3>Seen, not anomalies ({len(obs)})</h3><table class=observations>{head}"
            f"{''.join(rows)}</table>")


def _hints(rep: dict) -> str:
    anomalies = sorted(rep.get("anomalies") or [], key=lambda a: a["start"])
    hints = fmt.unique_hints(anomalies)
    if not hints:
        return ""
    items = []
    for h, nums in hints:
        sev = h.get("severity", "info")
        refs = ", ".join(f"<a href='#anomaly-{n}'>#{n}</a>" for n in nums)
        items.append(
            f"<li class='{esc(sev)}'><div><span class=sev>{esc(sev.upper())}</span>"
            f"<b>{esc(h.get('title'))}</b> <span class='muted small'>({refs})</span></div>"
            + (f"<div class=hint-why>{esc(h.get('why'))}</div>" if h.get("why") else "")
            + f"<div class=hint-do><b>Do:</b> {_code_spans(h.get('action', ''))}</div></li>")
    return f"<h3>What to do</h3><ul class=hints>{''.join(items)}</ul>"


def _code_spans(text: str) -> str:
    """Escape, then show `backticked` parts as code."""
    parts = esc(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _probes(rep: dict) -> str:
    probes = rep.get("telemetry", {}).get("probes") or []
    if not probes:
        return ""
    rows = "".join(f"<tr><td><code>{esc(p['name'])}</code></td><td>"
                   f"{'yes' if p.get('available') else 'no'}</td>"
                   f"<td class=muted>{esc(p.get('reason') or '')}</td></tr>" for p in probes)
    n_ok = sum(1 for p in probes if p.get("available"))
    return (f"<details><summary>Probes: {n_ok} of {len(probes)} read</summary>"
            f"<table><tr><th>probe</th><th>read</th><th>why not</th></tr>{rows}</table></details>")


def _verdict(rep: dict, view: RunView | None) -> str:
    tel = rep.get("telemetry", {})
    anomalies = rep.get("anomalies") or []
    if not tel.get("samples") and not (view is not None and len(view.frame.t)):
        return ("<p class='verdict none'><b>No telemetry was recorded for this run</b> "
                f"(it lasted {fmt.duration(rep['run']['end'] - rep['run']['start'])}); "
                "there is nothing to compare.</p>")
    if rep.get("analysed") is False:
        return f"<p class='verdict none'><b>{esc(rep.get('summary'))}</b></p>"
    if rep.get("status") in ("not_analysed", "failed"):
        what = "Not analysed" if rep.get("status") == "not_analysed" else "Analysis failed"
        return (f"<p class='verdict none'><b>{what}</b> ({esc(rep.get('status_reason'))}): no "
                "window was judged; the absence of anomalies means nothing.</p>")
    extra = " ".join(esc(x) + "." for x in (fmt.one_line_summary(rep),) if x)
    checked = fmt.checked_text(rep)
    notes = "".join(f"<br><span class='muted small'>note: {esc(n)}</span>"
                    for n in (rep.get("notes") or [])[:3])
    checked_html = (f"<br><span class='muted small'>{esc(checked[0].upper() + checked[1:])}."
                    "</span>" if checked else "") + notes
    if not anomalies:
        return ("<p class='verdict ok'><b>✓ No anomalies.</b> The hardware and OS signals "
                f"stayed within what this run showed as normal. {extra}{checked_html}</p>")
    return (f"<p class='verdict bad'><b>{len(anomalies)} anomal"
            f"{'y' if len(anomalies) == 1 else 'ies'}.</b> {extra}{checked_html}</p>")


def _section(rep: dict, run_dir: str | None, idx: int, progress: Progress,
             heading: bool, label: str | None = None) -> str:
    progress.update("loading telemetry")
    view = load_view(run_dir, fmt.evidence_channels(rep))
    node = label or (host_of(view.meta) if view else (rep["run"].get("nodes") or ["?"])[0])
    parts = [f"<section class=node id='node-{esc(node)}'>"]
    if heading:
        parts.append(f"<h2>{esc(node)}</h2>")
    parts.append(_verdict(rep, view))
    parts.append(_meta_table(rep, view))
    parts.append(_efficiency(rep))
    parts.append(_anomaly_table(rep, view))
    parts.append(gpu_html_section(rep))
    parts.append(_hints(rep))
    parts.append(_observation_table(rep, view))
    if view is not None and len(view.frame.t) >= 2:
        parts.append("<h3>Timelines</h3><p class='muted small'>Shaded: anomalous windows "
                     "(darker in the subsystem they were attributed to); dotted lines: notes "
                     "from the run's events (e.g. an injected fault). Lines are means over "
                     "display bins, bands the min–max within each bin.</p>")
        for sub, cap, svg in _figures(rep, view, f"n{idx}-", progress):
            parts.append(f"<figure class=timeline data-subsystem='{esc(sub)}'>"
                         f"<figcaption>{esc(cap)}</figcaption>{svg}</figure>")
    elif run_dir is None:
        parts.append("<p class=muted>Timelines need the run directory (telemetry); only "
                     "report.json was given.</p>")
    parts.append(_probes(rep))
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def _efficiency(rep: dict) -> str:
    """The job's own use of what it was given (report ``efficiency``)."""
    from ..detect.batch.efficiency import efficiency_lines
    lines = efficiency_lines(rep.get("efficiency"))
    if not lines:
        return ""
    rows = "".join(f"<li{' class=warn' if x.startswith('note:') else ''}>{esc(x)}</li>"
                   for x in lines)
    return ("<h3>Job efficiency</h3><p class='muted small'>The job's own processes; the node "
            f"figures include other people's load.</p><ul class=eff>{rows}</ul>")


def _title(reports: list[tuple[dict, str | None]], job_id: str | None) -> str:
    rep = reports[0][0]
    run = rep["run"]
    if job_id or run.get("job_id"):
        who = f"job {job_id or run.get('job_id')}"
    elif run.get("run_id"):
        who = f"run {run['run_id']}"
    elif reports[0][1]:
        who = f"run {os.path.basename(os.path.normpath(reports[0][1]))}"
    else:
        who = "run"
    nodes = fmt.node_labels(reports)
    return f"Reveal report — {who} on {', '.join(nodes[:3])}{'…' if len(nodes) > 3 else ''}"


def render_job_html(reports: list[tuple[dict, str | None]], job_id: str | None = None,
                    progress: Progress | None = None, peers: dict | None = None) -> str:
    """One page for one or several nodes (the peer comparison, then one section per node)."""
    progress = progress or Progress(False)
    title = _title(reports, job_id)
    body = [f"<h1>{esc(title)}</h1>"]
    multi = len(reports) > 1
    labels = fmt.node_labels(reports)
    if multi:
        found = sum(len(r.get("anomalies") or []) for r, _ in reports)
        links = " ".join(f"<a href='#node-{esc(n)}'>{esc(n)}</a>" for n in labels)
        body.append(f"<p>{len(reports)} nodes, {found} anomal{'y' if found == 1 else 'ies'} "
                    f"in all. <nav>{links}</nav></p>")
        from .peers_view import html_section
        body.append(html_section(peers, progress))
    for i, ((rep, d), label) in enumerate(zip(reports, labels)):
        body.append(_section(rep, d, i, progress, heading=multi, label=label))
    progress.done()
    return page(title, "\n".join(body))


def render_html(report: dict, run_dir: str | None, progress: Progress | None = None) -> str:
    """One self-contained HTML page for one run (``run_dir`` adds the timelines)."""
    return render_job_html([(report, run_dir)], None, progress)
