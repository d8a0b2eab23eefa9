"""``reveal slurm install-hooks``: write the Prolog/Epilog/TaskProlog/TaskEpilog wrapper scripts.

slurm.conf takes a program path without arguments, so each hook is a two-line script.  The
scripts start the interpreter with ``-S -E -P`` (no site-packages scan, no PYTHON* variables,
not the working directory on ``sys.path``) and put this package's directory on ``sys.path``
themselves: interpreter start-up is most of a Python hook's cost, and this halves it (the hooks
need only the standard library).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

import reveal_plugins

HOOKS = ("prolog", "epilog", "task-prolog", "task-epilog")


def package_parent() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(reveal_plugins.__file__)))


def hook_command(hook: str, python: str | None = None) -> str:
    """The shell command that runs ``reveal slurm <hook>`` with a fast interpreter start."""
    code = (f"import sys; sys.path.insert(0, {package_parent()!r}); "
            "from reveal_plugins.slurm.cli import main; sys.exit(main())")
    # -P: ``-c`` would put the working directory on sys.path (ahead of the standard library)
    return f"{shlex.quote(python or sys.executable)} -S -E -P -c {shlex.quote(code)} {hook}"


#: Backstop for a hung interpreter (the hooks keep their own, much smaller budgets).
WRAPPER_TIMEOUT_S = 20


def script(hook: str, env: dict[str, str], python: str | None = None) -> str:
    """The wrapper slurm.conf points at.  It exits 0 whatever Python does (a broken
    virtualenv, a missing module, a crash, a hang): a failing Prolog/Epilog drains the node,
    and telemetry must never cost a node.  The failure goes to slurmd's log (stderr) and to
    syslog."""
    lines = ["#!/bin/sh", f"# Reveal Slurm {hook} (written by: reveal slurm install-hooks)"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines.append(f"timeout -k 2 {WRAPPER_TIMEOUT_S} {hook_command(hook, python)}")
    lines.append("rc=$?")
    lines.append('if [ "$rc" -ne 0 ]; then')
    lines.append(f'  msg="reveal-slurm {hook}: job=$SLURM_JOB_ID the hook exited $rc '
                 '(124 = timed out; broken Python environment?); the job goes on"')
    lines.append('  echo "$msg" >&2')
    lines.append('  [ -n "$REVEAL_SLURM_LOG" ] && echo "$(date -u +%FT%TZ) $msg" '
                 '>> "$REVEAL_SLURM_LOG" 2>/dev/null')
    lines.append('  command -v logger >/dev/null 2>&1 && logger -t reveal-slurm "$msg"')
    lines.append("fi")
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


def install(directory: str, env: dict[str, str], python: str | None = None) -> list[str]:
    os.makedirs(directory, mode=0o755, exist_ok=True)
    out = []
    for hook in HOOKS:
        path = os.path.join(directory, hook)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(script(hook, env, python))
        os.chmod(tmp, 0o755)  # nosec B103  # a hook script slurmd executes; root-owned, not writable by others
        os.replace(tmp, path)
        out.append(path)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal slurm install-hooks",
                                 description="Write the hook wrapper scripts slurm.conf points at.")
    ap.add_argument("--dir", default="/etc/slurm/reveal", metavar="DIR",
                    help="where to write the scripts (default /etc/slurm/reveal)")
    ap.add_argument("--config", metavar="FILE",
                    help="hook configuration (sets REVEAL_SLURM_CONFIG)")
    ap.add_argument("--log", metavar="FILE", help="hook log (sets REVEAL_SLURM_LOG)")
    ap.add_argument("--python", metavar="PATH", help="interpreter (default: this one)")
    return ap


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    env = {}
    if a.config:
        env["REVEAL_SLURM_CONFIG"] = os.path.abspath(a.config)
    if a.log:
        env["REVEAL_SLURM_LOG"] = os.path.abspath(a.log)
    paths = install(a.dir, env, a.python)
    d = os.path.abspath(a.dir)
    print("wrote " + ", ".join(paths))
    print("setup A (recommended), plugstack.conf:\n"
          f"  optional /usr/local/lib/reveal/reveal_spank.so spool=/var/spool/reveal hooks={d}\n"
          "  and in slurm.conf: PrologFlags=Alloc,Contain\n"
          "setup B, slurm.conf:\n"
          f"  PrologFlags=Alloc,Contain\n  Prolog={d}/prolog\n  Epilog={d}/epilog\n"
          "  plus the SPANK plugin without hooks= for steps, or (no SPANK plugin at all):\n"
          f"  TaskProlog={d}/task-prolog\n  TaskEpilog={d}/task-epilog\n"
          "then check the node: reveal slurm check; see docs/slurm.md")
    return 0
