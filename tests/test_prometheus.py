"""The agent's Prometheus endpoint, scraped for real: node series and a ``reveal_job_info``
series that lives exactly as long as the job; never a listener without credentials."""
import os
import socket
import ssl
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("opentelemetry.exporter.prometheus")

from reveal_plugins.otel.prometheus import PrometheusConfigError, load_prometheus_config  # noqa: E402
from reveal_plugins.types import RunInfo  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def conf(tmp_path, text):
    p = tmp_path / "reveal.toml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,match", [
    ('listen = "0.0.0.0:9464"\n', "without TLS refused"),
    ('listen = "127.0.0.1:9464"\n', "without TLS refused"),
    ('listen = "10.1.2.3:9464"\nplaintext = true\n', "without TLS refused"),
    ('listen = "localhost:9464"\nplaintext = true\n', "HOST must be an IP address"),
    ('listen = "127.0.0.1"\n', "expected HOST:PORT"),
    ('listen = "127.0.0.1:9464"\nplaintext = "yes"\n',
     r"\[prometheus\] key 'plaintext' = 'yes': Input should be a valid boolean"),
    ('listen = 9464\n', r"\[prometheus\] key 'listen' = 9464: Input should be a valid string"),
    ('listen = "0.0.0.0:9464"\ntls_cert = "/x.pem"\n', "needs all of"),
    ('lisen = "127.0.0.1:9464"\n',
     r"reveal.toml: \[prometheus\] unknown key 'lisen' \(known: client_ca, listen, "),
])
def test_unsafe_or_invalid_settings_are_refused_with_the_reason(tmp_path, text, match):
    with pytest.raises(PrometheusConfigError, match=match):
        load_prometheus_config(conf(tmp_path, "[prometheus]\n" + text), environ={})


def test_not_configured_means_no_endpoint(tmp_path):
    assert load_prometheus_config(conf(tmp_path, "[otel]\n"), environ={}) is None
    with pytest.raises(PrometheusConfigError, match="REVEAL_PROMETHEUS"):
        load_prometheus_config(conf(tmp_path, ""), environ={"REVEAL_PROMETHEUS": "0.0.0.0:1"})


@pytest.fixture
def agent_with(tmp_path, monkeypatch):
    started = []

    def start(text):
        from reveal_plugins.agent.daemon import Agent
        for k in list(os.environ):
            if k.startswith(("OTEL_", "REVEAL_OTEL", "REVEAL_PROMETHEUS")):
                monkeypatch.delenv(k)
        monkeypatch.setenv("REVEAL_CONFIG", conf(tmp_path, text))
        a = Agent(str(tmp_path / "spool"), interval_s=0.1)
        a.start()
        started.append(a)
        return a
    yield start
    for a in started:
        a.stop()


def scrape(url, context=None, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
        assert r.status == 200
        return r.read().decode()


def wait_for(pred, what, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(what)


def test_loopback_scrape_shows_node_metrics_and_running_jobs_only(agent_with, tmp_path):
    from reveal_plugins.agent.client import AgentClient
    port = free_port()
    a = agent_with(f'[prometheus]\nlisten = "127.0.0.1:{port}"\nplaintext = true\n')
    url = f"http://127.0.0.1:{port}/metrics"
    text = wait_for(lambda: (t := scrape(url)) and "system_cpu_utilization" in t and t,
                    "no CPU series")
    assert "reveal_runs_active" in text and "reveal_job_info" not in text.replace(
        "# HELP reveal_job_info", "").replace("# TYPE reveal_job_info", "")
    client = AgentClient(a.sock_path)
    client.register(RunInfo(run_id="slurm-4242", run_dir=str(tmp_path / "r"), source="slurm",
                            job_id="4242", user="alice", uid=os.getuid()))
    line = 'reveal_job_info{job_id="4242",user="alice"} 1.0'
    wait_for(lambda: line in scrape(url), "the running job has no reveal_job_info series")
    client.unregister("slurm-4242")
    wait_for(lambda: 'job_id="4242"' not in scrape(url),
             "the job's series outlived the job (unbounded cardinality)")


def test_a_refused_setting_opens_no_port(agent_with):
    port = free_port()
    agent_with(f'[prometheus]\nlisten = "0.0.0.0:{port}"\n')
    time.sleep(0.5)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.skipif(os.geteuid() != 0, reason="TLS files are judged by the root trust rule")
def test_mutual_tls_admits_only_scrapers_with_a_certificate(agent_with, tmp_path):
    from distributed.security import Security
    tmp = Security.temporary()
    d = tmp_path / "tls"
    d.mkdir(mode=0o755)
    files = {}
    for k, text in (("ca", tmp.tls_ca_file), ("cert", tmp.tls_scheduler_cert),
                    ("key", tmp.tls_scheduler_key)):
        (d / k).write_text(text)
        os.chmod(d / k, 0o600 if k == "key" else 0o644)
        files[k] = str(d / k)
    port = free_port()
    agent_with(f'[prometheus]\nlisten = "127.0.0.1:{port}"\ntls_cert = "{files["cert"]}"\n'
               f'tls_key = "{files["key"]}"\nclient_ca = "{files["ca"]}"\n')
    url = f"https://127.0.0.1:{port}/metrics"
    ctx = ssl.create_default_context(cafile=files["ca"])
    ctx.check_hostname = False          # Dask's temporary certificate names no IP address
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError, OSError)):
        scrape(url, ctx)                # no client certificate: refused
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        scrape(f"http://127.0.0.1:{port}/metrics")    # plain HTTP: refused
    ctx.load_cert_chain(files["cert"], files["key"])
    wait_for(lambda: "system_memory_usage_bytes{" in scrape(url, ctx), "no scrape over mTLS")


def test_the_grafana_dashboard_queries_only_series_the_endpoint_serves():
    """examples/grafana-reveal-node.json: every metric its queries name is one the real
    OpenTelemetry Prometheus reader produces from the agent's instruments (names with units
    and _total suffixes are the exporter's, so they are taken from it, not written down)."""
    import json
    import re
    import sys

    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, generate_latest

    from reveal_plugins.otel.config import OtelConfig
    from reveal_plugins.otel.metrics import LiveMetrics
    sys.path.insert(0, os.path.dirname(__file__))
    from test_otel_metrics import GpuHostAgent
    reg = CollectorRegistry(auto_describe=True)
    live = LiveMetrics(GpuHostAgent(), OtelConfig(), job_info=True,
                       reader=PrometheusMetricReader(scope_info_enabled=False, registry=reg))
    live.start()
    live.record_finding({"subsystem": "gpu", "score": 4.0})
    generate_latest(reg)            # the CPU utilization needs two snapshots
    time.sleep(0.6)
    served = {ln.split("{")[0].split(" ")[0] for ln in generate_latest(reg).decode().splitlines()
              if ln and not ln.startswith("#")}
    live.stop()
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "grafana-reveal-node.json")
    with open(path) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    bare = [re.sub(r"\{[^}]*\}|\b(?:by|on|ignoring|group_left)\s*\([^)]*\)", "", e)
            for e in exprs]         # label matchers and groupings name labels, not series
    named = {m for e in bare for m in re.findall(r"\b((?:hw|system|reveal)_[a-z_]+)\b", e)}
    assert named and named <= served, sorted(named - served)
    assert {"reveal_job_info", "hw_gpu_utilization", "system_cpu_utilization"} <= named
