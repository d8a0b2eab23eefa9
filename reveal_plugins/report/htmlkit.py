"""Building blocks of the self-contained HTML pages (the run/job page, its peers and GPU
sections, the fleet page): colours, the stylesheet and its content security policy, escaping,
down-sampling, matplotlib figures as inline SVG, the page frame.  One module, so the pages
share them without importing each other."""
from __future__ import annotations

import datetime
import html as _html
import io
import re
from typing import Any

import numpy as np

from . import fmt

MAX_POINTS = 500
MAX_EXTRA_PANELS = 4
SUBSYSTEM_ORDER = ("cpu", "gpu", "memory", "storage", "network", "system")
SUBSYSTEM_TITLES = {"cpu": "CPU", "gpu": "GPU", "memory": "Memory", "storage": "Storage",
                    "network": "Network", "system": "System", "training": "Training"}
COLORS = {"cpu": "#d62728", "memory": "#9467bd", "storage": "#8c564b", "network": "#1f77b4",
          "gpu": "#2ca02c", "system": "#7f7f7f", "training": "#ff7f0e"}
# Text stays text in the SVG (not glyph outlines): smaller, selectable, searchable.
RC = {"svg.fonttype": "none", "font.size": 9, "axes.titlesize": 9, "axes.spines.top": False,
      "axes.spines.right": False, "path.simplify": True, "svg.hashsalt": "reveal",
      "font.family": "DejaVu Sans",
      # Job names, notes and workload names are user text: a '$' must not start mathtext
      # (a job named '$\\foo$' aborted the figure, and the whole report with it).
      "text.parse_math": False}
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
       "base-uri 'none'; form-action 'none'")

CSS = """
:root{--fg:#1d2330;--muted:#5b6475;--line:#dde1e8;--bg:#fff;--soft:#f5f7fa}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 color:var(--fg);background:var(--bg);margin:0 auto;max-width:1180px;padding:20px 28px 60px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:19px;margin:34px 0 8px;
 border-bottom:2px solid var(--line);padding-bottom:4px} h3{font-size:16px;margin:24px 0 8px}
.verdict{font-size:16px;margin:6px 0 14px;padding:10px 14px;border-radius:6px;background:var(--soft)}
.verdict.bad{background:#fdecea;border-left:5px solid #d62728}
.verdict.ok{background:#eaf6ec;border-left:5px solid #2ca02c}
.verdict.none{background:#fff6e0;border-left:5px solid #e0a100}
table{border-collapse:collapse;width:100%;margin:4px 0 10px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-weight:600;color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.03em}
table.meta th{width:130px;text-transform:none;font-size:13px}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font:12.5px ui-monospace,"DejaVu Sans Mono",monospace;background:var(--soft);
 padding:1px 4px;border-radius:3px}
.sub{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-size:12px;font-weight:600}
.muted{color:var(--muted)} .small{font-size:12px}
ul.hints{list-style:none;padding:0;margin:0}
ul.hints li{border-left:5px solid #7aa7d9;background:var(--soft);margin:0 0 10px;padding:8px 12px;border-radius:4px}
ul.hints li.critical{border-color:#d62728} ul.hints li.warning{border-color:#e0a100}
.sev{font-size:11px;font-weight:700;letter-spacing:.05em;margin-right:6px}
li.critical .sev{color:#b71c1c} li.warning .sev{color:#8a6300} li.info .sev{color:#1f5fa8}
.hint-why{margin:3px 0} .hint-do{margin:3px 0}
figure{margin:14px 0 22px} figcaption{font-weight:600;margin-bottom:2px}
figure svg{width:100%;height:auto;display:block}
.bars td{white-space:nowrap}
.bar{display:inline-block;width:180px;height:10px;background:#e8ebf0;border-radius:5px;
 overflow:hidden;vertical-align:middle;margin-right:8px}
.bar span{display:block;height:100%;background:#2ca02c}
nav a{margin-right:12px}
footer{margin-top:40px;color:var(--muted);font-size:12px}
details summary{cursor:pointer;color:var(--muted)}
"""


def esc(x: Any) -> str:
    return _html.escape("" if x is None else str(x), quote=True)


# -- plotting ----------------------------------------------------------------------------------

def downsample(t: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS):
    """(t, mean, lo, hi) with at most ``max_points`` bins; lo/hi are None when not reduced."""
    n = len(t)
    if n <= max_points:
        return t, y, None, None
    edges = np.linspace(0, n, max_points + 1).astype(int)[:-1]
    fin = np.isfinite(y)
    cnt = np.add.reduceat(fin.astype(float), edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.add.reduceat(np.where(fin, y, 0.0), edges) / cnt
    lo = np.minimum.reduceat(np.where(fin, y, np.inf), edges)
    hi = np.maximum.reduceat(np.where(fin, y, -np.inf), edges)
    empty = cnt == 0
    mean[empty] = lo[empty] = hi[empty] = np.nan
    tm = np.add.reduceat(t, edges) / np.diff(np.append(edges, n))
    return tm, mean, lo, hi


_NUM_RE = re.compile(r"(-?\d+\.\d)\d+")
_ID_RE = re.compile(r'(id="|url\(#|href="#)([A-Za-z_][\w.-]*)')
_D_RE = re.compile(r'( d="|points=")([^"]*)"')


def figure_svg(fig, prefix: str) -> str:
    """The figure as inline SVG: no XML prologue, ids prefixed (several SVGs share one page),
    coordinates rounded to 0.1 pt, scaled by CSS."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    s = buf.getvalue()
    s = s[s.index("<svg"):]
    s = _D_RE.sub(lambda m: m.group(1) + _NUM_RE.sub(r"\1", m.group(2)) + '"', s)
    s = _ID_RE.sub(lambda m: m.group(1) + prefix + m.group(2), s)
    s = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1', s, count=1)
    return s


def mmss(x: float, _pos=None) -> str:
    return fmt.offset(x)[1:]


def page(title: str, body: str) -> str:
    from .. import __version__
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<meta http-equiv=Content-Security-Policy content=\"{CSP}\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n{body}\n"
            f"<footer>Generated by reveal-plugins {esc(__version__)} on {now}. "
            "Self-contained: no scripts, no network.</footer></body></html>\n")
