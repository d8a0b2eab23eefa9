"""The site configuration file, ``$REVEAL_CONFIG`` or ``/etc/reveal/reveal.toml``: read once
through the trust rule (root reads it only when root owns it and nothing above it is writable
by others), parsed as TOML, and refused whole when it holds a table nobody reads -- a
misspelled ``[otle]`` must not silently leave OpenTelemetry unconfigured.

Each room owns the model of its table (``[detect]``: :class:`reveal_plugins.detect.config.
DetectConfig`, ``[agent]``: :class:`reveal_plugins.agent.settings.AgentConfig`, ``[slurm]``:
:class:`reveal_plugins.slurm.config.SlurmConfig`, ``[otel]``:
:class:`reveal_plugins.otel.config.OtelTable`, ``[fleet]``:
:class:`reveal_plugins.fleet.config.FleetConfig`, ``[prometheus]``:
:class:`reveal_plugins.otel.prometheus.PrometheusTable`) and reads it with :func:`table`, which
validates it with that model: an unknown key or a bad value is an error naming the file, the
table, the key and the value.  ``reveal config show`` prints what is in force and from where.
"""
from __future__ import annotations

import os
from typing import Any, TypeVar

#: Where the file is when ``$REVEAL_CONFIG`` does not say.
DEFAULT_PATH = "/etc/reveal/reveal.toml"

#: The tables a component reads from this file (and where they are documented).
KNOWN_TABLES = {"agent": "the node agent, docs/config.md",
                "detect": "detection (with [detect.live] and [detect.peers]), docs/detection.md",
                "slurm": "the Slurm hooks, docs/slurm.md",
                "otel": "OpenTelemetry export, docs/otel.md",
                "fleet": "TLS of the fleet pass's Dask cluster, docs/fleet.md",
                "prometheus": "the agent's /metrics endpoint, docs/prometheus.md"}

M = TypeVar("M")


class SiteConfigError(ValueError):
    """The file cannot be used; the message names the file, the table or key, the value."""


def path_in_force(environ: Any = None) -> str | None:
    """``$REVEAL_CONFIG`` (it must exist), else the default file when present, else None."""
    env = os.environ if environ is None else environ
    p = env.get("REVEAL_CONFIG")
    if p:
        if not os.path.isfile(p):
            raise SiteConfigError(f"REVEAL_CONFIG={p!r}: no such file")
        return p
    return DEFAULT_PATH if os.path.isfile(DEFAULT_PATH) else None


def read(path: str) -> dict[str, Any]:
    """The whole file as a dict of tables; :class:`SiteConfigError` on anything wrong."""
    import tomllib

    from .trust import UntrustedPath, read_trusted
    try:
        data = tomllib.loads(read_trusted(path, "configuration file").decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SiteConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except UntrustedPath as e:
        raise SiteConfigError(str(e)) from None
    except OSError as e:
        raise SiteConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise SiteConfigError(f"{path}: not valid TOML: {e}") from None
    for key, val in data.items():
        if key not in KNOWN_TABLES:
            known = "; ".join(f"[{k}] ({v})" for k, v in KNOWN_TABLES.items())
            what = f"table [{key}]" if isinstance(val, dict) else f"top-level key {key!r}"
            raise SiteConfigError(f"{path}: unknown {what}; "
                                  f"this file holds only {known}")
        if not isinstance(val, dict):
            raise SiteConfigError(f"{path}: '{key}' must be a table ([{key}]), not "
                                  f"{type(val).__name__}")
    return data


def table(name: str, model: type[M], path: str | None = None, environ: Any = None
          ) -> tuple[M, str | None]:
    """Table ``[name]`` of the file in force (or ``path``), validated by the owner's pydantic
    ``model``; returns the model and the file it came from (None: no file, defaults)."""
    if name not in KNOWN_TABLES:
        raise KeyError(name)
    path = path or path_in_force(environ)
    if path is None:
        return model(), None
    raw = read(path).get(name, {})
    return validate(model, raw, f"{path}: [{name}]"), path


def validate(model: type[M], raw: dict[str, Any], where: str) -> M:
    """``model(**raw)``, with pydantic's complaint rewritten to name ``where``, the key (dotted
    for a sub-table) and the value."""
    from pydantic import ValidationError
    try:
        return model.model_validate(raw)          # type: ignore[attr-defined]
    except ValidationError as e:
        raise SiteConfigError(describe(e, where, model)) from None


def describe(e: Any, where: str, model: Any = None) -> str:
    """One line per problem: ``WHERE key 'a.b' = VALUE: what is wrong``."""
    lines = []
    for err in e.errors():
        key = ".".join(str(x) for x in err.get("loc", ()))
        if err.get("type") == "extra_forbidden":
            known = ""
            if model is not None and len(err.get("loc", ())) == 1:
                keys = [k for k, f in model.model_fields.items() if not f.exclude]
                known = f" (known: {', '.join(sorted(keys))})"
            lines.append(f"{where} unknown key {key!r}{known}")
        else:
            lines.append(f"{where} key {key!r} = {err.get('input')!r}: {err.get('msg')}")
    return "; ".join(lines) or f"{where} {e}"
