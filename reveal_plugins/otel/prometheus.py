"""The node agent's live metrics on a Prometheus ``/metrics`` endpoint, for sites that scrape
rather than run an OpenTelemetry collector.

The same :class:`~reveal_plugins.otel.metrics.LiveMetrics` instruments feed it as feed OTLP
(one metric model), read through OpenTelemetry's Prometheus reader: ``hw_gpu_utilization``,
``hw_power_watts``, ``system_cpu_utilization`` ... plus ``reveal_job_info{job_id, user}`` = 1
for each job running on the node, so a query can join node metrics to jobs the way jobstats
does.  Cardinality stays bounded: a job's series exists only while it runs.

Configured by the ``[prometheus]`` table of reveal.toml (or ``REVEAL_PROMETHEUS=HOST:PORT``):

    [prometheus]
    listen = "0.0.0.0:9464"          # HOST:PORT
    tls_cert = "/etc/reveal/prom.crt"  # server certificate (PEM)
    tls_key = "/etc/reveal/prom.key"
    client_ca = "/etc/reveal/scraper-ca.crt"   # only scrapers with a cert from this CA
    # plaintext = true               # loopback only, without TLS (see below)

Security: the agent runs as root and the endpoint names the users with jobs on the node, so it
never listens without credentials: any address needs ``tls_cert``, ``tls_key`` and
``client_ca`` (mutual TLS), except a loopback address with ``plaintext = true`` (every local
user can then read it, as they can read ``squeue``).  Refused settings are logged and nothing
listens."""
from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class PrometheusTable(BaseModel):
    """Keys of ``[prometheus]`` (``$REVEAL_PROMETHEUS`` wins over ``listen``)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    listen: str | None = Field(None, description="HOST:PORT of /metrics; HOST an IP address "
                               "(unset: no endpoint)")
    tls_cert: str | None = Field(None, description="server certificate (PEM)")
    tls_key: str | None = Field(None, description="its private key (PEM)")
    client_ca: str | None = Field(None, description="only scrapers with a certificate from "
                                  "this CA (mutual TLS)")
    plaintext: bool = Field(False, description="without TLS, allowed on a loopback address "
                            "only (every local user can then read it)")



class PrometheusConfigError(ValueError):
    """The [prometheus] settings cannot be used; the message names the key and value."""


@dataclass
class PrometheusConfig:
    host: str
    port: int
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    plaintext: bool = False
    source: str = ""


def _listen(where: str, v: Any) -> tuple[str, int]:
    s = str(v).strip()
    host, sep, port = s.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PrometheusConfigError(f"{where}: listen = {v!r}: expected HOST:PORT, e.g. "
                                    "127.0.0.1:9464")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise PrometheusConfigError(f"{where}: listen = {v!r}: HOST must be an IP address "
                                    "(a name could resolve to another interface)") from None
    return host, int(port)


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def load_prometheus_config(config_file: str | None = None,
                           environ: dict[str, str] | None = None) -> PrometheusConfig | None:
    """The endpoint's settings, or None when Prometheus is not configured; raises
    :class:`PrometheusConfigError` when they are configured but unsafe or invalid."""
    env = os.environ if environ is None else environ
    from .config import config_file_path
    path = config_file if config_file is not None else config_file_path(env)
    sec: dict[str, Any] = {}
    if path:
        from .. import site_config
        try:
            table, _ = site_config.table("prometheus", PrometheusTable, path)
        except site_config.SiteConfigError as e:
            raise PrometheusConfigError(str(e)) from None
        sec = table.model_dump(exclude_unset=True)
    where = f"{path} [prometheus]" if sec else ""
    if env.get("REVEAL_PROMETHEUS"):
        sec["listen"], where = env["REVEAL_PROMETHEUS"], "REVEAL_PROMETHEUS"
    if "listen" not in sec:
        if sec:
            raise PrometheusConfigError(f"{where}: no listen = \"HOST:PORT\"")
        return None
    host, port = _listen(where, sec["listen"])
    plaintext = bool(sec.get("plaintext", False))
    cfg = PrometheusConfig(host, port, sec.get("tls_cert"), sec.get("tls_key"),
                           sec.get("client_ca"), plaintext, where)
    tls = [cfg.tls_cert, cfg.tls_key, cfg.client_ca]
    if any(tls) and not all(tls):
        raise PrometheusConfigError(f"{where}: mutual TLS needs all of tls_cert, tls_key and "
                                    "client_ca")
    if not any(tls):
        if not (plaintext and is_loopback(host)):
            raise PrometheusConfigError(
                f"{where}: listen = {sec['listen']!r} without TLS refused: the endpoint names "
                "the users with jobs on this node. Set tls_cert, tls_key and client_ca (mutual "
                "TLS), or listen on 127.0.0.1 with plaintext = true (every local user can "
                "then read it)")
    for k in ("tls_cert", "tls_key", "client_ca"):
        p = getattr(cfg, k)
        if p and os.geteuid() == 0:
            from ..trust import untrusted_reason
            why = untrusted_reason(p)
            if why:
                raise PrometheusConfigError(f"{where}: {k} = {p!r}: {why}")
    return cfg


class PrometheusEndpoint:
    """``/metrics`` over HTTP(S) for one agent; ``stop`` closes the listener."""

    def __init__(self, agent: Any, cfg: PrometheusConfig, otel_cfg: Any):
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry

        from .metrics import LiveMetrics
        self.cfg = cfg
        self.registry = CollectorRegistry(auto_describe=True)   # this agent's series only
        reader = PrometheusMetricReader(scope_info_enabled=False, registry=self.registry)
        self.live = LiveMetrics(agent, otel_cfg, reader=reader, job_info=True)
        self._server: Any = None

    def start(self) -> None:
        from prometheus_client import start_http_server
        self.live.start()
        kw: dict[str, Any] = {}
        if self.cfg.tls_cert:
            kw = {"certfile": self.cfg.tls_cert, "keyfile": self.cfg.tls_key,
                  "client_cafile": self.cfg.client_ca, "client_auth_required": True}
        try:
            self._server, _ = start_http_server(self.cfg.port, self.cfg.host,
                                                registry=self.registry, **kw)
        except BaseException:   # port taken, bad key: no reader left running without a listener
            self.live.stop(timeout_s=1.0)
            raise
        log.info("Prometheus metrics on %s://%s:%d/metrics", "https" if kw else "http",
                 self.cfg.host, self.port)

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server else self.cfg.port

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        self.live.stop(timeout_s=1.0)
