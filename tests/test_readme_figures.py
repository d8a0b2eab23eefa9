"""README's "Measured" table is rendered from committed results files, and results files pin
what ran: a figure edited by hand, a figure without a file, a file that changed under an
unchanged README, or a ``test`` result from a dirty tree all fail here.  Fast (no benchmark
runs)."""
import argparse
import difflib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)

import readme_table  # noqa: E402
import results  # noqa: E402

HEADER_FIELDS = {"command", "commit", "tree_clean", "machine", "date", "split"}


def _git_tracked(rel: str) -> bool | None:
    try:
        r = subprocess.run(["git", "-C", ROOT, "ls-files", "--error-unmatch", "--", rel],
                           capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    if r.returncode != 0 and "not a git repository" in r.stderr:
        return None
    return r.returncode == 0


def test_readme_table_is_the_rendered_one():
    with open(readme_table.README) as f:
        block = readme_table.readme_block(f.read())
    assert block is not None, "README.md has no measured:begin/end block"
    rendered = readme_table.render()
    assert block == rendered, (
        "README's Measured table differs from the results files; run "
        "`python benchmarks/readme_table.py --write` (or fix the file):\n"
        + "".join(difflib.unified_diff(block.splitlines(True), rendered.splitlines(True))))


def test_every_row_has_a_committed_results_file_or_says_not_yet():
    rows = readme_table.render_rows()
    assert len(rows) == len(readme_table.ROWS) >= 14
    for r in rows:
        if not r["files"]:
            assert r["figure"].startswith(readme_table.NOT_YET), r
            assert r["rerun"], r
            continue
        assert readme_table.NOT_YET not in r["figure"]
        for rel, head in r["files"]:
            assert os.path.isfile(os.path.join(ROOT, rel)), rel
            assert _git_tracked(rel) in (True, None), f"{rel} is cited but not committed"
            if head.get("legacy"):   # written before results headers: named as such
                assert head.get("commit") or head.get("committed_in"), rel
                assert head["tree_clean"] is None and head["command"] and head["date"], rel
                continue
            missing = HEADER_FIELDS - set(head)
            assert not missing, f"{rel}: header lacks {missing}"
            assert head["commit"] and head["command"] and head["date"], rel
            assert head["machine"].get("cores") and head["machine"].get("kernel"), rel


def test_a_figure_edited_by_hand_fails(tmp_path, monkeypatch):
    with open(readme_table.README) as f:
        text = f.read()
    fig = re.search(r"\(\d+\.\d+× one\)", text).group(0)   # the fleet row's speed-up
    fake = tmp_path / "README.md"
    fake.write_text(text.replace(fig, "(9.99× one)"))
    monkeypatch.setattr(readme_table, "README", str(fake))
    assert readme_table.main(["--check"]) == 1
    fake.write_text(text)
    assert readme_table.main(["--check"]) == 0


def test_figures_follow_their_file(tmp_path, monkeypatch):
    rel, _ = readme_table.pick("benchmarks/gpu/results/*.json", lambda d: "modes" in d)
    with open(os.path.join(ROOT, rel)) as f:
        d = json.load(f)
    d["modes"]["current_driver"]["probe"]["per_sample_median_ms"] = 9.876
    (tmp_path / os.path.dirname(rel)).mkdir(parents=True)
    (tmp_path / rel).write_text(json.dumps(d))
    monkeypatch.setattr(readme_table, "ROOT", str(tmp_path))
    table = readme_table.render()
    assert "9.88 ms (current driver)" in table
    # every other row, its file gone, is "not yet re-measured" rather than a figure
    rows = readme_table.render_rows()
    assert [bool(r["files"]) for r in rows].count(True) == 1
    assert all(r["figure"].startswith(readme_table.NOT_YET) for r in rows if not r["files"])


def test_a_test_result_prefers_over_dev_then_newest(tmp_path, monkeypatch):
    d = tmp_path / "benchmarks" / "report" / "results"
    d.mkdir(parents=True)

    def doc(split, date, kib):
        return {"header": {"split": split, "date": date, "command": "c", "commit": "a" * 40,
                           "tree_clean": True, "machine": {"cores": 2}, "complete": True},
                "seconds": 7200, "channels": 300, "reference_1hz": {"html_KiB": 400.0},
                "run_10hz": {"html_KiB": kib}}
    (d / "report-dev-1.json").write_text(json.dumps(doc("dev", "2026-12-05T00:00:00Z", 1.0)))
    (d / "report-test-1.json").write_text(json.dumps(doc("test", "2026-12-01T00:00:00Z", 2.0)))
    (d / "report-test-2.json").write_text(json.dumps(doc("test", "2026-12-02T00:00:00Z", 3.0)))
    partial = doc("test", "2026-12-09T00:00:00Z", 4.0)
    partial["header"]["complete"] = False
    (d / "report-test-3.json").write_text(json.dumps(partial))
    monkeypatch.setattr(readme_table, "ROOT", str(tmp_path))
    rel, got = readme_table.pick("benchmarks/report/results/report-*.json")
    assert rel.endswith("report-test-2.json") and got["run_10hz"]["html_KiB"] == 3.0


def test_split_is_dev_by_default_everywhere():
    ap = argparse.ArgumentParser()
    results.add_args(ap)
    assert ap.parse_args([]).split == "dev"
    for dp, _, fns in os.walk(BENCH):
        for fn in fns:
            if fn.endswith(".py") and fn != "results.py":
                with open(os.path.join(dp, fn)) as f:
                    src = f.read()
                assert 'add_argument("--split"' not in src, (
                    f"{fn}: take --split from results.add_args (default dev)")
                if "--split" in src and "readme_table" not in fn:
                    assert "add_args(" in src, fn


def _repo(tmp_path):
    if not shutil.which("git"):
        pytest.skip("git not installed")
    root = tmp_path / "repo"
    (root / "reveal_plugins").mkdir(parents=True)
    (root / "benchmarks" / "x").mkdir(parents=True)
    (root / "reveal_plugins" / "a.py").write_text("A = 1\n")
    (root / "benchmarks" / "x" / "run.py").write_text("")
    (root / "tests").mkdir()
    (root / "tests" / "unrelated.py").write_text("")
    g = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(g + ["init", "-q"], check=True)
    subprocess.run(g + ["add", "-A"], check=True)
    subprocess.run(g + ["commit", "-qm", "x"], check=True)
    return root


def _run(root, split):
    return results.Run("x", split, ["--split", split], script=str(root / "benchmarks" / "x"
                                                                  / "run.py"), root=str(root))


def test_test_result_refused_from_a_dirty_tree(tmp_path):
    root = _repo(tmp_path)
    run = _run(root, "test")
    assert run.header["tree_clean"] is True and len(run.header["commit"]) == 40
    assert run.header["split"] == "test"
    assert {"cores", "memory_gib", "kernel", "python"} <= set(run.header["machine"])
    path = run.write(run.default_path(), {"figure": 1})
    doc = json.load(open(path))
    assert doc["figure"] == 1 and doc["header"]["tree_clean"] is True
    assert doc["header"]["complete"] is True and doc["header"]["command"].endswith("--split test")
    # the results file just written, or a change outside the code paths, keeps the tree clean
    (root / "tests" / "unrelated.py").write_text("changed\n")
    _run(root, "test")
    # a changed module: test refused, dev written and says so
    (root / "reveal_plugins" / "a.py").write_text("A = 2\n")
    with pytest.raises(results.DirtyTreeError, match="dirty tree"):
        _run(root, "test")
    with pytest.raises(results.DirtyTreeError):
        _run(root, "all")
    dev = _run(root, "dev")
    assert dev.header["tree_clean"] is False
    assert any("reveal_plugins/a.py" in x for x in dev.header["dirty"])
    p = dev.write(str(tmp_path / "dev.json"), {"figure": 2})
    assert json.load(open(p))["header"]["tree_clean"] is False
    # an untracked file in the code paths counts too
    (root / "reveal_plugins" / "a.py").write_text("A = 1\n")
    _run(root, "test")
    (root / "benchmarks" / "x" / "new.py").write_text("")
    with pytest.raises(results.DirtyTreeError):
        _run(root, "test")


def test_tree_changed_during_a_test_run_is_refused_at_write(tmp_path):
    root = _repo(tmp_path)
    run = _run(root, "test")
    (root / "reveal_plugins" / "a.py").write_text("A = 3\n")
    out = tmp_path / "out.json"
    with pytest.raises(results.DirtyTreeError, match="figures are in"):
        run.write(str(out), {"figure": 1})
    assert not out.exists()


def test_no_git_means_no_test_result(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    with pytest.raises(results.DirtyTreeError, match="cannot tell"):
        results.Run("x", "test", [], script=str(tmp_path / "benchmarks" / "r.py"),
                    root=str(tmp_path))
    run = results.Run("x", "dev", [], script=str(tmp_path / "benchmarks" / "r.py"),
                      root=str(tmp_path))
    assert run.header["tree_clean"] is None and run.header["commit"] is None


def test_peers_figures_agree_with_the_text_summary(tmp_path):
    spec = importlib.util.spec_from_file_location("peers_run_for_test",
                                                  os.path.join(BENCH, "peers", "run.py"))
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)

    def fault(kind, tool, node, sub, ref_node, live):
        return {"ok": True, "kind": kind, "tool": tool, "node_ok": node, "sub_ok": sub,
                "latency": 0.5 if node else None, "other_node": 0, "live": live,
                "ref_node_ok": ref_node, "ref_sub_ok": False, "ref_latency": None,
                "ref_live": None, "ref_live_node_ok": False}

    def clean(false, live_false, ref_false):
        return {"ok": True, "kind": "clean", "false": false, "live_false": live_false,
                "ref_false": ref_false}
    scores = [fault("cpu", "stress-cpu", True, True, False, 4.0),
              fault("cpu", "dd-zero", True, False, True, 6.0),
              fault("network", "tbf-20mbit", False, False, True, None),
              fault("memory", "stress-vm", True, True, False, 5.0),
              fault("io", "dd-fsync", True, True, True, 3.0),
              clean(0, 1, 2), clean(1, 0, 0), clean(0, 0, 1),
              {"ok": False, "kind": "io"}]
    fig = peers.figures(scores)
    assert fig["node_ok"] == 4 and fig["subsystem_ok"] == 3 and fig["ref_node_ok"] == 3
    assert fig["false_suspects_clean"] == 1 and fig["live_false_clean"] == 1
    txt = tmp_path / "r.txt"
    txt.write_text("# benchmarks/peers/run.py --runs 9 --seconds 45 --split test --seed 5  "
                   "(2026-12-03 23:04:36 UTC, git abc1234, 2 CPUs, load 1.0)\n"
                   + "\n".join(peers.summary(scores)) + "\n\n")
    legacy = readme_table._peers_legacy(str(txt), 5)["figures"]
    assert legacy == {k: v for k, v in fig.items() if k in legacy}
