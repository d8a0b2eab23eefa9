"""Site configuration of the Slurm hooks (a small TOML file).

Read by every hook invocation (Prolog, Epilog, task hooks), so a change applies to the next job
without restarting anything.  The file is ``$REVEAL_SLURM_CONFIG`` or
``/etc/reveal/slurm.toml``; a missing *default* file means "all defaults", a missing file that
was named explicitly, an unreadable file or an invalid one is an error (the hooks then log it
and do nothing, so the job still runs).
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from typing import Any

DEFAULT_CONFIG = "/etc/reveal/slurm.toml"
MODES = ("off", "on", "live")


class ConfigError(ValueError):
    """The hook configuration is unusable; the message names the file, line/key and value."""


@dataclass
class SlurmConfig:
    """Hook settings (all optional in the file; the keys are the field names)."""

    enabled: bool = True            # false: hooks exit at once (a site-wide off switch)
    spool: str = ""                 # default $REVEAL_SPOOL or /var/spool/reveal
    interval_s: float = 0.1         # sampling interval of an agent the Prolog starts
    default_mode: str = "on"        # mode of a job step without --reveal (on|off|live)
    prolog_budget_s: float = 0.5    # the Prolog returns (exit 0) within this
    epilog_budget_s: float = 1.0    # the Epilog returns (exit 0) within this
    analysis: str = "detached"      # detached: analyse after the Epilog returns; off: never
    analysis_timeout_s: float = 600.0   # base time limit of one job's analysis
    analyzer: str = "reveal_plugins.analysis:analyze_and_publish"  # module:function(run_dir, cfg)
    analysis_nice: int = 10         # niceness of the detached analysis (the node runs jobs)
    analysis_timeout_per_hour_s: float = 10.0   # + this per hour of run (long jobs)
    analysis_timeout_max_s: float = 7200.0      # the timeout never exceeds this
    analysis_memory_max_mb: int = 2048  # the analysis' memory cap (then: report partial)
    analysis_cpu_pct: int = 100     # its CPU cap, % of one core (systemd/cgroup caps)
    analysis_cap: str = "auto"      # auto|systemd|cgroup|rlimit|off (auto: first that works)
    analysis_max_concurrent: int = 2  # detached analyses at once on a node (others wait)
    path: str = ""                  # where this configuration came from ("" = defaults)

    def spool_dir(self) -> str:
        from ..spool import spool_root
        return self.spool or spool_root()

    def as_analysis_config(self) -> dict[str, Any]:
        return {"source": "slurm", "interval_s": self.interval_s}


_RANGES = {"interval_s": (0.001, 60.0), "prolog_budget_s": (0.05, 60.0),
           "epilog_budget_s": (0.05, 300.0), "analysis_timeout_s": (0.1, 86400.0),
           "analysis_nice": (0, 19), "analysis_timeout_per_hour_s": (0.0, 3600.0),
           "analysis_timeout_max_s": (1.0, 7 * 86400.0), "analysis_memory_max_mb": (32, 1 << 22),
           "analysis_cpu_pct": (1, 100_000), "analysis_max_concurrent": (1, 256)}
_CHOICES = {"default_mode": MODES, "analysis": ("detached", "off"),
            "analysis_cap": ("auto", "systemd", "cgroup", "rlimit", "off")}


def parse_config(data: dict[str, Any], path: str) -> SlurmConfig:
    """Validate a parsed TOML table (keys at top level or under ``[slurm]``)."""
    if "slurm" in data and isinstance(data["slurm"], dict):
        data = data["slurm"]
    cfg = SlurmConfig(path=path)
    types = {f.name: f.type for f in fields(SlurmConfig) if f.name != "path"}
    for key, value in data.items():
        if key not in types:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(sorted(types))})")
        want = types[key]
        ok = {"bool": isinstance(value, bool),
              "str": isinstance(value, str),
              "int": isinstance(value, int) and not isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool)}[want]
        if not ok:
            raise ConfigError(f"{path}: key {key!r}: expected {want}, got {value!r}")
        if key in _RANGES:
            lo, hi = _RANGES[key]
            if not lo <= value <= hi:
                raise ConfigError(f"{path}: key {key!r}: {value!r} out of range [{lo}, {hi}]")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise ConfigError(f"{path}: key {key!r}: {value!r} is not one of "
                              f"{', '.join(_CHOICES[key])}")
        if key == "spool" and value and not os.path.isabs(value):
            raise ConfigError(f"{path}: key 'spool': {value!r} must be an absolute path")
        if key == "analyzer" and ":" not in value:
            raise ConfigError(f"{path}: key 'analyzer': {value!r} must be 'module:function'")
        setattr(cfg, key, float(value) if want == "float" else value)
    return cfg


def load_config(path: str | None = None) -> SlurmConfig:
    """Load the hook configuration (see the module docstring for which file)."""
    explicit = path or os.environ.get("REVEAL_SLURM_CONFIG")
    path = explicit or DEFAULT_CONFIG
    from ..trust import UntrustedPath, read_trusted
    try:
        raw = read_trusted(path, "configuration file")
    except FileNotFoundError:
        if not explicit:
            return SlurmConfig()
        raise ConfigError(f"{path}: configuration file not found") from None
    except UntrustedPath as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read configuration: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    return parse_config(data, path)


def parse_mode(value: str | None, default: str = "on") -> str:
    """Validate a ``--reveal`` value (None/'' = the default; bare ``--reveal`` = on)."""
    if value is None or value == "":
        return default
    v = value.strip().lower()
    if v not in MODES:
        raise ValueError(f"--reveal={value}: unknown value (expected one of {', '.join(MODES)})")
    return v
