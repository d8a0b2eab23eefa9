"""``reveal fleet report FLEET [--since D] [--until D] --format text|json|html``: a period of
the fleet in one page -- anomalies per subsystem per day, the worst nodes (the ranking of
:mod:`.nodes`), the worst workloads (anomalous-run rate per class) and the most frequent
findings.  The HTML page is self-contained (matplotlib -> inline SVG, the per-run report's
style)."""
from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

import pyarrow.parquet as pq

from .nodes import in_period, node_ranking, wilson


def workload_counts(paths: list[str], since=None, until=None) -> dict[str, list[int]]:
    """The Dask task: per workload, [analysed runs, anomalous runs, users-set-size proxy]."""
    acc: dict[str, list] = {}
    for path in paths:
        t = pq.read_table(path, columns=["workload", "analysed", "anomalous", "start",
                                         "user"]).to_pydict()
        for i in range(len(t["workload"])):
            if not t["analysed"][i] or not in_period(t["start"][i], since, until):
                continue
            a = acc.setdefault(t["workload"][i] or "unknown", [0, 0, set()])
            a[0] += 1
            a[1] += bool(t["anomalous"][i])
            a[2].add(t["user"][i])
    return acc


def anomaly_counts(paths: list[str], since=None, until=None) -> dict[str, Any]:
    """The Dask task: anomalies per (day, subsystem) and per (subsystem, first hint)."""
    per_day: Counter = Counter()
    per_hint: Counter = Counter()
    for path in paths:
        t = pq.read_table(path, columns=["subsystem", "start", "hint"]).to_pydict()
        for s, st, h in zip(t["subsystem"], t["start"], t["hint"]):
            if not in_period(st, since, until):
                continue
            day = time.strftime("%Y-%m-%d", time.gmtime(st)) if st is not None else "unknown"
            per_day[(day, s)] += 1
            per_hint[(s, h or "(no hint)")] += 1
    return {"per_day": per_day, "per_hint": per_hint}


def fleet_summary(fleet: str, client=None, since: float | None = None,
                  until: float | None = None, top: int = 10,
                  progress: bool | None = None) -> dict[str, Any]:
    from .dask_runtime import run_tasks
    from .index import part_files
    nodes = node_ranking(fleet, client, since, until, progress)

    def mapped(fn, files, what):
        if client is None:
            return [fn(files, since, until)]
        return list(run_tasks(client, fn, files, what, progress=progress, since=since,
                              until=until))
    wl: dict[str, list] = {}
    for part in mapped(workload_counts, part_files(fleet, "runs"), "workloads"):
        for k, (n, b, users) in part.items():
            a = wl.setdefault(k, [0, 0, set()])
            a[0] += n
            a[1] += b
            a[2] |= users
    per_day: Counter = Counter()
    per_hint: Counter = Counter()
    for part in mapped(anomaly_counts, part_files(fleet, "anomalies"), "anomalies"):
        per_day.update(part["per_day"])
        per_hint.update(part["per_hint"])
    workloads = []
    for k, (n, b, users) in wl.items():
        lo, hi = wilson(b, n)
        workloads.append({"workload": k, "analysed": n, "anomalous": b, "rate": b / n,
                          "ci_low": lo, "ci_high": hi, "users": len(users)})
    workloads.sort(key=lambda r: (-r["ci_low"], -r["anomalous"], r["workload"]))
    subs = Counter()
    for (_, s), c in per_day.items():
        subs[s] += c
    return {"schema": "reveal.fleet.report/1", "fleet": fleet, "since": since, "until": until,
            "generated": time.time(), "runs_analysed": nodes["analysed"],
            "runs_anomalous": nodes["anomalous"], "fleet_rate": nodes["fleet_rate"],
            "anomalies_per_subsystem": dict(subs.most_common()),
            "anomalies_per_day": [{"day": d, "subsystem": s, "anomalies": c}
                                  for (d, s), c in sorted(per_day.items())],
            "top_findings": [{"subsystem": s, "hint": h, "anomalies": c}
                             for (s, h), c in per_hint.most_common(top)],
            "worst_nodes": nodes["nodes"][:top], "suspect_nodes":
                [r for r in nodes["nodes"] if r["suspect"]],
            "worst_workloads": workloads[:top]}


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _period(s: dict[str, Any]) -> str:
    if s["since"] is None and s["until"] is None:
        return "all runs in the index"
    return f"{_when(s['since'])} -> {_when(s['until'])}"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _plain(x: Any) -> str:
    """User-supplied text (job, workload and node names, hints quoting them) for a terminal:
    control characters (escape sequences, carriage returns, bidi overrides) shown as \\xNN /
    \\uNNNN, never interpreted."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), str(x))


def format_text(s: dict[str, Any]) -> str:
    out = [f"Reveal fleet report  {_plain(s['fleet'])}",
           f"  period    {_period(s)}",
           f"  runs      {s['runs_analysed']} analysed, {s['runs_anomalous']} with anomalies "
           f"({100 * s['fleet_rate']:.1f} %)", ""]
    if s["anomalies_per_subsystem"]:
        out.append("Anomalies per subsystem: " + ", ".join(
            f"{_plain(k)} {v}" for k, v in s["anomalies_per_subsystem"].items()))
    out += ["", "Worst nodes"]
    for r in s["worst_nodes"]:
        out.append(f"  {_plain(r['node']):<20} {r['anomalous']:>4}/{r['analysed']:<5} runs "
                   f"{r['users_affected']}/{r['users']} users  "
                   f"{_plain(r['dominant_subsystem'] or '-'):<8}{'  SUSPECT' if r['suspect'] else ''}")
    out += ["", "Worst workloads"]
    for r in s["worst_workloads"]:
        out.append(f"  {_plain(r['workload'])[:40]:<40} {r['anomalous']:>4}/{r['analysed']:<5} runs "
                   f"({100 * r['rate']:.0f} %)")
    if s["top_findings"]:
        out += ["", "Most frequent findings"]
        out += [f"  {r['anomalies']:>5}  {_plain(r['subsystem']):<8} {_plain(r['hint'])}"
                for r in s["top_findings"]]
    if s["suspect_nodes"]:
        out += ["", "Suggested (not run):"] + [f"  {_plain(r['drain_command'])}"
                                                 for r in s["suspect_nodes"]]
    return "\n".join(out) + "\n"


def _plots(s: dict[str, Any]) -> list[tuple[str, str]]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..report.htmlkit import COLORS, RC, figure_svg
    figs = []
    with plt.rc_context(RC):
        days = sorted({r["day"] for r in s["anomalies_per_day"]})
        if days:
            fig, ax = plt.subplots(figsize=(9, 2.8))
            bottom = [0] * len(days)
            for sub in s["anomalies_per_subsystem"]:
                ys = [sum(r["anomalies"] for r in s["anomalies_per_day"]
                          if r["day"] == d and r["subsystem"] == sub) for d in days]
                ax.bar(days, ys, bottom=bottom, label=sub, color=COLORS.get(sub, "#999"))
                bottom = [b + y for b, y in zip(bottom, ys)]
            ax.set_ylabel("anomalies")
            ax.legend(fontsize=8, ncol=6, frameon=False)
            ax.tick_params(axis="x", rotation=45 if len(days) > 6 else 0)
            figs.append(("Anomalies per subsystem over time", figure_svg(fig, "f0")))
            plt.close(fig)
        for i, (key, rows, label) in enumerate((
                ("worst_nodes", s["worst_nodes"], "node"),
                ("worst_workloads", s["worst_workloads"], "workload"))):
            rows = [r for r in rows if r["analysed"]][::-1]
            if not rows:
                continue
            fig, ax = plt.subplots(figsize=(9, 0.3 * len(rows) + 0.8))
            names = [str(r[label])[:40] for r in rows]
            rate = [100 * r["rate"] for r in rows]
            err = [[max(0.0, 100 * (r["rate"] - r["ci_low"])) for r in rows],
                   [max(0.0, 100 * (r["ci_high"] - r["rate"])) for r in rows]]
            col = [COLORS.get(r.get("dominant_subsystem") or "", "#7aa7d9") for r in rows]
            ax.barh(names, rate, xerr=err, color=col, ecolor="#555", capsize=2)
            ax.set_xlabel("anomalous runs, % (95 % CI)")
            ax.set_xlim(0, 100)
            figs.append((f"Worst {label}s", figure_svg(fig, f"f{i + 1}")))
            plt.close(fig)
    return figs


def render_html(s: dict[str, Any]) -> str:
    from ..report.htmlkit import esc, page
    body = [f"<h1>Fleet report</h1><p class=muted>{esc(s['fleet'])} · "
            f"{esc(_period(s))}</p>",
            f"<div class='verdict {'bad' if s['suspect_nodes'] else 'ok'}'>"
            f"{s['runs_analysed']} analysed runs, {s['runs_anomalous']} with anomalies "
            f"({100 * s['fleet_rate']:.1f} %); {len(s['suspect_nodes'])} suspect node(s)"
            "</div>"]
    for cap, svg in _plots(s):
        body.append(f"<figure><figcaption>{esc(cap)}</figcaption>{svg}</figure>")
    body.append("<h2>Worst nodes</h2><table><tr><th>node</th><th>anomalous runs</th>"
                "<th>95 % CI</th><th>users hit</th><th>subsystem</th><th>suggested</th></tr>")
    for r in s["worst_nodes"]:
        body.append(f"<tr><td>{esc(r['node'])}</td><td class=num>{r['anomalous']}/"
                    f"{r['analysed']}</td><td class=num>{100 * r['ci_low']:.0f}–"
                    f"{100 * r['ci_high']:.0f} %</td><td class=num>{r['users_affected']}/"
                    f"{r['users']}</td><td>{esc(r['dominant_subsystem'] or '-')}</td><td>"
                    + (f"<code>{esc(r['drain_command'])}</code>" if r["drain_command"] else "")
                    + "</td></tr>")
    body.append("</table><h2>Worst workloads</h2><table><tr><th>workload</th>"
                "<th>anomalous runs</th><th>95 % CI</th><th>users</th></tr>")
    for r in s["worst_workloads"]:
        body.append(f"<tr><td>{esc(r['workload'])}</td><td class=num>{r['anomalous']}/"
                    f"{r['analysed']}</td><td class=num>{100 * r['ci_low']:.0f}–"
                    f"{100 * r['ci_high']:.0f} %</td><td class=num>{r['users']}</td></tr>")
    body.append("</table><h2>Most frequent findings</h2><table><tr><th>anomalies</th>"
                "<th>subsystem</th><th>first hint</th></tr>")
    for r in s["top_findings"]:
        body.append(f"<tr><td class=num>{r['anomalies']}</td><td>{esc(r['subsystem'])}</td>"
                    f"<td>{esc(r['hint'])}</td></tr>")
    body.append("</table>")
    return page("Reveal fleet report", "\n".join(body))
