"""``reveal slurm {prolog,epilog,task-prolog,task-epilog,build-spank,install-hooks,job-info,check}``.

The hook subcommands are what slurm.conf points at (through a one-line wrapper script, see
docs/slurm.md); they always exit 0 -- a failing Prolog/Epilog would drain the node.
"""
from __future__ import annotations

import argparse
import sys

USAGE = """usage: reveal slurm <command>

  prolog        Prolog (root, once per job per node): register the job with the node agent
  epilog        Epilog (root): close the job's run, start its analysis
  task-prolog   TaskProlog (job user, per task): step start (alternative to the SPANK plugin)
  task-epilog   TaskEpilog (job user, per task): step end
  build-spank   compile the SPANK plugin (--reveal option, per-step events)
  install-hooks write the wrapper scripts slurm.conf's Prolog/Epilog/... point at
  job-info ID   print a job's metadata as JSON (pyslurm, squeue --json or scontrol)
  check         check this node's Slurm integration before a rollout (exit 1 on a failure)
"""
HOOKS = ("prolog", "epilog", "task-prolog", "task-epilog")
HOOK_HELP = {
    "prolog": "The Slurm Prolog (root, once per job per node): registers the job with the "
              "node agent, starting one if needed.",
    "epilog": "The Slurm Epilog (root): closes the job's run and starts its detached "
              "analysis.",
    "task-prolog": "The Slurm TaskProlog (job user, per task): marks the step's start "
                   "(sites without the SPANK plugin).",
    "task-epilog": "The Slurm TaskEpilog (job user, per task): marks the step's end.",
}


def build_jobinfo_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal slurm job-info",
                                 description="Print a Slurm job's metadata as JSON (pyslurm, "
                                             "squeue --json or scontrol, whichever answers).")
    ap.add_argument("job_id", metavar="ID", help="Slurm job id, e.g. 1234 or 1234_5")
    return ap


def build_parser() -> argparse.ArgumentParser:
    """The whole ``reveal slurm`` tree, for the top-level help, completion and the uniformity
    test (the hooks themselves are dispatched without argparse, to start fast)."""
    from .check import build_parser as check_parser
    from .install import build_parser as install_parser
    from .spank_build import build_parser as spank_parser
    ap = argparse.ArgumentParser(prog="reveal slurm", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for hook in HOOKS:
        sub.add_parser(hook, help=HOOK_HELP[hook], description=HOOK_HELP[hook])
    for name, make in (("build-spank", spank_parser), ("install-hooks", install_parser),
                       ("job-info", build_jobinfo_parser), ("check", check_parser)):
        p = make()
        sub.add_parser(name, help=p.description, description=p.description,
                       parents=[p], add_help=False, conflict_handler="resolve")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd in HOOKS and rest and rest[0] in ("-h", "--help"):
        # answered without running the hook (which would register a job, create logs...)
        print(f"usage: reveal slurm {cmd}\n\n{HOOK_HELP[cmd]}\nIt takes no arguments (the "
              "job comes from the SLURM_* environment Slurm sets), always exits 0 and logs "
              "to $REVEAL_SLURM_LOG (default /var/log/reveal/slurm-hooks.log). See "
              "docs/slurm.md.")
        return 0
    if cmd in HOOKS and rest:
        print(f"reveal slurm {cmd}: takes no arguments (got {' '.join(rest)!r}); see "
              f"`reveal slurm {cmd} --help`", file=sys.stderr)
        return 2
    if cmd in HOOKS:
        from .hooks import dispatch
        return dispatch(cmd)
    if cmd == "_analyze" and rest and rest[0] == "--child":
        from .hooks import analyze_child
        return analyze_child(rest[-1])
    if cmd == "_analyze" and rest:
        from .hooks import analyze_job
        fin: int | None | bool = False
        if "--finalize" in rest:
            v = rest[rest.index("--finalize") + 1]
            fin = int(v) if v.lstrip("-").isdigit() else None
        return analyze_job(rest[-1], wait_closed="--wait-closed" in rest, finalize=fin)
    if cmd == "build-spank":
        from .spank_build import main as build_main
        return build_main(rest)
    if cmd == "install-hooks":
        from .install import main as install_main
        return install_main(rest)
    if cmd == "check":
        from .check import main as check_main
        return check_main(rest)
    if cmd == "job-info":
        import json
        from .jobinfo import JobInfoError, job_info
        args = build_jobinfo_parser().parse_args(rest)
        try:
            print(json.dumps(job_info(args.job_id), indent=1, default=str))
        except (JobInfoError, ValueError) as e:
            print(f"reveal slurm job-info: {e}", file=sys.stderr)
            return 1
        return 0
    print(f"reveal slurm: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
