"""Issue 23, item 4: one configuration file, one table per part, each validated by its owner's
model; every table's settings reach the part that uses them; a typo is an error naming the
file, the table, the key and the value; ``reveal config show`` says what is in force and
where it came from."""
import json
import os
import subprocess
import sys

import pytest

from reveal_plugins import site_config
from reveal_plugins.slurm import config as slurm_config


def _write(tmp_path, text, name="reveal.toml"):
    p = tmp_path / name
    p.write_text(text)
    os.chmod(p, 0o644)
    return str(p)


def _reveal(args, env_extra, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("REVEAL_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "reveal_plugins.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("text,needle", [
    ("[detect]\nthreshhold = 5\n", "[detect] unknown key 'threshhold' (known: "),
    ("[detect.live]\nthreshold = 'high'\n", "[detect] key 'live.threshold' = 'high'"),
    ("[detect.peers]\nmin_windows = 0\n", "[detect] key 'peers.min_windows' = 0"),
    ("[agent]\ninterval = 0.2\n", "[agent] unknown key 'interval' (known: "),
    ("[agent]\ninterval_s = 600\n", "[agent] key 'interval_s' = 600"),
    ("[slurm]\nepilog_budget = 2\n", "[slurm] unknown key 'epilog_budget' (known: "),
    ("[slurm]\ndefault_mode = 'loud'\n", "[slurm] key 'default_mode' = 'loud'"),
    ("[otle]\nendpoint = 'http://x'\n", "unknown table [otle]"),
    ("[otel]\nendpont = 'http://x:4318'\n", "[otel] unknown key 'endpont' (known: "),
    ("[otel]\nbudget_s = 0\n", "[otel] key 'budget_s' = 0: Input should be greater than 0"),
    ("[fleet]\ntls_kye = '/k.pem'\n", "[fleet] unknown key 'tls_kye' (known: tls_ca_file, "),
    ("[fleet]\ntls_cert = 5\n", "[fleet] key 'tls_cert' = 5: Input should be a valid string"),
    ("[prometheus]\nlisten = 9464\n", "[prometheus] key 'listen' = 9464"),
    ("[prometheus]\nplain_text = true\n", "[prometheus] unknown key 'plain_text' (known: "),
])
def test_a_typo_is_an_error_naming_file_table_key_and_value(tmp_path, text, needle):
    path = _write(tmp_path, text)
    r = _reveal(["config", "show"], {"REVEAL_CONFIG": path})
    assert r.returncode == 2, r
    assert path in r.stderr and needle in r.stderr, r.stderr


def test_a_typo_in_fleet_stops_the_fleet_pass_before_anything_starts(tmp_path):
    from reveal_plugins.fleet.dask_runtime import FleetRuntimeError, cluster_security
    path = _write(tmp_path, "[fleet]\ntls_ca_fle = '/etc/reveal/ca.pem'\n")
    with pytest.raises(FleetRuntimeError, match=r"\[fleet\] unknown key 'tls_ca_fle'"):
        cluster_security(scheduler="tls://10.0.0.1:8786", config_file=path)


def test_a_typo_in_detect_stops_reveal_analyze(tmp_path, synth_run):
    run = synth_run(duration_s=40)
    path = _write(tmp_path, "[detect]\nwindow = 4\n")
    r = _reveal(["analyze", run, "--no-publish"], {"REVEAL_CONFIG": path})
    assert r.returncode == 2 and "[detect] unknown key 'window'" in r.stderr, r.stderr


def test_detect_settings_reach_the_analysis_and_the_command_line_wins(tmp_path, synth_run):
    run = synth_run(duration_s=60)
    path = _write(tmp_path, "[detect]\nthreshold = 6.5\nwindow_s = 4.0\n")
    r = _reveal(["analyze", run, "--no-publish", "-f", "json"], {"REVEAL_CONFIG": path})
    assert r.returncode == 0, r.stderr
    an = json.loads(r.stdout)["analysis"]
    assert (an["threshold"], an["window_s"]) == (6.5, 4.0)
    r = _reveal(["analyze", run, "--no-publish", "-f", "json", "--window", "2"],
                {"REVEAL_CONFIG": path})
    an = json.loads(r.stdout)["analysis"]
    assert (an["threshold"], an["window_s"]) == (6.5, 2.0)


def test_live_and_peer_settings_reach_their_parts(tmp_path, monkeypatch):
    from reveal_plugins.detect.peers import job
    from reveal_plugins.hooks import hook
    from reveal_plugins.types import ChannelMeta
    monkeypatch.setenv("REVEAL_CONFIG", _write(
        tmp_path, "[detect.live]\nthreshold = 8.5\n[detect.peers]\nmin_windows = 7\n"))
    live = hook().reveal_live_analyzer(
        channels=[ChannelMeta("cpu.all.user", "ticks", "counter", "x")], interval_s=0.1,
        config={})
    assert live.cfg["threshold"] == 8.5
    seen = {}
    monkeypatch.setattr(job, "peer_section",
                        lambda dirs, reps, config: seen.setdefault("cfg", config) and {
                            "nodes": [], "notes": [], "summary": ""})
    job.job_report([({}, "/a"), ({}, "/b")], "1")
    assert seen["cfg"].min_windows == 7


def test_agent_settings_reach_the_agent_and_an_option_wins(tmp_path):
    path = _write(tmp_path, "[agent]\ninterval_s = 0.25\nretention_days = 3.0\n")
    for args, want in (([], "every 0.250 s"), (["--interval", "0.5"], "every 0.500 s")):
        spool = tmp_path / f"spool{len(args)}"
        p = subprocess.Popen([sys.executable, "-m", "reveal_plugins.cli", "agent", "--spool",
                              str(spool), "--exit-when-idle", "--idle-grace", "1", *args],
                             env={**{k: v for k, v in os.environ.items()
                                     if not k.startswith("REVEAL_")}, "REVEAL_CONFIG": path},
                             stderr=subprocess.PIPE, text=True)
        try:
            err = p.communicate(timeout=60)[1]
        finally:
            p.kill()
        assert want in err, err


def test_slurm_table_of_reveal_toml_and_the_deprecated_file(tmp_path, monkeypatch):
    legacy = _write(tmp_path, "epilog_budget_s = 3.0\n", "slurm.toml")
    monkeypatch.setattr(slurm_config, "LEGACY_CONFIG", legacy)
    monkeypatch.delenv("REVEAL_SLURM_CONFIG", raising=False)
    monkeypatch.setenv("REVEAL_CONFIG", _write(tmp_path, "[otel]\n"))
    cfg = slurm_config.load_config()      # no [slurm] table: the older file, with a note
    assert cfg.epilog_budget_s == 3.0 and cfg.path == legacy
    assert "deprecated" in cfg.deprecation
    site = _write(tmp_path, "[slurm]\nepilog_budget_s = 2.0\n", "site.toml")
    monkeypatch.setenv("REVEAL_CONFIG", site)
    cfg = slurm_config.load_config()      # the [slurm] table wins; the older file is ignored
    assert cfg.epilog_budget_s == 2.0 and cfg.path == site
    assert "ignored" in cfg.deprecation
    from reveal_plugins.slurm.check import check_hook_config
    assert check_hook_config()[0].state == "warn"


def test_config_show_names_the_source_of_each_setting(tmp_path):
    path = _write(tmp_path, "[agent]\ninterval_s = 0.2\n[detect.live.peers]\nmax_peers = 4\n"
                            "[otel]\nendpoint = 'http://user:secret@127.0.0.1:4318'\n")
    r = _reveal(["config", "show", "-f", "json"], {"REVEAL_CONFIG": path, "REVEAL_LIVE": "1"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {(t, x["key"]): x for t, xs in doc["tables"].items() for x in xs}
    assert doc["file"] == path
    assert rows[("agent", "interval_s")] == {"key": "interval_s", "value": 0.2, "source": path}
    assert rows[("agent", "live")]["source"] == "environment REVEAL_LIVE"
    assert rows[("agent", "segment_s")]["source"] == "default"
    assert rows[("detect", "live.peers.max_peers")]["value"] == 4
    assert rows[("otel", "endpoint")]["source"] == path
    assert "secret" not in r.stdout


def test_validate_reports_every_problem_with_where():
    from reveal_plugins.agent.settings import AgentConfig
    with pytest.raises(site_config.SiteConfigError) as e:
        site_config.validate(AgentConfig, {"interval_s": "x", "bogus": 1}, "f.toml: [agent]")
    msg = str(e.value)
    assert "f.toml: [agent] key 'interval_s' = 'x'" in msg and "unknown key 'bogus'" in msg
