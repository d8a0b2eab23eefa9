"""The ``reveal`` command.  Subcommands owned by a sub-package are dispatched to its ``main(argv)``
so that each room keeps its own argument parsing (and its optional imports) to itself."""
from __future__ import annotations

import importlib
import sys

USAGE = """usage: reveal <command> [options]

commands:
  record [--out DIR] [--interval S] -- CMD...   run CMD under telemetry, analyse, print the summary
  analyze DIR [--baseline FILE]                  analyse a run directory, write report.json
  report DIR|JOBID [--format text|json|html]     show a run's report
  probes [--json]                                list probes, availability and channel counts
  baseline fit RUN_DIR... --out FILE             learn a baseline from healthy runs
  agent [--spool DIR] [--interval S]             run the node agent in the foreground
  slurm {prolog,epilog,task-prolog,task-epilog,build-spank}
  otel export DIR                                (re-)send a finished run as an OpenTelemetry trace
  fleet {index,nodes,baseline,report} ...        fleet analysis over many runs (Dask)
  import reveal-tsv FILE... --out DIR            Reveal's public telemetry (TSV) -> run directories
"""

COMMANDS = {
    "record": "reveal_plugins.record:main",
    "probes": "reveal_plugins.probes.probes_cli:main",
    "agent": "reveal_plugins.agent.daemon:main",
    "analyze": "reveal_plugins.commands.detect:analyze_main",
    "baseline": "reveal_plugins.commands.detect:baseline_main",
    "report": "reveal_plugins.commands.report:main",
    "slurm": "reveal_plugins.slurm.cli:main",
    "otel": "reveal_plugins.otel.cli:main",
    "fleet": "reveal_plugins.fleet.cli:main",
    "import": "reveal_plugins.importers.cli:main",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    if argv[0] == "--version":
        from . import __version__
        print(f"reveal {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    target = COMMANDS.get(cmd)
    if target is None:
        print(f"reveal: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr, end="")
        return 2
    mod, func = target.split(":")
    try:
        fn = getattr(importlib.import_module(mod), func)
    except ImportError as e:
        print(f"reveal {cmd}: not available ({e}); is the matching extra installed?",
              file=sys.stderr)
        return 2
    rc = fn(rest)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
