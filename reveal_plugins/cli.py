"""The ``reveal`` command.  Subcommands owned by a sub-package are dispatched to its ``main(argv)``
so that each room keeps its own argument parsing (and its optional imports) to itself; each
also exposes ``build_parser()`` so this module can list, document and complete them all."""
from __future__ import annotations

import argparse
import importlib
import sys

from .cli_options import EXIT_OK, EXIT_USAGE

#: name: (main, build_parser, synopsis, what it does).  The one list of commands: the help
#: below, shell completion and tests/test_cli_uniform.py are made from it.
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "record": ("reveal_plugins.record:main", "reveal_plugins.record:build_parser",
               "[-o DIR] [--interval S] -- CMD...", "run CMD under telemetry, analyse it, "
               "print the summary"),
    "report": ("reveal_plugins.commands.report:main",
               "reveal_plugins.commands.report:build_parser",
               "DIR|JOBID [-f text|json|html] [-o FILE]", "show a run's or a job's report"),
    "analyze": ("reveal_plugins.commands.detect:analyze_main",
                "reveal_plugins.commands.detect:build_analyze_parser",
                "DIR [--baseline FILE] [-f text|json]", "analyse a run directory again, "
                "write report.json"),
    "runs": ("reveal_plugins.commands.runs:main", "reveal_plugins.commands.runs:build_parser",
             "[--user U] [--since WHEN]", "list the recent runs and Slurm jobs you may read"),
    "compare": ("reveal_plugins.commands.compare:main",
                "reveal_plugins.commands.compare:build_parser", "A B",
                "what differs between two runs of the same workload"),
    "probes": ("reveal_plugins.probes.probes_cli:main",
               "reveal_plugins.probes.probes_cli:build_parser", "[-f text|json]",
               "list probes, availability and channel counts"),
    "baseline": ("reveal_plugins.commands.detect:baseline_main",
                 "reveal_plugins.commands.detect:build_baseline_parser",
                 "{fit RUN_DIR... -o FILE | show FILE}",
                 "learn (or show) what healthy runs of a workload look like"),
    "agent": ("reveal_plugins.agent.daemon:main", "reveal_plugins.agent.daemon:build_parser",
              "[--spool DIR] [--interval S]", "run the node agent in the foreground"),
    "slurm": ("reveal_plugins.slurm.cli:main", "reveal_plugins.slurm.cli:build_parser",
              "{prolog,epilog,task-prolog,task-epilog,build-spank,install-hooks,job-info,"
              "check}", "Slurm hooks, SPANK plugin, install and check"),
    "otel": ("reveal_plugins.otel.cli:main", "reveal_plugins.otel.cli:build_parser",
             "{export DIR|JOBID..., config}", "(re-)send runs as OpenTelemetry traces; show "
             "the export settings"),
    "fleet": ("reveal_plugins.fleet.cli:main", "reveal_plugins.fleet.cli:build_parser",
              "{index,nodes,baseline,report} ...", "fleet analysis over many runs (Dask)"),
    "import": ("reveal_plugins.importers.cli:main", "reveal_plugins.importers.cli:build_parser",
               "reveal-tsv FILE... -o DIR", "Reveal's public telemetry (TSV) -> run "
               "directories"),
    "config": ("reveal_plugins.commands.config:main",
               "reveal_plugins.commands.config:build_parser", "show [--table NAME] [-f text|json]",
               "the settings in force ([agent], [detect], [slurm], [otel]...) and their "
               "sources"),
    "completion": ("reveal_plugins.completion:main", "reveal_plugins.completion:build_parser",
                   "bash", "print a shell completion script"),
}


def usage() -> str:
    lines = ["usage: reveal <command> [options]      (reveal <command> --help for its options)",
             "       reveal --version", "", "commands:"]
    for name, (_, _, syn, what) in COMMANDS.items():
        lines.append(f"  {name:<11} {syn}")
        lines.append(f"  {'':<11}   {what}")
    lines += ["", "exit status: 0 ok; 1 a data or runtime problem (unreadable input, analysis "
              "failed or not", "possible, export failed); 2 a usage or configuration error. "
              "`reveal record` exits with", "CMD's status. docs/cli.md has the details."]
    return "\n".join(lines) + "\n"


def _load(target: str):
    mod, func = target.split(":")
    return getattr(importlib.import_module(mod), func)


def parser_for(cmd: str) -> argparse.ArgumentParser:
    """The argparse parser of a top-level command (ImportError when its extra is missing)."""
    return _load(COMMANDS[cmd][1])()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return EXIT_OK if argv else EXIT_USAGE
    if argv[0] in ("--version", "-V"):
        from . import __version__
        print(f"reveal {__version__}")
        return EXIT_OK
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"reveal: unknown command {cmd!r}\n\n{usage()}", file=sys.stderr, end="")
        return EXIT_USAGE
    try:
        fn = _load(COMMANDS[cmd][0])
    except ImportError as e:
        print(f"reveal {cmd}: not available ({e}); is the matching extra installed?",
              file=sys.stderr)
        return EXIT_USAGE
    rc = fn(rest)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
