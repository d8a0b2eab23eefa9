"""``reveal slurm check``: what a rollout needs, checked on this node before the first job.

Each check is ``ok``, ``warn`` (works, but not as recommended) or ``FAIL`` (jobs would run
without telemetry, or root would run or read something a user can change).  Exit 1 when any
check fails.  It reads slurm.conf through ``scontrol show config`` (what slurmd actually uses)
and falls back to the file (``$SLURM_CONF`` or /etc/slurm/slurm.conf) when no controller
answers.  Nothing is changed."""
from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import subprocess  # nosec B404
import sys
from dataclasses import asdict, dataclass

from ..cli_options import EXIT_OK, EXIT_PROBLEM, add_format
from ..trust import untrusted_reason

HOOK_KEYS = ("Prolog", "Epilog", "TaskProlog", "TaskEpilog")


@dataclass
class Check:
    name: str
    state: str          # ok | warn | FAIL
    detail: str


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal slurm check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--slurm-conf", metavar="FILE",
                    help="slurm.conf to read (default: `scontrol show config`, else "
                         "$SLURM_CONF or /etc/slurm/slurm.conf)")
    add_format(ap)
    return ap


def slurm_settings(conf_file: str | None = None) -> tuple[dict[str, str], str]:
    """slurm.conf's key = value pairs (keys as Slurm spells them) and where they came from."""
    if conf_file is None:
        try:
            r = subprocess.run(["scontrol", "show", "config"], capture_output=True,  # nosec B603 B607
                               text=True, timeout=10)
            if r.returncode == 0 and "=" in r.stdout:
                out = {}
                for line in r.stdout.splitlines():
                    k, sep, v = line.partition("=")
                    if sep and k.strip() and " " not in k.strip():
                        out[k.strip()] = v.strip()
                return out, "scontrol show config"
        except (OSError, subprocess.TimeoutExpired):
            pass
    path = conf_file or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    out = {}
    try:
        with open(path) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                k, sep, v = line.partition("=")
                if sep and k.strip() and " " not in k.strip():
                    out[k.strip()] = v.strip()
    except OSError as e:
        raise FileNotFoundError(f"{path}: cannot read slurm.conf: {e.strerror}") from None
    return out, path


def _unset(v: str | None) -> bool:
    return not v or v in ("(null)", "none", "None")


def check_hooks(conf: dict[str, str]) -> list[Check]:
    out = []
    for key in HOOK_KEYS:
        path = conf.get(key)
        if _unset(path):
            continue
        path = path.split(",")[0].strip()
        if not os.path.isfile(path):
            out.append(Check(f"slurm.conf {key}", "FAIL", f"{path}: not found (slurmd fails "
                             "the hook; a failing Prolog/Epilog drains the node)"))
            continue
        if not os.access(path, os.X_OK):
            out.append(Check(f"slurm.conf {key}", "FAIL", f"{path}: not executable"))
            continue
        why = untrusted_reason(path)
        if why:
            out.append(Check(f"slurm.conf {key}", "FAIL",
                             f"{path}: {why} (root runs it for every job)"))
            continue
        try:
            with open(path, errors="replace") as f:
                text = f.read(65536)
        except OSError as e:
            out.append(Check(f"slurm.conf {key}", "FAIL", f"{path}: {e.strerror}"))
            continue
        if "reveal" not in text:
            out.append(Check(f"slurm.conf {key}", "warn", f"{path}: does not call reveal "
                             "(another site hook? it must call `reveal slurm "
                             f"{key.lower().replace('task', 'task-')}` too)"))
        else:
            out.append(Check(f"slurm.conf {key}", "ok", path))
    return out


def _plugstack_lines(path: str, seen: set[str] | None = None) -> list[tuple[str, str]]:
    """(file, line) of plugstack.conf and the files it includes."""
    seen = seen if seen is not None else set()
    if path in seen:
        return []
    seen.add(path)
    try:
        with open(path) as f:
            lines = [ln.split("#", 1)[0].strip() for ln in f]
    except OSError:
        return []
    out = []
    for ln in lines:
        if not ln:
            continue
        if ln.startswith("include "):
            for inc in sorted(glob.glob(ln.split(None, 1)[1].strip())):
                out += _plugstack_lines(inc, seen)
        else:
            out.append((path, ln))
    return out


def check_spank(conf: dict[str, str]) -> list[Check]:
    stack = conf.get("PlugStackConfig")
    stack = "/etc/slurm/plugstack.conf" if _unset(stack) else stack
    mine = [(f, ln) for f, ln in _plugstack_lines(stack) if "reveal" in ln]
    if not mine:
        return [Check("SPANK plugin", "warn", f"not listed in {stack} (or its includes): no "
                      "`srun --reveal`, steps come only from TaskProlog/TaskEpilog")]
    out = []
    for f, ln in mine:
        words = shlex.split(ln)
        if len(words) < 2 or words[0] not in ("optional", "required"):
            out.append(Check("SPANK plugin", "FAIL", f"{f}: {ln!r}: expected "
                             "'optional /path/reveal_spank.so [args]'"))
            continue
        so = words[1]
        if not os.path.isfile(so):
            out.append(Check("SPANK plugin", "FAIL", f"{so} (from {f}): not found; build it: "
                             "reveal slurm build-spank"))
            continue
        why = untrusted_reason(so)
        if why:
            out.append(Check("SPANK plugin", "FAIL", f"{so}: {why} (slurmd loads it as root)"))
        elif words[0] == "required":
            out.append(Check("SPANK plugin", "warn", f"{so}: listed 'required' in {f}: a "
                             "plugin that fails to load stops slurmd; list it 'optional'"))
        else:
            out.append(Check("SPANK plugin", "ok", f"{so} ({f})"))
    return out


def check_flags(conf: dict[str, str]) -> list[Check]:
    flags = [f.strip().lower() for f in (conf.get("PrologFlags") or "").split(",")]
    if "alloc" in flags:
        return [Check("PrologFlags", "ok", conf.get("PrologFlags", ""))]
    return [Check("PrologFlags", "warn", "no Alloc: the Prolog runs at the first step, not at "
                  "allocation, so a batch script's start is not recorded (PrologFlags=Alloc)")]


def check_hook_config() -> list[Check]:
    from .config import ConfigError, load_config
    try:
        cfg = load_config()
    except ConfigError as e:
        return [Check("hook configuration", "FAIL", str(e))]
    src = cfg.path or "defaults (no [slurm] table)"
    if cfg.deprecation:
        return [Check("hook configuration", "warn", f"{src}: {cfg.deprecation}")]
    if not cfg.enabled:
        return [Check("hook configuration", "warn", f"{src}: enabled = false (hooks do "
                      "nothing)")]
    return [Check("hook configuration", "ok", src)]


def check_site_config() -> list[Check]:
    from .. import site_config
    try:
        path = site_config.path_in_force()
        if path is None:
            return [Check("site configuration", "ok",
                          f"{site_config.DEFAULT_PATH} absent: defaults")]
        site_config.read(path)
    except site_config.SiteConfigError as e:
        return [Check("site configuration", "FAIL", str(e))]
    return [Check("site configuration", "ok", path)]


def check_spool(spool: str) -> list[Check]:
    import stat
    if not os.path.exists(spool):
        return [Check("spool", "warn", f"{spool}: absent (the first Prolog creates it)")]
    st = os.lstat(spool)
    if not stat.S_ISDIR(st.st_mode):
        return [Check("spool", "FAIL", f"{spool}: not a directory")]
    if os.geteuid() == 0:
        why = untrusted_reason(spool)
        if why:
            return [Check("spool", "FAIL", f"{spool}: {why} (users could plant files root "
                          "writes through)")]
    return [Check("spool", "ok", f"{spool} (mode {stat.S_IMODE(st.st_mode):04o})")]


def check_agent(spool: str) -> list[Check]:
    from ..agent.client import AgentClient
    from ..spool import agent_socket
    sock = agent_socket(spool)
    if not os.path.exists(sock):
        return [Check("node agent", "ok", "not running (the Prolog starts one per job)")]
    try:
        info = AgentClient(sock, timeout=2.0).ping()
    except Exception as e:  # noqa: BLE001 - any failure to talk to it is the finding
        return [Check("node agent", "FAIL", f"{sock}: does not answer: {e}")]
    return [Check("node agent", "ok", f"{sock}: answers (pid {info.get('pid', '?')})")]


def check_analysis() -> list[Check]:
    try:
        import numpy  # noqa: F401
        import sklearn  # noqa: F401
        from .. import analysis  # noqa: F401
    except ImportError as e:
        return [Check("analysis dependencies", "FAIL", f"{e}: the Epilog cannot analyse jobs "
                      f"with {sys.executable}")]
    return [Check("analysis dependencies", "ok", sys.executable)]


def run_checks(conf_file: str | None = None) -> tuple[list[Check], str]:
    from ..spool import spool_root
    checks: list[Check] = []
    if os.geteuid() != 0:
        checks.append(Check("privileges", "warn", "not root: ownership of root-only files "
                            "cannot be fully checked; run as root on a node"))
    try:
        conf, src = slurm_settings(conf_file)
    except FileNotFoundError as e:
        conf, src = None, "nowhere"
        checks.append(Check("slurm.conf", "FAIL", str(e)))
    if conf is not None:
        hooks, spank = check_hooks(conf), check_spank(conf)
        checks += hooks + spank
        if not any(c.state == "ok" for c in hooks if c.name.endswith(("Prolog", "Epilog"))) \
                and not any(c.state == "ok" for c in spank):
            checks.append(Check("Slurm calls Reveal", "FAIL", "neither a Prolog/Epilog that "
                                "calls reveal nor the SPANK plugin is configured: no job is "
                                "recorded (docs/slurm.md)"))
        checks += check_flags(conf)
    checks += check_hook_config() + check_site_config()
    try:
        from .config import load_config
        spool = load_config().spool or spool_root()
    except Exception:  # noqa: BLE001 - reported by check_hook_config
        spool = spool_root()
    checks += check_spool(spool) + check_agent(spool) + check_analysis()
    return checks, src


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    checks, src = run_checks(args.slurm_conf)
    failed = sum(c.state == "FAIL" for c in checks)
    if args.format == "json":
        print(json.dumps({"slurm_conf": src, "failed": failed,
                          "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        print(f"slurm.conf from {src}")
        for c in checks:
            print(f"{c.state:<4}  {c.name:<22} {c.detail}")
        print(f"\n{failed} failed, {sum(c.state == 'warn' for c in checks)} warning(s), "
              f"{sum(c.state == 'ok' for c in checks)} ok")
    return EXIT_PROBLEM if failed else EXIT_OK
