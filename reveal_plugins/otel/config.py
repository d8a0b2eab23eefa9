"""Where OpenTelemetry export goes, read once per export from the environment and a config file.

Sources, highest precedence first:

1. explicit overrides (``reveal otel export --endpoint ...``, or the hook's ``config["otel"]``);
2. the standard ``OTEL_EXPORTER_OTLP_*`` environment variables (the ``..._TRACES_...`` /
   ``..._METRICS_...`` variants win over the generic ones), ``OTEL_SERVICE_NAME``,
   ``OTEL_SDK_DISABLED``;
3. the ``[otel]`` section of the project's config file: ``$REVEAL_CONFIG`` if set, else
   ``/etc/reveal/reveal.toml`` if it exists;
4. defaults.

Export is **off** unless an endpoint is configured somewhere (or ``OTEL_SDK_DISABLED=true`` /
``[otel] enabled = false`` turns it off explicitly).  Bad values raise :class:`OtelConfigError`
naming the file or variable, the key and the value.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field

from ..site_config import DEFAULT_PATH as DEFAULT_CONFIG_FILE  # noqa: F401  (re-exported)

PROTOCOLS = ("http/protobuf", "grpc")
COMPRESSIONS = ("none", "gzip")
DEFAULT_HTTP_PORT = 4318
DEFAULT_GRPC_PORT = 4317


class OtelConfigError(ValueError):
    """A configuration value is wrong; the message names where it came from, key and value."""


# -- credentials never leave in logs or otel.json ------------------------------------------

REDACTED = "***"
#: Header (and URL query parameter) names whose values are credentials.  Redaction no longer
#: depends on it (every header value and every query value is redacted: ``x-honeycomb-team``,
#: ``?sig=`` are credentials no name list foresees); kept for callers that sort names.
SENSITIVE_NAME = re.compile(r"auth|token|key|secret|pass|cookie|credential|signature", re.I)


def sensitive(name: str) -> bool:
    return bool(SENSITIVE_NAME.search(name))


def redact_url(url: str) -> str:
    """``https://user:pass@host/p?api_key=x&sig=y`` -> ``https://***@host/p?api_key=***&sig=***``:
    user info and every query value (a bare query item whole), whatever its name."""
    try:
        u = urllib.parse.urlsplit(url)
    except ValueError:
        return re.sub(r"(?<=//)[^/?#]*@", REDACTED + "@", url)
    netloc = u.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rpartition("@")[2]
    query = "&".join((f"{k}={REDACTED}" if eq else REDACTED) if k or eq else ""
                     for k, eq, x in (p.partition("=") for p in u.query.split("&")))
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, query, u.fragment))


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Every value redacted: a header's name does not say whether it carries a credential."""
    return {k: REDACTED for k in headers}


@dataclass
class OtelConfig:
    """Effective OTLP export settings.

    ``endpoint`` is the *base* URL (``http://collector:4318``); :meth:`signal_endpoint` gives the
    URL a given signal is sent to.  ``budget_s`` is the most a job end (sink hook) waits for an
    export; ``timeout_s`` bounds one request when nobody is waiting on it (re-export, metrics).
    """

    enabled: bool = False                    # false: no export even with an endpoint set
    endpoint: str | None = None              # OTLP base URL, e.g. http://collector:4318
    traces_endpoint: str | None = None      # full URL, used as is (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    metrics_endpoint: str | None = None      # full URL for metrics, used as is
    protocol: str = "http/protobuf"          # http/protobuf or grpc
    headers: dict[str, str] = field(default_factory=dict)  # request headers (credentials)
    timeout_s: float = 10.0                  # one request when nobody waits (re-export)
    budget_s: float = 1.0                    # the most a job end waits for its export
    compression: str = "none"                # none or gzip
    insecure: bool | None = None             # gRPC only; None = decide from the URL scheme
    certificate: str | None = None           # CA bundle (PEM) for https/TLS endpoints
    service_name: str = "reveal"             # service.name of the traces and metrics
    resource_attributes: dict[str, str] = field(default_factory=dict)  # extra resource attrs
    metrics: bool = False                    # live metrics from the node agent
    metrics_interval_s: float = 10.0         # seconds between live metric exports
    max_evidence: int = 5                    # evidence channels put on an anomaly span
    max_anomalies: int = 200                 # anomaly spans per run (highest scores first)
    source: str = "defaults"                 # where the endpoint came from (for messages)

    @property
    def display_endpoint(self) -> str:
        """The endpoint traces go to, for log lines (credentials redacted)."""
        return redact_url(self.signal_endpoint("traces")) if self.enabled else "(export off)"

    def secrets(self) -> list[str]:
        """The credential strings of this configuration (URL user info, sensitive query
        values, header values: all of them, whatever their name), longest first: what :meth:`redact` removes."""
        out: set[str] = set()
        for url in (self.endpoint, self.traces_endpoint, self.metrics_endpoint):
            if not url:
                continue
            u = urllib.parse.urlsplit(url)
            if "@" in u.netloc:
                info = u.netloc.rpartition("@")[0]
                user, colon, pw = info.partition(":")
                out.update((info, pw) if colon else (info,))   # no password: user is a token
            for k, eq, x in (p.partition("=") for p in u.query.split("&")):
                out.add(x if eq else k)
            if u.query:
                out.add(u.query)
        out.update(v for v in self.headers.values() if v)
        out |= {urllib.parse.unquote(x) for x in out} | {urllib.parse.quote(x) for x in out}
        out.update(p for v in list(out) for p in v.split() if len(p) >= 8)   # "Bearer <tok>"
        return sorted((x for x in out if len(x) >= 3), key=len, reverse=True)

    def redact(self, text: str | None) -> str | None:
        """``text`` (an error message, a log line) with every credential replaced by ***."""
        if not text:
            return text
        for x in self.secrets():
            text = text.replace(x, REDACTED)
        return re.sub(r"(?<=//)[^/\s@'\"]+@", REDACTED + "@", text)

    def signal_endpoint(self, signal: str) -> str:
        """URL (http) or target (grpc) for ``signal`` in ``traces`` | ``metrics``."""
        explicit = self.traces_endpoint if signal == "traces" else self.metrics_endpoint
        if explicit:
            return explicit
        base = self.endpoint or (f"http://localhost:{DEFAULT_GRPC_PORT}" if self.protocol == "grpc"
                                 else f"http://localhost:{DEFAULT_HTTP_PORT}")
        if self.protocol == "grpc":
            return base
        return base.rstrip("/") + f"/v1/{signal}"

    def grpc_insecure(self, signal: str = "traces") -> bool:
        if self.insecure is not None:
            return self.insecure
        return not self.signal_endpoint(signal).lower().startswith("https://")

    def replace(self, **kw: Any) -> "OtelConfig":
        return dataclasses.replace(self, **kw)


# -- parsing helpers --------------------------------------------------------------------------

def _bool(where: str, key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise OtelConfigError(f"{where}: {key} = {v!r}: expected true or false")


#: Upper bound of every number option: a day (seconds) or a million (counts).  ``inf`` or a
#: huge value would make a wait never end or raise OverflowError deep inside threading.
MAX_NUMBER = 86400.0


def _float(where: str, key: str, v: Any, minimum: float = 0.0,
           maximum: float = MAX_NUMBER) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        raise OtelConfigError(f"{where}: {key} = {v!r}: expected a number") from None
    if not math.isfinite(f):
        raise OtelConfigError(f"{where}: {key} = {v!r}: must be a finite number")
    if not f > minimum:
        raise OtelConfigError(f"{where}: {key} = {v!r}: must be greater than {minimum:g}")
    if f > maximum:
        raise OtelConfigError(f"{where}: {key} = {v!r}: must be at most {maximum:g}")
    return f


def _env_timeout(name: str, raw: str) -> float:
    """``OTEL_EXPORTER_OTLP_TIMEOUT`` is milliseconds by the OTel specification; older Python
    SDKs read it as seconds, so a value of at most 60 is taken as seconds."""
    f = _float(f"environment variable {name}", name, raw, maximum=MAX_NUMBER * 1000)
    return f if f <= 60 else f / 1000.0


def _protocol(where: str, key: str, v: Any) -> str:
    s = str(v).strip().lower()
    if s == "http":
        s = "http/protobuf"
    if s not in PROTOCOLS:
        hint = " (http/json is not supported by the Python OTLP exporters)" if s == "http/json" else ""
        raise OtelConfigError(f"{where}: {key} = {v!r}: must be one of {', '.join(PROTOCOLS)}{hint}")
    return s


def _endpoint(where: str, key: str, v: Any) -> str:
    s = str(v).strip()
    shown = redact_url(s)
    try:
        u = urllib.parse.urlsplit(s)
        u.port
    except ValueError:
        raise OtelConfigError(f"{where}: {key} = {shown!r}: bad port or address") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise OtelConfigError(f"{where}: {key} = {shown!r}: expected a URL like "
                              "http://collector:4318")
    return s


def parse_headers(where: str, key: str, v: Any) -> dict[str, str]:
    """``k1=v1,k2=v2`` (URL-encoded values, as in ``OTEL_EXPORTER_OTLP_HEADERS``) or a mapping."""
    if isinstance(v, Mapping):
        return {str(k).strip().lower(): str(x) for k, x in v.items()}
    out: dict[str, str] = {}
    for n, part in enumerate(str(v).split(","), 1):
        if not part.strip():
            continue
        if "=" not in part:
            # Never echo the text: it is likely "authorization: Bearer <token>".
            name = re.split(r"[\s:]", part.strip(), maxsplit=1)[0][:40]
            raise OtelConfigError(f"{where}: {key}: entry {n} (starting {name!r}) is not "
                                  "key=value (values are not shown: they are often "
                                  "credentials)")
        k, _, x = part.partition("=")
        k = urllib.parse.unquote(k).strip().lower()
        if not k:
            raise OtelConfigError(f"{where}: {key}: entry {n} has an empty header name")
        out[k] = urllib.parse.unquote(x).strip()
    return out


def _resource_attrs(where: str, key: str, v: Any) -> dict[str, str]:
    if isinstance(v, Mapping):
        return {str(k): str(x) for k, x in v.items()}
    return parse_headers(where, key, v)


# -- the config file ------------------------------------------------------------------------

class OtelTable(BaseModel):
    """Keys of ``[otel]`` as the file may write them (types checked here, values -- URLs,
    choices, ranges -- by :func:`load_config`, which applies the same checks to the ``OTEL_*``
    variables).  Lax types: ``timeout_s = "5"`` and ``insecure = "yes"`` are read as meant."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="false: no export even with an endpoint set")
    endpoint: str | None = Field(None, description="OTLP base URL, e.g. "
                                 "http://collector:4318")
    traces_endpoint: str | None = Field(None, description="full URL for traces, used as is")
    metrics_endpoint: str | None = Field(None, description="full URL for metrics, used as is")
    protocol: str = Field("http/protobuf", description="http/protobuf or grpc")
    headers: dict[str, str] | str = Field({}, description="request headers (credentials): "
                                          "a table or k1=v1,k2=v2")
    timeout_s: float = Field(10.0, gt=0, le=MAX_NUMBER, allow_inf_nan=False,
                             description="one request when nobody waits (re-export, "
                             "metrics), seconds")
    budget_s: float = Field(1.0, gt=0, le=MAX_NUMBER, allow_inf_nan=False,
                            description="the most a job end waits for its export, seconds "
                            "(a detached analysis waits timeout_s)")
    compression: str = Field("none", description="none or gzip")
    insecure: bool | None = Field(None, description="gRPC only; unset: decided from the URL "
                                  "scheme")
    certificate: str | None = Field(None, description="CA bundle (PEM) for https/TLS "
                                    "endpoints")
    service_name: str = Field("reveal", description="service.name of the traces and metrics")
    resource_attributes: dict[str, str] | str = Field({}, description="extra resource "
                                                      "attributes: a table or k1=v1,k2=v2")
    metrics: bool = Field(False, description="live metrics from the node agent")
    metrics_interval_s: float = Field(10.0, gt=0, le=MAX_NUMBER, allow_inf_nan=False,
                                      description="seconds between live metric exports")
    max_evidence: int = Field(5, gt=0, le=1_000_000, description="evidence channels put on an "
                              "anomaly span")
    max_anomalies: int = Field(200, gt=0, le=1_000_000, description="anomaly spans per run "
                               "(highest scores first)")


FILE_KEYS = set(OtelTable.model_fields)


def config_file_path(environ: Mapping[str, str] | None = None) -> str | None:
    """``$REVEAL_CONFIG`` (must exist), else ``/etc/reveal/reveal.toml`` when present, else None."""
    from .. import site_config
    try:
        return site_config.path_in_force(environ)
    except site_config.SiteConfigError as e:
        raise OtelConfigError(str(e)) from None


def read_file_section(path: str) -> dict[str, Any]:
    """The keys the ``[otel]`` table of a TOML file sets ({} when absent), validated by
    :class:`OtelTable`: an unknown key or a wrong type names the file, key and value."""
    from .. import site_config
    try:
        table, _ = site_config.table("otel", OtelTable, path)
    except site_config.SiteConfigError as e:
        raise OtelConfigError(str(e)) from None
    return table.model_dump(exclude_unset=True)


def _apply(cfg: OtelConfig, where: str, values: Mapping[str, Any]) -> None:
    for key, v in values.items():
        w = f"{where} [otel]" if not where.startswith("environment") else where
        if key in ("endpoint", "traces_endpoint", "metrics_endpoint"):
            setattr(cfg, key, _endpoint(w, key, v))
        elif key == "protocol":
            cfg.protocol = _protocol(w, key, v)
        elif key == "headers":
            cfg.headers.update(parse_headers(w, key, v))
        elif key in ("timeout_s", "budget_s", "metrics_interval_s"):
            setattr(cfg, key, _float(w, key, v))
        elif key in ("max_evidence", "max_anomalies"):
            setattr(cfg, key, int(_float(w, key, v, maximum=1e6)))
        elif key == "compression":
            c = str(v).strip().lower()
            if c not in COMPRESSIONS:
                raise OtelConfigError(f"{w}: {key} = {v!r}: must be one of {', '.join(COMPRESSIONS)}")
            cfg.compression = c
        elif key in ("enabled", "insecure", "metrics"):
            setattr(cfg, key, _bool(w, key, v))
        elif key == "resource_attributes":
            cfg.resource_attributes.update(_resource_attrs(w, key, v))
        elif key in ("certificate", "service_name"):
            setattr(cfg, key, str(v))
        else:
            raise OtelConfigError(f"{w}: unknown key {key!r}; known: {sorted(FILE_KEYS)}")


ENV_MAP = (
    # (variable, key); later entries win, so signal-specific variables come after generic ones
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "endpoint"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "traces_endpoint"),
    ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "metrics_endpoint"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "protocol"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "protocol"),
    ("OTEL_EXPORTER_OTLP_HEADERS", "headers"),
    ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "headers"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "timeout_s"),
    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "timeout_s"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "compression"),
    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "compression"),
    ("OTEL_EXPORTER_OTLP_INSECURE", "insecure"),
    ("OTEL_EXPORTER_OTLP_CERTIFICATE", "certificate"),
    ("OTEL_SERVICE_NAME", "service_name"),
    ("OTEL_RESOURCE_ATTRIBUTES", "resource_attributes"),
    ("REVEAL_OTEL_METRICS", "metrics"),
    ("REVEAL_OTEL_BUDGET_S", "budget_s"),
)


def load_config(overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None,
                config_file: str | None = None) -> OtelConfig:
    """The effective configuration (see the module docstring for precedence).

    ``config_file`` replaces the ``$REVEAL_CONFIG`` / ``/etc/reveal/reveal.toml`` lookup (tests).
    """
    env = os.environ if environ is None else environ
    cfg = OtelConfig(headers={}, resource_attributes={})
    path = config_file if config_file is not None else config_file_path(env)
    file_enabled = None
    sec: dict[str, Any] = {}
    if path:
        sec = read_file_section(path)
        _apply(cfg, path, sec)
        if "enabled" in sec:
            file_enabled = cfg.enabled
        if any(sec.get(k) for k in ("endpoint", "traces_endpoint")):
            cfg.source = path
    for var, key in ENV_MAP:
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            continue
        where = f"environment variable {var}"
        if key == "timeout_s":
            cfg.timeout_s = _env_timeout(var, raw)
        else:
            _apply(cfg, where, {key: raw})
        if key in ("endpoint", "traces_endpoint"):
            cfg.source = var
    if overrides:
        _apply(cfg, "overrides", {k: v for k, v in overrides.items() if v is not None})
        if overrides.get("endpoint") or overrides.get("traces_endpoint"):
            cfg.source = "command line"
    protocol_set = bool((path and "protocol" in sec) or any(
        env.get(v, "").strip() for v in ("OTEL_EXPORTER_OTLP_PROTOCOL",
                                         "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
        or (overrides and overrides.get("protocol")))
    if not protocol_set:
        # The well-known gRPC port with no protocol named: a common slip (the spec's default
        # is http/protobuf, which a gRPC-only receiver on 4317 would refuse).
        url = cfg.traces_endpoint or cfg.endpoint
        if url and urllib.parse.urlsplit(url).port == DEFAULT_GRPC_PORT:
            cfg.protocol = "grpc"
    configured = bool(cfg.endpoint or cfg.traces_endpoint)
    cfg.enabled = configured
    if file_enabled is False and not (overrides and (overrides.get("endpoint")
                                                     or overrides.get("traces_endpoint"))):
        cfg.enabled = False
    if _bool("environment variable OTEL_SDK_DISABLED", "OTEL_SDK_DISABLED",
             env.get("OTEL_SDK_DISABLED", "false")):
        cfg.enabled = False
    if overrides and overrides.get("enabled") is not None:
        cfg.enabled = bool(overrides["enabled"]) and configured
    return cfg
