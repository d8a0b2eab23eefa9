"""Results files of the benchmarks: one JSON document per run, a header that pins what ran.

Every benchmark writes its figures through this module::

    sys.path.insert(0, os.path.dirname(HERE))      # benchmarks/
    import results as bench_results

    ap = argparse.ArgumentParser()
    bench_results.add_args(ap, "telemetry")        # --split dev|test (default dev), --results FILE
    a = ap.parse_args()
    run = bench_results.begin("telemetry", a.split)   # refuses a test run from a dirty tree
    ...
    run.write(a.results or run.default_path(), figures)

The document is ``{"header": {...}, **figures}`` (the figures keep the fields each benchmark
always wrote).  The header holds the command, the commit (``git rev-parse HEAD``), whether the
tree was clean (``git status --porcelain`` over ``reveal_plugins/``, ``benchmarks/`` and
``examples/``, results directories excepted, plus any helper file the benchmark names), the
machine (cores, memory, kernel, OS, Python, load), the dates and the split.

Splits: ``dev`` is anything looked at while code changes (tuning, exploration, a cost measured
on a work tree); ``test`` is a figure measured once on committed code.  A ``test`` result is
refused from a dirty tree, or when the tree changed during the run (checked when the run
begins, so a long benchmark does not run for nothing, and again at every write); a ``dev``
result is always written and says whether its tree was clean.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCHEMA = 1
SPLITS = ("dev", "test")
#: the code a benchmark runs; results directories are data, not code
CODE_PATHS = ("reveal_plugins", "benchmarks", "examples")
EXCLUDE = (":(exclude,glob)benchmarks/**/results/**",)


class DirtyTreeError(RuntimeError):
    """A ``test`` result from a tree that is not clean (or whose state cannot be told)."""


def _git(root: str, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def tree_state(root: str = ROOT, extra_paths: tuple[str, ...] = ()) -> dict:
    """``{"commit", "clean", "dirty": [porcelain lines], "paths"}``; commit/clean are None
    where git cannot tell (no git, not a checkout)."""
    paths = [*CODE_PATHS, *extra_paths]
    commit = _git(root, "rev-parse", "HEAD")
    st = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *paths, *EXCLUDE)
    dirty = [ln for ln in (st or "").splitlines() if ln.strip()]
    return {"commit": commit.strip() if commit else None,
            "clean": None if st is None or commit is None else not dirty,
            "dirty": dirty[:50], "paths": paths}


def machine() -> dict:
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for ln in f:
                if ln.startswith("MemTotal:"):
                    mem = round(int(ln.split()[1]) / 2**20, 1)
                    break
    except OSError:
        pass
    osname = None
    try:
        with open("/etc/os-release") as f:
            for ln in f:
                if ln.startswith("PRETTY_NAME="):
                    osname = ln.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"cores": os.cpu_count(), "memory_gib": mem, "kernel": platform.release(),
            "os": osname, "arch": platform.machine(), "python": platform.python_version(),
            "loadavg_1m_at_start": load}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_line(argv: list[str] | None = None, script: str | None = None) -> str:
    """The command as someone would retype it from the repository root."""
    script = os.path.abspath(script or sys.argv[0])
    rel = os.path.relpath(script, ROOT) if script.startswith(ROOT + os.sep) else script
    return shlex.join(["python", rel, *(sys.argv[1:] if argv is None else argv)])


def _refusal(split: str, st: dict) -> str | None:
    if split == "dev":
        return None
    if st["clean"] is None:
        return (f"refusing a {split!r} result: git cannot tell whether the tree is clean "
                f"(run from a git checkout, or use --split dev)")
    if not st["clean"]:
        return (f"refusing a {split!r} result from a dirty tree ({len(st['dirty'])} changed "
                f"paths under {', '.join(st['paths'])}, e.g. {st['dirty'][:3]}): commit or "
                f"stash them, or use --split dev")
    return None


class Run:
    """One benchmark run: the header taken when it began, checked again at every write."""

    def __init__(self, benchmark: str, split: str, argv: list[str] | None = None,
                 script: str | None = None, extra_paths: tuple[str, ...] = (),
                 root: str = ROOT, bench_dir: str | None = None):
        if split not in (*SPLITS, "all"):   # "all" (dev and test together) counts as test
            raise ValueError(f"split must be one of {SPLITS} or 'all', not {split!r}")
        self.benchmark, self.split, self.root = benchmark, split, root
        self.extra_paths = tuple(extra_paths)
        script = os.path.abspath(script or sys.argv[0])
        self.bench_dir = bench_dir or os.path.dirname(script)
        self.state = tree_state(root, self.extra_paths)
        why = _refusal(split, self.state)
        if why:
            raise DirtyTreeError(why)
        self.header = {
            "schema": SCHEMA, "benchmark": benchmark, "split": split,
            "command": command_line(argv, script), "commit": self.state["commit"],
            "tree_clean": self.state["clean"], "dirty": self.state["dirty"],
            "checked_paths": self.state["paths"], "date": _now(), "machine": machine(),
        }

    def default_path(self, name: str | None = None) -> str:
        stamp = self.header["date"].replace("-", "").replace(":", "")
        return os.path.join(self.bench_dir, "results",
                            f"{name or self.benchmark}-{self.split}-{stamp}.json")

    def write(self, path: str, figures: dict, complete: bool = True) -> str:
        """Write ``{"header": ..., **figures}`` to ``path`` (atomically); returns the path.
        ``complete=False`` marks a partial document (an interrupted run keeps what it had)."""
        if "header" in figures:
            raise ValueError("figures must not have a 'header' key")
        now = tree_state(self.root, self.extra_paths)
        changed = now["commit"] != self.state["commit"] or now["clean"] != self.state["clean"]
        head = dict(self.header, finished=_now(), complete=complete,
                    tree_clean=bool(self.state["clean"] and now["clean"] and not changed)
                    if self.state["clean"] is not None else None)
        if changed:
            head["tree_changed_during_run"] = {"commit": now["commit"], "clean": now["clean"],
                                               "dirty": now["dirty"]}
        doc = {"header": head, **figures}
        why = _refusal(self.split, now) or (
            f"refusing a {self.split!r} result: the tree changed during the run" if changed
            else None)
        if why:
            fd, keep = tempfile.mkstemp(prefix=f"refused-{self.benchmark}-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, default=str)
            raise DirtyTreeError(f"{why}; the figures are in {keep}")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, path)
        return path


def begin(benchmark: str, split: str, argv: list[str] | None = None, *,
          script: str | None = None, extra_paths: tuple[str, ...] = (),
          exit_on_refusal: bool = True) -> Run:
    """Start a run; a refused ``test`` run exits with status 2 and the reason (or raises
    :class:`DirtyTreeError` with ``exit_on_refusal=False``)."""
    try:
        return Run(benchmark, split, argv, script=script, extra_paths=extra_paths)
    except DirtyTreeError as e:
        if not exit_on_refusal:
            raise
        print(f"{benchmark}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def add_args(ap, extra_splits: tuple[str, ...] = (), results: bool = True) -> None:
    """``--split`` (default ``dev``) and, with ``results``, ``--results FILE``."""
    ap.add_argument("--split", choices=(*SPLITS, *extra_splits), default="dev",
                    help="dev (default): any tree, for tuning and looking; test: a figure "
                         "measured once on committed code (refused from a dirty tree)")
    if results:
        ap.add_argument("--results", metavar="FILE", default=None,
                        help="results file (default: results/<benchmark>-<split>-<date>.json "
                             "next to the script)")


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
