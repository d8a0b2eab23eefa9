"""The site configuration file, ``$REVEAL_CONFIG`` or ``/etc/reveal/reveal.toml``: read once
through the trust rule (root reads it only when root owns it and nothing above it is writable
by others), parsed as TOML, and refused whole when it holds a table nobody reads -- a
misspelled ``[otle]`` must not silently leave OpenTelemetry unconfigured."""
from __future__ import annotations

from typing import Any

#: The tables a component reads from this file (and where they are documented).
KNOWN_TABLES = {"otel": "OpenTelemetry export, docs/otel.md",
                "fleet": "TLS of the fleet pass's Dask cluster, docs/fleet.md",
                "prometheus": "the agent's /metrics endpoint, docs/prometheus.md"}


class SiteConfigError(ValueError):
    """The file cannot be used; the message names the file, the table or key, the value."""


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
