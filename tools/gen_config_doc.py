"""Write docs/config.md from the code that reads the settings (keys, types, defaults, ranges,
the comment beside each field), so the reference cannot drift from what is enforced.

    python tools/gen_config_doc.py            # rewrite docs/config.md
    python tools/gen_config_doc.py --check    # exit 1 when docs/config.md is stale (the tests)
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "config.md")
sys.path.insert(0, ROOT)

FLEET = {"tls_ca_file": "CA (PEM) that signed the fleet cluster's certificates",
         "tls_cert": "certificate (PEM) of the fleet pass, its scheduler and workers",
         "tls_key": "its private key (PEM; not readable by others)"}
PROMETHEUS = {"listen": ("", "`HOST:PORT` (an IP address) of the agent's `/metrics` endpoint; "
                             "unset: no endpoint"),
              "tls_cert": ("", "server certificate (PEM)"),
              "tls_key": ("", "its private key (PEM)"),
              "client_ca": ("", "CA (PEM) whose certificates scrapers must present (mutual "
                                "TLS)"),
              "plaintext": ("false", "`true`: plain HTTP, allowed only on a loopback address")}


def _comments(cls) -> dict[str, str]:
    out = {}
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+): [^=]+=.*?#\s*(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip().replace("|", "\\|")
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:
        v = f.default_factory()
    else:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v in ("", None, {}):
        return "(unset)"
    return f"`{v!r}`" if isinstance(v, str) else f"`{v}`"


def slurm_rows() -> list[str]:
    from reveal_plugins.slurm.config import _CHOICES, _RANGES, SlurmConfig
    com = _comments(SlurmConfig)
    rows = []
    for f in dataclasses.fields(SlurmConfig):
        if f.name in SlurmConfig.NOT_KEYS:
            continue
        allowed = (" \\| ".join(_CHOICES[f.name]) if f.name in _CHOICES else
                   f"≥ {_RANGES[f.name][0]:g} and ≤ {_RANGES[f.name][1]:g}"
                   if f.name in _RANGES else "")
        rows.append(f"| `{f.name}` | {f.type} | {_default(f)} | {allowed} | "
                    f"{com.get(f.name, '')} |")
    return rows


def _allowed(f) -> str:
    import typing
    args = typing.get_args(f.annotation)
    if typing.get_origin(f.annotation) is typing.Literal:
        return " \\| ".join(str(a) for a in args)
    parts = []
    for m in f.metadata:
        for name, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            v = getattr(m, name, None)
            if v is not None:
                parts.append(f"{sym} {v:g}")
    return " and ".join(parts)


def _type(f) -> str:
    import typing
    if typing.get_origin(f.annotation) is typing.Literal:
        return "str"
    return getattr(f.annotation, "__name__", str(f.annotation)).replace("typing.", "")


def model_rows(model, skip=()) -> list[str]:
    """One row per key of a pydantic model (sub-tables are listed in their own section)."""
    from pydantic import BaseModel
    rows = []
    for name, f in model.model_fields.items():
        if f.exclude or name in skip:
            continue
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            continue
        d = f.get_default(call_default_factory=True)
        default = ("true" if d else "false") if isinstance(d, bool) else \
            "(unset)" if d in ("", None, {}) else f"`{d!r}`" if isinstance(d, str) else f"`{d}`"
        meaning = (f.description or "").replace("|", "\\|")
        rows.append(f"| `{name}` | {_type(f)} | {default} | {_allowed(f)} | {meaning} |")
    return rows


def table(title: str, model, intro: str = "", skip=()) -> list[str]:
    return [f"### {title}", "", *([intro, ""] if intro else []),
            "| key | type | default | allowed | meaning |", "| --- | --- | --- | --- | --- |",
            *model_rows(model, skip), ""]


def otel_rows() -> list[str]:
    from reveal_plugins.otel.config import ENV_MAP, FILE_KEYS, OtelConfig
    com = _comments(OtelConfig)
    env: dict[str, list[str]] = {}
    for var, key in ENV_MAP:
        env.setdefault(key, []).append(f"`{var}`")
    rows = []
    for f in dataclasses.fields(OtelConfig):
        if f.name not in FILE_KEYS:
            continue
        rows.append(f"| `{f.name}` | {_default(f)} | {', '.join(env.get(f.name, []))} | "
                    f"{com.get(f.name, '')} |")
    return rows


def render() -> str:
    from reveal_plugins.fleet.dask_runtime import TLS_KEYS
    from reveal_plugins.otel.prometheus import KEYS
    from reveal_plugins.site_config import KNOWN_TABLES
    assert set(FLEET) == set(TLS_KEYS) and set(PROMETHEUS) == KEYS, "update tools/gen_config_doc.py"
    from reveal_plugins.agent.settings import AgentConfig
    from reveal_plugins.detect.config import (DetectConfig, LiveConfig, LivePeersConfig,
                                              PeersConfig)
    from reveal_plugins.slurm.config import LEGACY_CONFIG
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by tools/gen_config_doc.py from the code that reads these settings; "
        "do not edit by hand -->",
        "",
        "One file, TOML, optional: `$REVEAL_CONFIG`, else `/etc/reveal/reveal.toml`. Root "
        "reads it only when root owns it and no directory above it is writable by others. "
        "Each part reads its own table, validated by that part's model: an unknown table or "
        "key, or a bad value, is an error naming the file, the table, the key and the value, "
        "never silently ignored. `reveal config show` prints every setting in force and where "
        "it came from (the file, an environment variable, the default); `reveal slurm check` "
        "validates the file on a node.",
        "",
        "Tables: " + "; ".join(f"`[{k}]` ({v})" for k, v in KNOWN_TABLES.items()) + ".",
        "",
        "The Slurm hooks read, first match wins: the file `$REVEAL_SLURM_CONFIG` names "
        "(`reveal slurm install-hooks --config` sets it; its `[slurm]` table or keys at its "
        f"top level), the `[slurm]` table of reveal.toml, the older separate `{LEGACY_CONFIG}` "
        "(still read for this release; `reveal config show` and `reveal slurm check` say it "
        "is deprecated), the defaults. Command-line options and their defaults: `reveal <command> "
        "--help` ([cli.md](cli.md)); environment variables: [environment.md](environment.md).",
        "",
        "## reveal.toml",
        "",
        *table("[agent]", AgentConfig, "The node agent (`reveal agent`). A command-line option "
               "wins, then `$REVEAL_SPOOL`, `$REVEAL_LIVE`, `$REVEAL_CPUS`, "
               "`$REVEAL_HOST_PROC`, then this table."),
        *table("[detect]", DetectConfig, "Detection at the end of every run (`reveal record`, "
               "`reveal analyze`, the Slurm Epilog, `reveal-torchrun`); the settings a command "
               "or caller gives win ([detection.md](detection.md)). `detectors` holds "
               "per-detector keyword arguments: `[detect.detectors.iforest]`."),
        *table("[detect.live]", LiveConfig, "The agent's live detection while a run goes on."),
        *table("[detect.live.peers]", LivePeersConfig, "Live comparison of a multi-node "
               "job's nodes."),
        *table("[detect.peers]", PeersConfig, "A multi-node job's nodes compared with each "
               "other at job end (`reveal analyze JOBDIR`)."),
        "### [slurm]",
        "",
        "The Slurm hooks, read at every job (no restart) ([slurm.md](slurm.md)).",
        "",
        "| key | type | default | allowed | meaning |",
        "| --- | --- | --- | --- | --- |",
        *slurm_rows(),
        "",
        "### [otel]",
        "",
        "Precedence: command-line overrides, then the `OTEL_*` variables, then this table, then "
        "the default ([otel.md](otel.md)). Export is off until an endpoint is set.",
        "",
        "| key | default | variable | meaning |",
        "| --- | --- | --- | --- |",
        *otel_rows(),
        "",
        "### [fleet]",
        "",
        "TLS of the fleet pass's Dask cluster ([fleet.md](fleet.md)); the `--tls-*` options "
        "win.",
        "",
        "| key | meaning |",
        "| --- | --- |",
        *[f"| `{k}` | {v} |" for k, v in FLEET.items()],
        "",
        "### [prometheus]",
        "",
        "The node agent's `/metrics` endpoint ([prometheus.md](prometheus.md)); "
        "`REVEAL_PROMETHEUS=HOST:PORT` sets `listen`. Any address needs `tls_cert`, `tls_key` "
        "and `client_ca`, except a loopback address with `plaintext = true`.",
        "",
        "| key | default | meaning |",
        "| --- | --- | --- |",
        *[f"| `{k}` | {d or '(unset)'} | {v} |" for k, (d, v) in PROMETHEUS.items()],
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        with open(OUT) as f:
            if f.read() != text:
                print(f"{OUT} is stale: run python tools/gen_config_doc.py", file=sys.stderr)
                return 1
        return 0
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
