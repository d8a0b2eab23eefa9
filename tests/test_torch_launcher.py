"""reveal-torchrun end to end: real torch, CPU, gloo, the real agent and analysis."""
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from conftest import SCHEMA_PATH

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train.py"


def launch(args, cwd, env=None, timeout=240, prefix=()):
    """Run ``reveal-torchrun ARGS`` (as the console script does); returns CompletedProcess."""
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    e.pop("SLURM_JOB_ID", None)
    cmd = [*prefix, sys.executable, "-m", "reveal_plugins.torch_ext.launcher", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)


def events(run_dir):
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def meta(run_dir):
    with open(os.path.join(run_dir, "meta.json")) as f:
        return json.load(f)


def explain(r):
    return f"rc={r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-6000:]}"


def test_reveal_options_are_stripped_and_the_rest_passes_unchanged():
    from reveal_plugins.torch_ext.launcher import split_args
    opts, rest = split_args(["--nproc-per-node", "2", "--reveal-out", "d", "-r", "3",
                             "--reveal-interval=0.5", "--max_restarts=1", "--standalone",
                             "train.py", "--reveal-out", "x", "--lr", "1"])
    assert (opts.out, opts.interval_s, opts.off) == ("d", 0.5, False)
    # the script's own --reveal-out is the script's business
    assert rest == ["--nproc-per-node", "2", "-r", "3", "--max_restarts=1", "--standalone",
                    "train.py", "--reveal-out", "x", "--lr", "1"]
    opts, rest = split_args(["--nproc", "2", "--reveal-off", "-m", "pkg.mod", "--reveal-off"])
    assert opts.off and rest == ["--nproc", "2", "-m", "pkg.mod", "--reveal-off"]


@pytest.mark.parametrize("bad, needle", [
    (["--reveal-outdir", "x"], "unknown option '--reveal-outdir'"),
    (["--reveal-interval", "0"], "--reveal-interval"),
    (["--reveal-off=yes"], "--reveal-off takes no value"),
    (["--reveal-out", "--standalone"], "--reveal-out needs a value"),
])
def test_bad_reveal_options_are_rejected_with_the_option_named(bad, needle):
    from reveal_plugins.torch_ext.launcher import UsageError, split_args
    with pytest.raises(UsageError, match=needle.replace("-", r"\-")):
        split_args([*bad, "--standalone", "train.py"])


def test_markers_on_by_default_and_opt_out():
    from reveal_plugins.torch_ext.launcher import markers_wanted, split_args
    opts, rest = split_args(["--standalone", "train.py"], table={"--standalone": False})
    assert opts.markers and markers_wanted(opts.markers, {})
    opts, rest = split_args(["--reveal-no-markers", "--standalone", "train.py"],
                            table={"--standalone": False})
    assert not opts.markers and rest == ["--standalone", "train.py"]
    assert not markers_wanted(opts.markers, {})
    assert not markers_wanted(True, {"REVEAL_ITERATION_MARKERS": "0"})


@pytest.mark.slow
def test_no_markers_option_records_no_iterations(tmp_path):
    run = tmp_path / "run"
    r = launch(["--reveal-out", run, "--reveal-no-markers", "--standalone",
                "--nproc-per-node", "1", TRAIN, "--model", "mlp", "--steps", 60,
                "--log-every", "0"], cwd=tmp_path)
    assert r.returncode == 0, explain(r)
    assert not [e for e in events(run) if e["event"] == "iteration"]


def test_unknown_reveal_option_stops_before_any_worker_starts(tmp_path):
    touched = tmp_path / "worker-ran"
    script = tmp_path / "w.py"
    script.write_text(f"open({str(touched)!r}, 'w').close()\n")
    r = launch(["--standalone", "--reveal-outdir", "x", "--nproc-per-node", "1", script],
               cwd=tmp_path, timeout=60)
    assert r.returncode == 2, explain(r)
    assert "reveal-torchrun: error: unknown option '--reveal-outdir'" in r.stderr
    assert not touched.exists(), "a worker started despite the bad option"
    assert not (tmp_path / "reveal-runs").exists(), "telemetry started despite the bad option"


@pytest.mark.slow
def test_two_workers_recorded_with_ranks_pids_iterations_and_a_valid_report(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    run = tmp_path / "run"
    steps = 150
    # markers by default: no --instrument, no environment variable
    r = launch(["--reveal-out", run, "--reveal-interval", "0.2", "--standalone",
                "--nproc-per-node", "2", TRAIN, "--model", "mlp", "--steps", steps,
                "--log-every", "0"], cwd=tmp_path)
    assert r.returncode == 0, explain(r)
    ev = events(run)
    m = meta(run)
    assert m["exit_code"] == 0 and m["run"]["source"] == "torchrun"
    ranks = {e["rank"]: e for e in ev if e["event"] == "rank"}
    assert set(ranks) == {0, 1}
    for rk, e in ranks.items():
        assert isinstance(e["pid"], int) and e["pid"] > 0 and e["local_rank"] == rk
        assert e["world_size"] == 2 and e["restart"] == 0
    pids = {p for e in ev if e["event"] == "pids" for p in e["pids"]}
    assert {e["pid"] for e in ranks.values()} <= pids
    its = [e for e in ev if e["event"] == "iteration"]
    for rk in (0, 1):
        mine = [e for e in its if e["rank"] == rk]
        assert mine, f"no iteration events for rank {rk}"
        assert all(e["dt"] > 0 and e["step"] >= 2 for e in mine)
        # every step after the first is covered exactly once
        assert sum(e.get("n", 1) for e in mine) == steps - 1
        assert max(e["step"] for e in mine) == steps
        assert [e["t"] for e in mine] == sorted(e["t"] for e in mine)
    assert any(e["event"] == "elastic" and e.get("kind") == "rendezvous" for e in ev)
    assert any(e["event"] == "elastic" and e.get("state") == "SUCCEEDED" for e in ev)
    report = json.loads((run / "report.json").read_text())
    jsonschema.validate(report, json.loads(pathlib.Path(SCHEMA_PATH).read_text()))
    assert "Reveal" in r.stderr  # the summary is printed
    assert "sitecustomize" not in r.stderr  # the worker bootstrap stays silent


@pytest.mark.slow
def test_worker_crash_once_is_restarted_and_recorded(tmp_path):
    run = tmp_path / "run"
    r = launch(["--reveal-out", run, "--standalone", "--nproc-per-node", "2", "--max-restarts",
                "1", TRAIN, "--steps", "40", "--crash-once-at", "10", "--log-every", "0",
                "--instrument"], cwd=tmp_path)
    assert r.returncode == 0, explain(r)
    assert (run / "events.jsonl").exists(), explain(r)
    ev = events(run)
    assert meta(run)["exit_code"] == 0
    failed = [e for e in ev if e["event"] == "elastic" and e.get("state") == "FAILED"]
    assert failed and failed[0]["exit_code"] == 1 and failed[0]["local_rank"] == 0
    restarts = [e for e in ev if e["event"] == "elastic" and e.get("kind") == "restart"]
    assert [e["restart"] for e in restarts] == [1]
    layout = [(e["restart"], e["rank"], e["pid"]) for e in ev if e["event"] == "rank"]
    assert sorted((a, b) for a, b, _ in layout) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len({p for _, _, p in layout}) == 4  # new processes after the restart
    assert failed[0]["t"] < restarts[0]["t"]
    # iteration markers continue from the restarted workers
    assert any(e["event"] == "iteration" and e["step"] == 40 for e in ev)


@pytest.mark.slow
def test_failing_script_exit_code_propagates_and_run_is_finalized(tmp_path):
    run = tmp_path / "run"
    r = launch(["--reveal-out", run, "--standalone", "--nproc-per-node", "2", TRAIN,
                "--steps", "50", "--fail-at-step", "2", "--fail-code", "3", "--log-every", "0"],
               cwd=tmp_path)
    # torchrun itself exits 1 when a worker fails (the worker's code is in its error table)
    assert r.returncode == 1, explain(r)
    assert "exitcode  : 3" in r.stderr
    m = meta(run)
    assert m["exit_code"] == 1 and m.get("end")
    ev = events(run)
    assert ev[-1]["event"] == "run_end" and ev[-1]["exit_code"] == 1
    assert any(e["event"] == "elastic" and e.get("state") == "FAILED" and e.get("exit_code") == 3
               for e in ev)
    assert (run / "report.json").exists()


@pytest.mark.slow
@pytest.mark.netns
def test_two_nodes_in_two_netns_share_one_run_identity(tmp_path, netns_pair):
    p = netns_pair
    base = tmp_path / "runs"
    port = 29400 + os.getpid() % 500
    rdzv_id = f"job{os.getpid()}"
    procs = []
    # is_host: torchrun cannot tell that the endpoint's address is its own inside a netns
    for side, ip, veth, host in (("a", p.ip_a, p.veth_a, 1), ("b", p.ip_b, p.veth_b, 0)):
        args = ["--reveal-out", base, "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{p.ip_a}:{port}",
                "--rdzv-conf", f"is_host={host},join_timeout=90",
                "--rdzv-id", rdzv_id, "--local-addr", ip, TRAIN, "--steps", "30",
                "--log-every", "0", "--instrument"]
        e = {**os.environ, "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": veth}
        e.pop("SLURM_JOB_ID", None)
        cmd = p.cmd(side, [sys.executable, "-m", "reveal_plugins.torch_ext.launcher", *args])
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
        time.sleep(0.5)  # node a hosts the rendezvous store
    outs = [pr.communicate(timeout=240) for pr in procs]
    for pr, (o, err) in zip(procs, outs):
        assert pr.returncode == 0, f"rc={pr.returncode}\n{o[-2000:]}\n{err[-5000:]}"
    dirs = sorted(d for d in base.iterdir() if (d / "meta.json").exists())
    assert len(dirs) == 2, dirs
    metas = [meta(d) for d in dirs]
    assert {m["run"]["run_id"] for m in metas} == {f"torchrun-{rdzv_id}"}
    assert all(m["run"]["extra"]["torchrun"]["rdzv_id"] == rdzv_id for m in metas)
    layout = sorted((e["group_rank"], e["rank"], e["world_size"])
                    for d in dirs for e in events(d) if e["event"] == "rank")
    assert layout == [(0, 0, 2), (1, 1, 2)]
    for d in dirs:
        assert (d / "report.json").exists()
        assert any(e["event"] == "iteration" for e in events(d))
