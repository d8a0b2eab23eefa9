"""OTel credentials (URL user info, sensitive query parameters and headers) are sent to the
backend but never logged, printed or saved in the user-readable otel.json; number options
reject inf/nan (issue 13)."""
import json
import logging
import os

import pytest

from fixtures_otlp import OtlpHttpReceiver, make_otel_meta, make_otel_report
from reveal_plugins.otel import sink
from reveal_plugins.otel.config import OtelConfigError, load_config, redact_url

SECRETS = ("hunter2pw", "sekrettoken99", "apikey777", "qsecret55", "mysecretval")
HEADERS = ("authorization=Bearer%20sekrettoken99,x-api-key=apikey777,"
           "x-auth-secret=mysecretval,x-tenant=lab")


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "report.json").write_text(json.dumps(make_otel_report()))
    (d / "meta.json").write_text(json.dumps(make_otel_meta()))
    return str(d)


def _leaks(text):
    return [s for s in SECRETS if s in text]


@pytest.mark.parametrize("backend", ["refusing", "down"])
def test_credentials_never_logged_nor_saved(otel_clean_env, run_dir, caplog, capsys, backend,
                                            otlp_dead_port):
    rx = OtlpHttpReceiver(status=401) if backend == "refusing" else None
    base = rx.endpoint if rx else otlp_dead_port
    # The receiver answers 401 on its exact path; the dead port gets a secret query too.
    url = base.replace("http://", "http://alice:hunter2pw@") + (
        "/v1/traces" if rx else "/v1/traces?api_key=qsecret55")
    try:
        otel_clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
        otel_clean_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", HEADERS)
        caplog.set_level(logging.DEBUG)
        sink.reveal_report_ready(json.load(open(os.path.join(run_dir, "report.json"))),
                                 run_dir, {}, 600)
        status = open(os.path.join(run_dir, "otel.json")).read()
        st = json.loads(status)
        assert not st["ok"] and st["error"]
        assert "127.0.0.1" in st["endpoint"] and "***@" in st["endpoint"]
        assert rx or "api_key=***" in st["endpoint"]
        assert _leaks(status) == [], status
        logs = "\n".join(r.getMessage() for r in caplog.records)
        assert "***@127.0.0.1" in logs, logs              # the failure is still logged
        assert _leaks(logs) == [], logs
        if rx:
            assert rx.refused >= 1 and "401" in st["error"]
        from reveal_plugins.cli import main
        assert main(["otel", "config"]) == 0
        out = capsys.readouterr()
        assert _leaks(out.out + out.err) == [], out.out
        assert main(["otel", "export", run_dir]) == 1
        out = capsys.readouterr()
        assert "failed" in out.err and _leaks(out.out + out.err) == [], out.err
    finally:
        if rx:
            rx.close()


def test_config_errors_never_echo_credentials():
    cases = [{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://u:hunter2pw@collector:99999"},
             {"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://u:hunter2pw@collector"},
             {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
              "OTEL_EXPORTER_OTLP_HEADERS": "authorization: Bearer sekrettoken99"},
             {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
              "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=apikey777,=mysecretval"}]
    for env in cases:
        with pytest.raises(OtelConfigError) as e:
            load_config(environ=env, config_file="")
        assert _leaks(str(e.value)) == [], str(e.value)
        assert "OTEL_EXPORTER_OTLP_" in str(e.value)


def test_redact_url():
    assert redact_url("https://u:p@h:1/v1?token=t&x=1&API-KEY=k") == \
        "https://***@h:1/v1?token=***&x=***&API-KEY=***"
    assert redact_url("https://tok@h") == "https://***@h"
    assert redact_url("http://h:4318") == "http://h:4318"


@pytest.mark.parametrize("key", ["budget_s", "timeout_s", "metrics_interval_s", "max_evidence",
                                 "max_anomalies"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
def test_number_options_reject_inf_and_nan(tmp_path, key, value):
    f = tmp_path / "r.toml"
    f.write_text(f'[otel]\nendpoint = "http://c:4318"\n{key} = "{value}"\n')
    with pytest.raises(OtelConfigError) as e:
        load_config(environ={}, config_file=str(f))
    msg = str(e.value)
    integer = key.startswith("max_")       # a count: "not a valid integer" says it
    assert key in msg and value in msg and ("valid integer" if integer else "finite") in msg, msg


@pytest.mark.parametrize("var", ["REVEAL_OTEL_BUDGET_S", "OTEL_EXPORTER_OTLP_TIMEOUT"])
def test_env_numbers_reject_inf(var):
    with pytest.raises(OtelConfigError, match=f"{var}.*'inf'.*finite"):
        load_config(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", var: "inf"},
                    config_file="")
