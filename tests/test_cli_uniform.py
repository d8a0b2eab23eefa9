"""One CLI: every command's parser is walked (the real parsers, from the one command table),
so an option without help text, a ``--out`` without ``-o``, a ``--json`` without ``--format``
or a command missing from the top-level help fails here; exit codes are checked by running the
commands on bad input."""
import argparse
import json
import os
import subprocess
import sys

import pytest

from reveal_plugins.cli import COMMANDS, parser_for, usage

CLI = [sys.executable, "-m", "reveal_plugins.cli"]


def reveal(*args, **kw):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, **kw)


def walk(path, p):
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from walk(f"{path} {name}", sp)


ALL = [(path, p) for cmd in COMMANDS for path, p in walk(f"reveal {cmd}", parser_for(cmd))]


@pytest.mark.parametrize("path,p", ALL, ids=[x[0] for x in ALL])
def test_every_option_says_what_it_does(path, p):
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = "/".join(a.option_strings) or a.dest
        assert a.help and a.help is not argparse.SUPPRESS and len(a.help) > 8, \
            f"{path}: {name} has no help text"


@pytest.mark.parametrize("path,p", ALL, ids=[x[0] for x in ALL])
def test_output_options_are_spelled_the_same_everywhere(path, p):
    opts = {s: a for a in p._actions for s in a.option_strings}
    if "--out" in opts:
        assert "-o" in opts and opts["-o"] is opts["--out"], f"{path}: --out without -o"
    if "--json" in opts:
        assert "--format" in opts and opts["--json"].dest == opts["--format"].dest == "format", \
            f"{path}: --json is not an alias of --format"
        assert "json" in opts["--format"].choices
        assert opts["-f"] is opts["--format"]


def test_top_level_help_names_every_command_and_subcommand():
    text = reveal("--help").stdout
    assert text == usage()
    assert "--version" in text and "exit status" in text
    for path, _ in ALL:
        for word in path.split()[1:]:
            assert word in text, f"{path}: {word!r} missing from `reveal --help`"
    assert reveal("--version").stdout.startswith("reveal ")


def test_json_is_an_alias_of_format_json():
    a, b = reveal("probes", "--json"), reveal("probes", "--format", "json")
    assert a.returncode == b.returncode == 0
    names = lambda r: sorted(x["name"] for x in json.loads(r.stdout))  # noqa: E731
    assert names(a) == names(b) and names(a)


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c != "slurm"])
def test_an_unknown_option_is_a_usage_error(cmd):
    r = reveal(cmd, "--no-such-option")
    assert r.returncode == 2, (cmd, r.stdout, r.stderr)
    assert "usage:" in r.stderr and "error:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("argv", [
    ["report", "{missing}"], ["analyze", "{missing}"], ["compare", "{missing}", "{missing}"],
    ["baseline", "show", "{missing}"], ["otel", "export", "{missing}", "--endpoint",
                                          "http://127.0.0.1:9"]],
    ids=lambda a: " ".join(a[:2]))
def test_an_unreadable_input_is_a_data_problem(tmp_path, argv):
    """The same fault (a path that is not there) exits 1 whichever command reads it."""
    missing = str(tmp_path / "not-there")
    r = reveal(*[a.replace("{missing}", missing) for a in argv])
    assert r.returncode == 1, (argv, r.stdout, r.stderr)
    assert "not-there" in r.stderr and "Traceback" not in r.stderr


def test_a_missing_argument_is_a_usage_error():
    for argv in (["report"], ["analyze"], ["compare", "a"], ["slurm", "job-info"]):
        r = reveal(*argv)
        assert r.returncode == 2 and "usage:" in r.stderr, (argv, r.stderr)


def test_bash_completion_completes_commands_subcommands_and_options(tmp_path):
    script = tmp_path / "reveal.bash"
    r = reveal("completion", "bash")
    assert r.returncode == 0
    script.write_text(r.stdout)

    def complete(*words):
        line = " ".join(f"'{w}'" for w in words)
        sh = (f"source {script}; COMP_WORDS=(reveal {line}); COMP_CWORD={len(words)}; "
              "_reveal; printf '%s\\n' \"${COMPREPLY[@]}\"")
        out = subprocess.run(["bash", "-c", sh], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert complete("comp") == ["compare", "completion"]
    assert complete("fleet", "n") == ["nodes"]
    assert "--min-users" in complete("fleet", "nodes", "--min")
    assert complete("record", "--inte") == ["--interval"]
    assert complete("slurm", "ch") == ["check"]
    assert "--format" in complete("report", "--f")
