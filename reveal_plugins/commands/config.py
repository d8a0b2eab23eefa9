"""``reveal config show``: the settings in force for every part, and where each came from.

One file (``$REVEAL_CONFIG`` or ``/etc/reveal/reveal.toml``) with one table per part; each
part owns its table's model (:mod:`reveal_plugins.site_config`).  For every key this prints the
value in force and its source: the file, an environment variable, or the default.  Credentials
(OTLP headers, URL user info and query values) are shown redacted.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..cli_options import EXIT_OK, EXIT_USAGE, add_format

DEFAULT = "default"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal config", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{show}")
    show = sub.add_parser("show", help="the settings in force and where each came from",
                          description="The settings in force for every part ([agent], "
                          "[detect], [slurm], [otel], [fleet], [prometheus]) and where each "
                          "came from.")
    show.add_argument("--table", metavar="NAME", help="only this table (agent, detect, "
                      "slurm, otel, fleet, prometheus)")
    add_format(show)
    return ap


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "detectors":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _model_rows(model: Any, path: str | None, env: dict[str, str] | None = None
                ) -> list[dict[str, Any]]:
    """Every key of a pydantic model: value, and the file when the file set it."""
    given = _flat(model.model_dump(exclude_unset=True)) if path else {}
    rows = []
    for key, value in _flat(model.model_dump()).items():
        var = (env or {}).get(key.split(".")[0])
        source = (f"environment {var}" if var and os.environ.get(var) else
                  path if key in given else DEFAULT)
        rows.append({"key": key, "value": value, "source": source})
    return rows


def _agent() -> list[dict[str, Any]]:
    from .. import site_config
    from ..agent.settings import ENV_OF, AgentConfig
    model, path = site_config.table("agent", AgentConfig)
    return _model_rows(model, path, ENV_OF)


def _detect() -> list[dict[str, Any]]:
    from ..detect.config import site_detect
    model, path = site_detect()
    return _model_rows(model, path)


def _slurm() -> list[dict[str, Any]]:
    import dataclasses

    from ..slurm.config import SlurmConfig, load_config
    cfg = load_config()
    src = cfg.path + (" (REVEAL_SLURM_CONFIG)" if os.environ.get("REVEAL_SLURM_CONFIG") else "")
    rows = [{"key": f.name, "value": getattr(cfg, f.name),
             "source": src if f.name in cfg.given else DEFAULT}
            for f in dataclasses.fields(cfg) if f.name not in SlurmConfig.NOT_KEYS]
    if cfg.deprecation:
        rows.append({"key": "(note)", "value": cfg.deprecation, "source": cfg.path})
    return rows


def _otel() -> list[dict[str, Any]]:
    import dataclasses

    from ..otel import config as oc
    path = oc.config_file_path()
    sec = oc.read_file_section(path) if path else {}
    cfg = oc.load_config()
    env: dict[str, list[str]] = {}
    for var, key in oc.ENV_MAP:
        if os.environ.get(var, "").strip():
            env.setdefault(key, []).append(var)
    rows = []
    for f in dataclasses.fields(cfg):
        if f.name not in oc.FILE_KEYS:
            continue
        v = getattr(cfg, f.name)
        if f.name == "headers":
            v = oc.redact_headers(v)
        elif isinstance(v, str) and f.name.endswith("endpoint"):
            v = oc.redact_url(v)
        source = (f"environment {', '.join(env[f.name])}" if f.name in env else
                  path if f.name in sec else DEFAULT)
        rows.append({"key": f.name, "value": v, "source": source})
    return rows


def _fleet() -> list[dict[str, Any]]:
    from .. import site_config
    from ..fleet.config import FleetConfig
    model, path = site_config.table("fleet", FleetConfig)
    return _model_rows(model, path)


def _prometheus() -> list[dict[str, Any]]:
    from .. import site_config
    from ..otel.prometheus import PrometheusTable
    model, path = site_config.table("prometheus", PrometheusTable)
    return _model_rows(model, path, {"listen": "REVEAL_PROMETHEUS"})


TABLES = {"agent": _agent, "detect": _detect, "slurm": _slurm, "otel": _otel,
          "fleet": _fleet, "prometheus": _prometheus}


def show(only: str | None = None) -> dict[str, Any]:
    """``{"file": path or None, "tables": {name: [rows]}}``; raises ValueError (naming the file,
    table, key and value) when a table is invalid."""
    from .. import site_config
    return {"file": site_config.path_in_force(),
            "tables": {name: fn() for name, fn in TABLES.items() if only in (None, name)}}


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None or v == "":
        return "(unset)"
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.table and args.table not in TABLES:
        print(f"reveal config show: --table {args.table!r}: not one of {', '.join(TABLES)}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        doc = show(args.table)
    except ValueError as e:    # SiteConfigError, ConfigError, OtelConfigError
        print(f"reveal config show: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        json.dump(doc, sys.stdout, indent=1, default=str)
        print()
        return EXIT_OK
    print(f"configuration file: {doc['file'] or '(none: every table at its defaults)'}")
    for name, rows in doc["tables"].items():
        print(f"\n[{name}]")
        width = max(len(r["key"]) for r in rows)
        for r in rows:
            print(f"  {r['key']:<{width}}  {_fmt(r['value'])}    ({r['source']})")
    return EXIT_OK
