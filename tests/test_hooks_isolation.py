"""Hooks are called through pluggy (``pm.hook``), so a site's hook wrappers and pluggy's
tracing see every call, while one plugin's exception never costs the other plugins."""
import logging
import types

import pytest

from reveal_plugins.analysis import analyze_and_publish
from reveal_plugins.detect.evidence.hinting import hints_for
from reveal_plugins.hooks import get_plugin_manager, hookimpl, reset_plugin_manager


@pytest.fixture()
def pm():
    reset_plugin_manager()
    pm = get_plugin_manager()
    yield pm
    reset_plugin_manager()


def _plugin(**hooks):
    mod = types.ModuleType("site_test_plugin")
    for name, fn in hooks.items():
        setattr(mod, name, hookimpl(**getattr(fn, "_opts", {}))(fn))
    return mod


HINT = {"title": "site rule", "action": "look", "severity": "warning"}


@pytest.mark.parametrize("broken_first", [True, False])
def test_a_failing_hint_rule_costs_no_other_rule(pm, caplog, broken_first):
    def broken(anomaly, context):
        raise RuntimeError("site bug")

    def good(anomaly, context):
        return [HINT]

    order = [("broken", broken), ("good", good)]
    for name, fn in (order if broken_first else order[::-1]):
        pm.register(_plugin(reveal_hints=fn), name=name)
    with caplog.at_level(logging.WARNING):
        hints = hints_for({"subsystem": "cpu", "evidence": []}, {})
    assert HINT in hints
    assert "plugin broken failed in reveal_hints: RuntimeError: site bug" in caplog.text


def test_a_site_hook_wrapper_sees_the_calls_made_by_the_pipeline(pm):
    seen = []

    def reveal_hints(anomaly, context):
        seen.append(("before", anomaly["subsystem"]))
        result = yield
        seen.append(("after", len(result)))
        return result + [[{"title": "added by wrapper", "action": "x", "severity": "info"}]]
    reveal_hints._opts = {"wrapper": True}

    pm.register(_plugin(reveal_hints=reveal_hints), name="tracer")
    hints = hints_for({"subsystem": "network", "evidence": []}, {})
    assert seen[0] == ("before", "network") and seen[1][0] == "after"
    assert any(h["title"] == "added by wrapper" for h in hints)


def test_pluggy_call_monitoring_sees_report_ready(pm, synth_run):
    calls = []
    pm.add_hookcall_monitoring(lambda name, impls, kw: calls.append(name),
                               lambda outcome, name, impls, kw: None)
    analyze_and_publish(synth_run(duration_s=60))
    assert "reveal_analyze" in calls and "reveal_report_ready" in calls


def test_an_analysis_plugin_error_reaches_the_caller_as_a_failed_report(pm, synth_run):
    def reveal_analyze(run_dir, config):
        raise RuntimeError("analyzer crashed")
    reveal_analyze._opts = {"tryfirst": True}

    pm.register(_plugin(reveal_analyze=reveal_analyze), name="crashy")
    rep = analyze_and_publish(synth_run(duration_s=60), publish=False)
    assert rep["status"] == "failed" and "analyzer crashed" in rep["status_reason"]
