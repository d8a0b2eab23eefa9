"""The HTML report: self-contained, light for long runs, and rendered by a real browser
(headless Chromium) without console errors; a screenshot is kept in tests/artifacts/."""
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from fixtures_report import empty_report, make_empty_run, make_report, make_run

from reveal_plugins.commands.report import main as report_main
from reveal_plugins.report.html import render_html, render_job_html

ARTIFACTS = pathlib.Path(__file__).parent / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which(
    "google-chrome")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get "
                                    "install -y chromium)")


def chromium(url: str, *mode: str, timeout: float = 90) -> tuple[str, list[str]]:
    """Load ``url`` in headless Chromium; return (stdout, console messages)."""
    with tempfile.TemporaryDirectory(prefix="reveal-chromium-") as profile:
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
               "--enable-logging=stderr", "--v=0", "--hide-scrollbars", *mode, url]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
    return r.stdout, console


def _write(name: str, html: str) -> pathlib.Path:
    ARTIFACTS.mkdir(exist_ok=True)
    p = ARTIFACTS / name
    p.write_text(html, encoding="utf-8")
    return p


def test_page_is_self_contained_with_plots_table_and_hints(report_run):
    d, rep = report_run
    html = render_html(rep, d)
    _write("report.html", html)
    # offline: no scripts, nothing fetched; the CSP makes a browser refuse anything external
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    # one figure per subsystem with data, anomalous ones first, iteration times on top
    subs = re.findall(r"<figure class=timeline data-subsystem='(\w+)'>", html)
    assert subs[:3] == ["training", "cpu", "storage"]
    assert set(subs) == {"training", "cpu", "storage", "memory", "network", "gpu"}
    assert html.count("<svg") == len(subs)
    # every anomaly window shaded and labelled in the plots
    assert html.count(">#1 cpu<") == len(subs) and html.count(">#2 storage<") == len(subs)
    # inline SVGs must not share ids (one page holds several)
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    # the anomaly table and hints
    assert "id='anomaly-1'" in html and "id='anomaly-2'" in html
    assert "cpu.psi.some_total</code> 1.00 % of time → 60.0 % of time" in html
    assert "CPU contention: other processes compete" in html
    assert "<code>srun --exclusive</code>" in html
    assert "job 4242" in html and "alice" in html and "exit code" in html


@needs_chromium
def test_browser_renders_without_console_errors_and_screenshot(report_run):
    d, rep = report_run
    page = _write("report.html", render_html(rep, d))
    url = page.resolve().as_uri()
    dom, console = chromium(url, "--dump-dom")
    assert console == []
    assert "</html>" in dom
    assert dom.count("<svg") >= 6 and dom.count("<path") > 50
    assert "What to do" in dom and "anomaly-2" in dom
    png = ARTIFACTS / "report.png"
    if png.exists():
        png.unlink()
    _, console = chromium(url, f"--screenshot={png}", "--window-size=1280,3200")
    assert console == []
    assert png.stat().st_size > 50_000
    import matplotlib.image as mpimg
    img = mpimg.imread(str(png))
    assert img.shape[1] == 1280
    # the page really drew something: many distinct colours (plots, shading, badges)
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200
    print(f"screenshot: {png}")


@needs_chromium
def test_console_check_catches_errors_and_blocked_loads(tmp_path):
    """The harness itself: an error or a blocked external load must show up."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><meta http-equiv=Content-Security-Policy content=\"default-src"
                   " 'none'; script-src 'unsafe-inline'\"><p>x</p><img src='https://example.com/"
                   "x.png'><script>console.error('boom')</script>")
    _, console = chromium(bad.as_uri(), "--dump-dom")
    text = "\n".join(console)
    assert "boom" in text and "Content Security Policy" in text


def test_job_page_has_one_section_per_node(tmp_path):
    reports = []
    for i, host in enumerate(("gpu01", "gpu02")):
        d = str(tmp_path / host)
        meta = make_run(d, seconds=40, host=host, seed=i, cpu_episode=(10, 20),
                        io_episode=None, gpus=2)
        rep = make_report(meta)
        rep["anomalies"] = rep["anomalies"][:1]
        reports.append((rep, d))
    html = render_job_html(reports, "777")
    assert "<section class=node id='node-gpu01'>" in html
    assert "<section class=node id='node-gpu02'>" in html
    assert "2 nodes, 2 anomalies in all" in html
    assert "GPU1 utilization" in html
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids))


def test_empty_and_calm_runs_read_sensibly(tmp_path):
    d = str(tmp_path / "empty")
    html = render_html(empty_report(make_empty_run(d)), d)
    assert "No telemetry was recorded for this run" in html and "<svg" not in html
    d2 = str(tmp_path / "calm")
    meta = make_run(d2, seconds=30, cpu_episode=None, io_episode=None, iterations=False)
    html = render_html(make_report(meta, anomalies=False), d2)
    assert "No anomalies." in html and "What to do" not in html
    assert "<svg" in html and "id='anomaly-" not in html


def test_cli_writes_html_next_to_the_run(report_run, capsys):
    d, _ = report_run
    assert report_main([d, "--format", "html"]) == 0
    out = os.path.join(d, "report.html")
    assert os.path.getsize(out) > 10_000
    assert "report.html" in capsys.readouterr().err


@pytest.mark.slow
def test_two_hour_run_stays_light(tmp_path):
    """7200 s at 1 Hz: every line is binned, so the page stays well under 1 MB."""
    d = str(tmp_path / "long")
    meta = make_run(d, seconds=7200, interval=1.0, cpu_episode=(3000, 3300),
                    io_episode=(5000, 5060), iterations=False, segment_s=60)
    rep = make_report(meta)
    rep["anomalies"][0]["end"] = rep["run"]["start"] + 3300
    html = render_html(rep, d)
    size = len(html.encode())
    print(f"2 h run: {size / 1024:.0f} KiB")
    assert size < 1_000_000
    # no path carries more than a few bins' worth of points
    longest = max(len(m) for m in re.findall(r' d="([^"]*)"', html))
    assert longest < 30_000


def test_downsampling_keeps_short_spikes_visible():
    from reveal_plugins.report.html import downsample
    t = np.arange(72_000) * 0.1
    y = np.zeros(72_000)
    y[12_345] = 100.0          # one 100 ms spike in a 2-hour run
    y[50_000:50_010] = np.nan  # a gap
    tm, mean, lo, hi = downsample(t, y, 500)
    assert len(tm) == len(mean) == len(hi) == 500
    assert np.nanmax(hi) == 100.0 and np.nanmax(mean) < 100.0
    assert np.all(np.diff(tm) > 0)


def test_progress_only_on_a_terminal():
    import io
    from reveal_plugins.report.progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    pipe, tty = io.StringIO(), Tty()
    for stream in (pipe, tty):
        p = Progress(stream=stream)
        p.update("drawing timelines", 2, 5)
        p.done()
    assert pipe.getvalue() == ""
    assert "drawing timelines 2/5" in tty.getvalue() and tty.getvalue().endswith("\x1b[2K")
