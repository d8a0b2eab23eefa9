"""``reveal slurm build-spank``: compile the SPANK plugin against the installed Slurm.

A SPANK plugin records the Slurm version it was compiled against and slurmstepd refuses a
mismatch, so sites build it on (or for) their own Slurm version.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from importlib import resources

DEFAULT_OUT = "/usr/local/lib/reveal/reveal_spank.so"
INCLUDE_DIRS = ("/usr/include", "/usr/local/include", "/opt/slurm/include")


def source_path() -> str:
    return str(resources.files("reveal_plugins.slurm") / "spank" / "reveal_spank.c")


def find_include(extra: str | None = None) -> str:
    for d in ([extra] if extra else []) + list(INCLUDE_DIRS):
        if os.path.isfile(os.path.join(d, "slurm", "spank.h")):
            return d
    raise FileNotFoundError("slurm/spank.h not found in " + ", ".join(
        ([extra] if extra else []) + list(INCLUDE_DIRS)) +
        " (install libslurm-dev / slurm-devel, or pass --include-dir)")


def build(out: str = DEFAULT_OUT, cc: str = "gcc", include_dir: str | None = None) -> str:
    """Compile the plugin to ``out`` (written under a temporary name, then renamed)."""
    if shutil.which(cc) is None:
        raise FileNotFoundError(f"C compiler {cc!r} not found on PATH")
    inc = find_include(include_dir)
    os.makedirs(os.path.dirname(os.path.abspath(out)), mode=0o755, exist_ok=True)
    tmp = out + ".tmp"
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", f"-I{inc}", "-o", tmp, source_path()]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr}")
    os.chmod(tmp, 0o755)  # nosec B103  # a shared object slurmd loads; readable, not writable by others
    os.replace(tmp, out)
    return out


def plugstack_line(so: str, spool: str | None = None) -> str:
    return f"optional {so}" + (f" spool={spool}" if spool else "")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal slurm build-spank",
                                 description="Compile the Reveal SPANK plugin (--reveal option, "
                                             "per-step events) against the installed Slurm.")
    ap.add_argument("-o", "--out", metavar="FILE", default=DEFAULT_OUT,
                    help=f"output .so (default {DEFAULT_OUT})")
    ap.add_argument("--cc", default="gcc", metavar="CC", help="C compiler (default gcc)")
    ap.add_argument("--include-dir", metavar="DIR", help="directory holding slurm/spank.h")
    ap.add_argument("--spool", metavar="DIR",
                    help="spool to put in the printed plugstack.conf line")
    ap.add_argument("--print-source", action="store_true", help="print the C source path only")
    return ap


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    if a.print_source:
        print(source_path())
        return 0
    try:
        so = build(a.out, a.cc, a.include_dir)
    except (OSError, RuntimeError) as e:
        print(f"reveal slurm build-spank: {e}", file=__import__("sys").stderr)
        return 1
    print(f"built {so}\nadd this line to plugstack.conf (or a file in plugstack.conf.d/):\n"
          f"{plugstack_line(so, a.spool)}")
    return 0
