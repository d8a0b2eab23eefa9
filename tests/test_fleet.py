"""``reveal fleet``: the index (incremental, readable as is), the node ranking (a planted lemon
first, a node with one bad job not), per-workload baselines usable by ``reveal analyze``,
the period report -- passes on one embedded Dask cluster shared by the module.

Runs: analysed templates (real store, real pipeline, synthetic telemetry; fixtures_fleet.py)
cloned under many job/user/node identities."""
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from fixtures_fleet import clone_run, planted_fleet, tls_options
from reveal_plugins.fleet.index import build_index, discover
from reveal_plugins.fleet.nodes import node_ranking, wilson

pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    from reveal_plugins.fleet.dask_runtime import dask_client
    with dask_client(workers=2) as c:
        yield c


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, fleet_templates, client):
    root = str(tmp_path_factory.mktemp("fleet"))
    fl = planted_fleet(root, fleet_templates)
    fl["index"] = os.path.join(root, "FLEET")
    fl["stats"] = build_index([fl["spool"]], fl["index"], client)
    return fl


def test_wilson_interval():
    lo, hi = wilson(0, 10)
    assert lo == 0 and 0.25 < hi < 0.32
    lo, hi = wilson(10, 10)
    assert hi == pytest.approx(1) and 0.68 < lo < 0.75
    assert wilson(0, 0) == (0.0, 1.0)


def test_planted_lemon_ranks_first_one_bad_job_does_not(fleet, client):
    res = node_ranking(fleet["index"], client)
    nodes = res["nodes"]
    assert nodes[0]["node"] == fleet["lemon"], [(r["node"], r["score"]) for r in nodes]
    lemon = nodes[0]
    assert lemon["suspect"] and lemon["users_affected"] >= 3
    assert lemon["dominant_subsystem"] == "cpu"
    assert lemon["ci_low"] > res["fleet_rate"]
    assert lemon["drain_command"].startswith(f"scontrol update NodeName={fleet['lemon']} "
                                             "State=DRAIN Reason=")
    one_bad = next(r for r in nodes if r["node"] == fleet["one_bad"])
    assert one_bad["anomalous"] == 1 and not one_bad["suspect"]
    assert one_bad["drain_command"] is None
    assert [r["node"] for r in nodes if r["suspect"]] == [fleet["lemon"]]
    # the single-process pass gives the same ranking
    ref = node_ranking(fleet["index"], None)
    assert [(r["node"], r["anomalous"], r["score"]) for r in ref["nodes"]] == \
        [(r["node"], r["anomalous"], r["score"]) for r in nodes]


def test_one_users_bad_jobs_make_no_suspect(tmp_path, fleet_templates):
    """Many bad runs of ONE user on a node (the user's job, not the node) is no lemon."""
    root = str(tmp_path)
    for i in range(24):
        node = f"n{i % 4}"
        bad = node == "n1" and (i // 4) % 2 == 0
        user = "mallory" if node == "n1" else f"u{i % 3}"
        clone_run(fleet_templates["cpu" if bad else "clean"], f"{root}/spool/{i}/{node}",
                  job_id=str(i), user=user, node=node, workload="w", start=1.79e9 + i)
    build_index([f"{root}/spool"], f"{root}/F", None)
    res = node_ranking(f"{root}/F")
    n1 = next(r for r in res["nodes"] if r["node"] == "n1")
    assert n1["anomalous"] == 3 and n1["users_affected"] == 1
    assert not n1["suspect"]


def test_index_layout_is_read_as_is(fleet):
    import pandas as pd
    idx = fleet["index"]
    assert fleet["stats"]["indexed"] == len(fleet["runs"]) and fleet["stats"]["errors"] == 0
    runs = pd.read_parquet(os.path.join(idx, "runs"))
    assert len(runs) == len(fleet["runs"]) and runs["run_key"].is_unique
    assert {"day", "node", "user", "workload", "job_id", "partition", "start", "exit_code",
            "n_anomalies", "subsystems", "peer_suspects"} <= set(runs.columns)
    assert runs["day"].nunique() == 3
    assert set(runs["workload"]) == {"train-resnet", "train-llm", "cfd-solver"}
    bad = sum(r["kind"] != "clean" for r in fleet["runs"])
    assert int(runs["anomalous"].sum()) == bad
    an = pd.read_parquet(os.path.join(idx, "anomalies"))
    assert set(an["run_key"]) == set(runs.loc[runs["anomalous"], "run_key"])
    assert set(an["subsystem"]) <= {"cpu", "storage"}
    feats = pq.ParquetDataset(os.path.join(idx, "features")).read().to_pandas()
    assert feats.groupby("run_key").size().min() > 10
    assert {"cpu.all.busy_pct", "median", "mad", "windows"} <= set(feats["channel"]) | set(
        feats.columns)
    polars = pytest.importorskip("polars")
    p = polars.read_parquet(f"{idx}/runs/**/*.parquet", hive_partitioning=True)
    assert p.height == len(runs) and "day" in p.columns
    duckdb = pytest.importorskip("duckdb")
    n = duckdb.sql(f"select count(*) from read_parquet('{idx}/runs/*/*.parquet', "
                   "hive_partitioning=1)").fetchall()[0][0]
    assert n == len(runs)


def test_index_is_incremental(tmp_path, fleet_templates, client):
    root = str(tmp_path)
    dirs = [clone_run(fleet_templates["clean"], f"{root}/spool/jobs/{j}/nodeA", job_id=str(j),
                      user="u", node="nodeA", workload="w", start=1.79e9 + j)
            for j in range(6)]
    idx = f"{root}/F"
    s = build_index([f"{root}/spool"], idx, client)
    assert (s["indexed"], s["runs"]) == (6, 6)
    s = build_index([f"{root}/spool"], idx, client)
    assert (s["indexed"], s["unchanged"]) == (0, 6)
    # one run is re-analysed with a finding, one run is new
    os.unlink(os.path.join(dirs[2], "report.json"))
    with open(os.path.join(fleet_templates["cpu"], "report.json")) as f:
        rep = json.load(f)
    with open(os.path.join(dirs[2], "report.json"), "w") as f:
        json.dump(rep, f)
    clone_run(fleet_templates["clean"], f"{root}/spool/jobs/99/nodeB", job_id="99", user="v",
              node="nodeB", workload="w", start=1.79e9)
    s = build_index([f"{root}/spool"], idx, client)
    assert (s["indexed"], s["changed"], s["runs"]) == (2, 1, 7)
    t = pq.read_table(os.path.join(idx, "runs")).to_pandas()
    assert len(t) == 7 and t["run_key"].is_unique
    assert t.loc[t["job_id"] == "2", "n_anomalies"].item() >= 1
    assert set(pq.read_table(os.path.join(idx, "anomalies")).column("job_id").to_pylist()) \
        == {"2"}


def test_broken_run_is_a_row_not_a_failure(tmp_path, fleet_templates):
    root = str(tmp_path)
    clone_run(fleet_templates["clean"], f"{root}/s/ok", job_id="1", user="u", node="n",
              workload="w", start=1.79e9)
    os.makedirs(f"{root}/s/bad")
    with open(f"{root}/s/bad/meta.json", "w") as f:
        f.write("{not json")
    os.symlink(f"{root}/s/ok", f"{root}/s/link")      # never followed
    assert discover([f"{root}/s"]) == [f"{root}/s/bad", f"{root}/s/ok"]
    s = build_index([f"{root}/s"], f"{root}/F", None)
    assert (s["runs"], s["errors"]) == (2, 1)
    rows = pq.read_table(f"{root}/F/runs").to_pylist()
    bad = next(r for r in rows if r["run_dir"].endswith("/bad"))
    assert bad["status"] == "unreadable" and "meta.json" in bad["error"]


def test_fleet_baseline_per_workload_matches_baseline_fit(fleet, client, tmp_path):
    from reveal_plugins.detect.batch.baseline import fit_baseline, load
    from reveal_plugins.fleet.baseline import fit_fleet_baselines
    out = str(tmp_path / "bl")
    idx = fit_fleet_baselines(fleet["index"], out, client, max_runs=5)
    assert set(idx["baselines"]) == {"train-resnet", "train-llm", "cfd-solver"}
    b = load(os.path.join(out, idx["baselines"]["train-llm"]["file"]))
    assert b["name"] == "train-llm" and len(b["runs"]) == 5
    healthy = {r["dir"] for r in fleet["runs"] if r["kind"] == "clean"}
    assert {r["run_dir"] for r in b["runs"]} <= healthy
    # the same numbers as `reveal baseline fit` over the same runs (window level)
    ref = fit_baseline([r["run_dir"] for r in b["runs"]])
    rc = {c["name"]: c for c in ref["channels"]}
    common = [c for c in b["channels"] if c["name"] in rc]
    assert len(common) >= 0.9 * len(rc)
    for c in common:
        r = rc[c["name"]]
        assert abs(c["center"] - r["center"]) <= 0.25 * r["scale"] + 1e-6, c["name"]
        assert 0.5 * r["scale"] <= c["scale"] <= 2.0 * r["scale"] + 1e-9, c["name"]


@pytest.mark.slow
def test_fleet_baseline_used_by_reveal_analyze(fleet, client, tmp_path, fleet_templates):
    from reveal_plugins.fleet.baseline import fit_fleet_baselines
    out = str(tmp_path / "bl")
    idx = fit_fleet_baselines(fleet["index"], out, client, max_runs=4)
    bfile = os.path.join(out, idx["baselines"]["cfd-solver"]["file"])
    run = clone_run(fleet_templates["clean"], str(tmp_path / "new"), job_id="5", user="u",
                    node="n", workload="cfd-solver", start=1.79e9)
    os.unlink(os.path.join(run, "report.json"))
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "analyze", run,
                        "--baseline", bfile, "--no-publish", "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["status"] == "ok" and rep["anomalies"] == []


def test_report_text_json_html(fleet, client):
    from reveal_plugins.fleet.report import fleet_summary, format_text, render_html
    s = fleet_summary(fleet["index"], client)
    assert s["worst_nodes"][0]["node"] == fleet["lemon"]
    assert [r["node"] for r in s["suspect_nodes"]] == [fleet["lemon"]]
    assert s["anomalies_per_subsystem"]["cpu"] >= 10
    assert len({r["day"] for r in s["anomalies_per_day"]}) == 3
    text = format_text(s)
    assert fleet["lemon"] in text and "SUSPECT" in text and "scontrol update" in text
    json.dumps(s, default=str)
    html = render_html(s)
    assert html.count("<svg") == 3 and fleet["lemon"] in html and "<script" not in html
    # a period holding only the first day
    day0 = min(r["day"] for r in s["anomalies_per_day"])
    import calendar
    import time
    since = calendar.timegm(time.strptime(day0, "%Y-%m-%d"))
    s1 = fleet_summary(fleet["index"], client, since=since, until=since + 86400)
    assert {r["day"] for r in s1["anomalies_per_day"]} == {day0}
    assert s1["runs_analysed"] < s["runs_analysed"]


def test_cli_end_to_end_and_errors(fleet, tmp_path):
    cli = [sys.executable, "-m", "reveal_plugins.cli", "fleet"]
    r = subprocess.run(cli + ["nodes", fleet["index"], "--workers", "1", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["nodes"][0]["node"] == fleet["lemon"]
    assert r.stderr == ""    # no progress bar when stderr is not a terminal
    r = subprocess.run(cli + ["nodes", str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "not a fleet index" in r.stderr
    r = subprocess.run(cli + ["index", str(tmp_path / "nope"), "--out", str(tmp_path / "F"),
                              "--workers", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "nope: not a directory" in r.stderr


def test_progress_bar_only_on_a_terminal(fleet, tmp_path):
    """Every pass shows a bar on a terminal (stderr a pty); pipes stay clean (above)."""
    import pty
    master, slave = pty.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "fleet", "index",
                            fleet["spool"], "--out", str(tmp_path / "F"), "--workers", "1"],
                           stdout=subprocess.PIPE, stderr=slave, timeout=120)
        os.close(slave)
        slave = None
        chunks = []
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                break
            if not b:
                break
            chunks.append(b)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert r.returncode == 0
    err = b"".join(chunks).decode(errors="replace")
    n = len(fleet["runs"])
    assert f"reveal: indexing runs 0/{n}" in err and f"indexing runs {n}/{n}" in err


def test_features_read_from_the_runs_feature_store(tmp_path, fleet_templates):
    """A run featurized while it went on (DIR/features/) is not windowed again: the index
    reads its window means, and they summarise the run as the segments do."""
    from reveal_plugins.detect.longrun import featstore
    from reveal_plugins.fleet import extract
    from reveal_plugins.store.store import read_meta
    from reveal_plugins.types import ChannelMeta
    d = clone_run(fleet_templates["cpu"], str(tmp_path / "r"), job_id="1", user="u", node="n",
                  workload="w", start=1.79e9)
    meta = read_meta(d)
    ref = {r["channel"]: r for r in extract.run_features(d, meta)}
    metas = [ChannelMeta.from_dict(c) for c in meta["channels"]]
    featstore.FeatureStore.for_run(d, create=True).update(d, metas, meta["interval_s"], 3.0, 1.0)
    assert extract._stored_windows(d, meta, 3.0) is not None
    got = {r["channel"]: r for r in extract.run_features(d, meta)}
    assert set(got) == set(ref)
    for ch, r in ref.items():
        g = got[ch]
        assert abs(g["median"] - r["median"]) <= 0.05 * abs(r["median"]) + 0.5 * r["mad"] + \
            1e-6, (ch, g, r)
        assert abs(g["windows"] - r["windows"]) <= 3


def test_scheduler_option_joins_an_existing_cluster(fleet, client, tmp_path):
    """--scheduler ADDRESS: the pass runs on the given cluster's workers (not a new one),
    over TLS with the cluster's CA, certificate and key."""
    worker_pids = set(client.run(os.getpid).values())
    assert client.scheduler.address.startswith("tls://")
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "fleet", "nodes",
                        fleet["index"], "--json", "--scheduler", client.scheduler.address,
                        *tls_options(client.security, str(tmp_path))],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["nodes"][0]["node"] == fleet["lemon"]
    pids = {int(w.rsplit(":", 1)[1]) for w in res["ran_on"]}
    assert pids and pids <= worker_pids, (res["ran_on"], worker_pids)
