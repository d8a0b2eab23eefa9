"""The options every ``reveal`` command spells the same way, and the exit codes they share.

One owner, so ``--format``, ``-o/--out`` and the meaning of an exit status cannot drift apart
between commands (docs/cli.md lists them; tests/test_cli_uniform.py walks every parser)."""
from __future__ import annotations

import argparse
import calendar
import time

#: Success; for ``reveal analyze``/``report``: the run was analysed (anomalies or not).
EXIT_OK = 0
#: The data or the machine: an unreadable or missing input, an analysis that failed or could
#: not judge the run (not_analysed), an export that did not arrive, a failed ``slurm check``.
EXIT_PROBLEM = 1
#: The command line or the site configuration: an unknown option, a bad value, a refused
#: request (``--out`` of an existing run), an invalid reveal.toml -- what the caller must fix.
EXIT_USAGE = 2

#: ``reveal record`` and ``reveal-torchrun`` exit with the wrapped command's own status, as the
#: tools they stand in for do; a command not found is 127, not executable 126.


def add_format(ap: argparse.ArgumentParser, choices: tuple[str, ...] = ("text", "json"),
               default: str = "text") -> None:
    """``--format/-f`` and its old spelling ``--json`` (kept as an alias for one release)."""
    ap.add_argument("--format", "-f", choices=choices, default=default,
                    help=f"output format (default {default})")
    ap.add_argument("--json", dest="format", action="store_const", const="json",
                    help="same as --format json (old spelling, kept for one release)")


def add_out(ap: argparse.ArgumentParser, metavar: str, help: str, *,
            required: bool = False) -> None:
    """``-o/--out``: where a command writes what it makes."""
    ap.add_argument("-o", "--out", metavar=metavar, required=required, help=help)


def parse_when(s: str) -> float:
    """A time bound for ``--since``/``--until``: unix seconds, ``YYYY-MM-DD`` or
    ``YYYY-MM-DDTHH:MM[:SS]`` (UTC), or an age such as ``2h``, ``3d``, ``30m``."""
    try:
        return float(s)
    except ValueError:
        pass
    units = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    if len(s) > 1 and s[-1] in units and s[:-1].replace(".", "", 1).isdigit():
        return time.time() - float(s[:-1]) * units[s[-1]]
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return float(calendar.timegm(time.strptime(s, fmt)))
        except ValueError:
            continue
    raise argparse.ArgumentTypeError(f"not a time: {s!r} (unix seconds, YYYY-MM-DD[THH:MM] "
                                     "UTC, or an age like 2h or 3d)")
