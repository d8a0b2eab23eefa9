"""``reveal fleet nodes FLEET``: which nodes are anomalous across many users' jobs.

A node that is bad for everyone is broken hardware (a "lemon"); a node where one user's job
was slow is not.  Per node, over the analysed runs of the period:

- ``rate`` = anomalous runs / analysed runs, with a 95 % Wilson interval ``[lo, hi]``;
- ``user_rate`` = users with an anomalous run here / users who ran here, with its interval;
- ``score`` = min(lo, user lo): high only when *many runs and many users* were hit, so one
  bad job among many good ones, or one user's many bad jobs, stay low;
- ``suspect`` when ``lo`` exceeds the fleet-wide rate, at least ``min_users`` (2) users and
  ``min_bad`` (3) runs were hit; a suspect gets the ``scontrol`` drain command (printed,
  never run) with the dominant subsystem in its reason.

The pass maps one task per part file of ``FLEET/runs`` (partial counts with user and job
sets) and merges them here, so the result is the same wherever the tasks ran.
"""
from __future__ import annotations

import math
import shlex
from collections import Counter
from typing import Any

import pyarrow.parquet as pq

Z95 = 1.959963984540054
COLUMNS = ["node", "user", "job_id", "run_key", "analysed", "anomalous", "subsystems",
           "dominant_subsystem", "start"]


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (sane for k = 0, k = n, small n)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def in_period(start, since, until) -> bool:
    if since is None and until is None:
        return True
    if start is None:
        return False
    return (since is None or start >= since) and (until is None or start < until)


def partial_counts(paths: list[str], since: float | None = None,
                   until: float | None = None) -> dict[str, dict[str, Any]]:
    """The Dask task: per node, counts and sets over the runs in ``paths`` (part files)."""
    acc: dict[str, dict[str, Any]] = {}
    for path in paths:
        t = pq.read_table(path, columns=COLUMNS).to_pydict()
        for i in range(len(t["node"])):
            if not in_period(t["start"][i], since, until):
                continue
            node = t["node"][i] or "unknown"
            a = acc.setdefault(node, {"runs": 0, "analysed": 0, "anomalous": 0,
                                      "users": set(), "bad_users": set(), "jobs": set(),
                                      "bad_jobs": set(), "subsystems": Counter()})
            a["runs"] += 1
            if not t["analysed"][i]:
                continue
            user = t["user"][i] or "?"
            job = t["job_id"][i] or t["run_key"][i]
            a["analysed"] += 1
            a["users"].add(user)
            a["jobs"].add(job)
            if t["anomalous"][i]:
                a["anomalous"] += 1
                a["bad_users"].add(user)
                a["bad_jobs"].add(job)
                for s in t["subsystems"][i] or []:
                    a["subsystems"][s] += 1
    return acc


def merge(parts: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for node, a in part.items():
            o = out.get(node)
            if o is None:
                out[node] = {k: (v.copy() if hasattr(v, "copy") else v) for k, v in a.items()}
                continue
            for k in ("runs", "analysed", "anomalous"):
                o[k] += a[k]
            for k in ("users", "bad_users", "jobs", "bad_jobs"):
                o[k] |= a[k]
            o["subsystems"].update(a["subsystems"])
    return out


def rank(acc: dict[str, dict[str, Any]], min_users: int = 2, min_bad: int = 3
         ) -> dict[str, Any]:
    """Rows sorted worst first, with the fleet-wide rate they are compared to."""
    total = sum(a["analysed"] for a in acc.values())
    bad = sum(a["anomalous"] for a in acc.values())
    fleet_rate = bad / total if total else 0.0
    rows = []
    for node, a in acc.items():
        n, k = a["analysed"], a["anomalous"]
        lo, hi = wilson(k, n)
        nu, ku = len(a["users"]), len(a["bad_users"])
        ulo, uhi = wilson(ku, nu)
        dom = a["subsystems"].most_common(1)
        suspect = bool(n and lo > fleet_rate and ku >= min_users and k >= min_bad)
        row = {"node": node, "runs": a["runs"], "analysed": n, "anomalous": k,
               "rate": k / n if n else None, "ci_low": lo, "ci_high": hi,
               "users": nu, "users_affected": ku, "user_rate": ku / nu if nu else None,
               "user_ci_low": ulo, "user_ci_high": uhi,
               "jobs": len(a["jobs"]), "jobs_affected": len(a["bad_jobs"]),
               "score": min(lo, ulo) if n else 0.0,
               "dominant_subsystem": dom[0][0] if dom else None,
               "subsystems": dict(a["subsystems"].most_common()),
               "suspect": suspect, "drain_command": None}
        if suspect:
            reason = (f"reveal: {k}/{n} runs of {ku} users anomalous"
                      + (f", mostly {row['dominant_subsystem']}" if dom else ""))
            row["drain_command"] = (f"scontrol update NodeName={shlex.quote(node)} "
                                    f"State=DRAIN Reason={shlex.quote(reason)}")
        rows.append(row)
    rows.sort(key=lambda r: (-r["suspect"], -r["score"], -(r["rate"] or 0), -r["anomalous"],
                             r["node"]))
    return {"fleet_rate": fleet_rate, "analysed": total, "anomalous": bad, "nodes": rows,
            "min_users": min_users, "min_bad": min_bad}


def node_ranking(fleet: str, client=None, since: float | None = None,
                 until: float | None = None, progress: bool | None = None,
                 min_users: int = 2, min_bad: int = 3) -> dict[str, Any]:
    from .index import check_fleet, part_files
    check_fleet(fleet)
    files = part_files(fleet, "runs")
    ran_on: set[str] = set()
    if client is None:
        parts = [partial_counts(files, since, until)]
        ran_on.add("local")
    else:
        from .dask_runtime import run_tasks
        parts = list(run_tasks(client, partial_counts, files, "ranking nodes",
                               progress=progress, ran_on=ran_on, since=since, until=until))
    out = rank(merge(parts), min_users, min_bad)
    out["files"] = len(files)
    out["ran_on"] = sorted(ran_on)
    return out


def format_text(res: dict[str, Any], top: int = 20) -> str:
    rows = res["nodes"][:top]
    lines = [f"Fleet: {res['analysed']} analysed runs, {res['anomalous']} with anomalies "
             f"(fleet rate {100 * res['fleet_rate']:.1f} %)", ""]
    if not rows:
        return "\n".join(lines + ["no analysed runs in the index"]) + "\n"
    hdr = (f"{'node':<20} {'runs':>5} {'bad':>4} {'rate':>6} {'95% CI':>13} {'users':>7} "
           f"{'subsystem':<9} suspect")
    lines.append(hdr)
    for r in rows:
        rate = f"{100 * r['rate']:.0f}%" if r["rate"] is not None else "-"
        ci = f"{100 * r['ci_low']:.0f}-{100 * r['ci_high']:.0f}%"
        lines.append(f"{r['node'][:20]:<20} {r['analysed']:>5} {r['anomalous']:>4} {rate:>6} "
                     f"{ci:>13} {r['users_affected']:>3}/{r['users']:<3} "
                     f"{(r['dominant_subsystem'] or '-'):<9} {'YES' if r['suspect'] else ''}")
    sus = [r for r in res["nodes"] if r["suspect"]]
    if sus:
        lines += ["", "Suggested (not run): drain the suspects and check their hardware"]
        lines += [f"  {r['drain_command']}" for r in sus]
    else:
        lines += ["", "No node is anomalous across several users beyond the fleet rate."]
    return "\n".join(lines) + "\n"
