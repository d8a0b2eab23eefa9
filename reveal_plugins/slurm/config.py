"""Settings of the Slurm hooks: the ``[slurm]`` table of the site configuration
(``$REVEAL_CONFIG`` or ``/etc/reveal/reveal.toml``, :mod:`reveal_plugins.site_config`).

Read by every hook invocation (Prolog, Epilog, task hooks), so a change applies to the next job
without restarting anything.  Where the settings come from, first match wins:

1. a file named explicitly (``load_config(path)``, ``$REVEAL_SLURM_CONFIG``): its ``[slurm]``
   table or, the older form, keys at its top level;
2. the ``[slurm]`` table of the site configuration;
3. ``/etc/reveal/slurm.toml``, the older separate file: still read for this release, with a
   deprecation note (``reveal config show``, ``reveal slurm check``);
4. the defaults.

A missing *default* file means "all defaults"; a missing file that was named explicitly, an
unreadable file or an invalid one is an error naming the file, the key and the value (the hooks
then log it and do nothing, so the job still runs).

Unlike the other tables this one is a standard-library dataclass, not a pydantic model: the
hooks run with ``python -S`` (standard library only, :mod:`.install`), and importing pydantic
would add ~0.12 s to every Prolog (0.08 s -> 0.20 s measured here).  Its checks are declared
once, beside the fields (``_RANGES``, ``_CHOICES``).
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from typing import Any

LEGACY_CONFIG = "/etc/reveal/slurm.toml"
DEFAULT_CONFIG = LEGACY_CONFIG      # (the name older code and docs use)
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
    given: tuple = ()               # the keys that file set
    deprecation: str = ""           # a note when read from the older separate file

    #: Fields that are not keys of the file.
    NOT_KEYS = ("path", "given", "deprecation")

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
    cfg = SlurmConfig(path=path, given=tuple(data))
    types = {f.name: f.type for f in fields(SlurmConfig) if f.name not in SlurmConfig.NOT_KEYS}
    where = f"{path}: [slurm]"
    for key, value in data.items():
        if key not in types:
            raise ConfigError(f"{where} unknown key {key!r} (known: {', '.join(sorted(types))})")
        want = types[key]
        bad = f"{where} key {key!r} = {value!r}:"
        ok = {"bool": isinstance(value, bool),
              "str": isinstance(value, str),
              "int": isinstance(value, int) and not isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool)}[want]
        if not ok:
            raise ConfigError(f"{bad} expected {want}")
        if key in _RANGES:
            lo, hi = _RANGES[key]
            if not lo <= value <= hi:
                raise ConfigError(f"{bad} out of range [{lo}, {hi}]")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise ConfigError(f"{bad} is not one of {', '.join(_CHOICES[key])}")
        if key == "spool" and value and not os.path.isabs(value):
            raise ConfigError(f"{bad} must be an absolute path")
        if key == "analyzer" and ":" not in value:
            raise ConfigError(f"{bad} must be 'module:function'")
        setattr(cfg, key, float(value) if want == "float" else value)
    return cfg


def load_config(path: str | None = None) -> SlurmConfig:
    """Load the hook configuration (see the module docstring for which file)."""
    from .. import site_config
    explicit = path or os.environ.get("REVEAL_SLURM_CONFIG")
    if explicit:
        return _read_file(explicit, must_exist=True)
    try:
        site = site_config.path_in_force()
        data = site_config.read(site) if site is not None else {}
    except site_config.SiteConfigError as e:
        raise ConfigError(str(e)) from None
    if "slurm" in data:
        cfg = parse_config(data, site)
        if os.path.exists(LEGACY_CONFIG):
            cfg.deprecation = (f"{LEGACY_CONFIG} is ignored: the [slurm] table of {site} is in "
                               "force (remove the older file)")
        return cfg
    cfg = _read_file(LEGACY_CONFIG, must_exist=False)
    if cfg.path:
        cfg.deprecation = (f"{LEGACY_CONFIG} is deprecated: move its keys into the [slurm] "
                           f"table of {site or site_config.DEFAULT_PATH}")
    return cfg


def _read_file(path: str, must_exist: bool) -> SlurmConfig:
    from ..trust import UntrustedPath, read_trusted
    try:
        raw = read_trusted(path, "configuration file")
    except FileNotFoundError:
        if not must_exist:
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
