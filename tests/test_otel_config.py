"""Where export goes: standard OTEL_EXPORTER_OTLP_* variables, the [otel] section of the
config file, precedence, 'off unless configured', and errors that name the culprit."""
import pytest

from reveal_plugins.otel.config import OtelConfigError, load_config


def _file(tmp_path, text):
    p = tmp_path / "reveal.toml"
    p.write_text(text)
    return str(p)


def test_off_when_nothing_is_configured(tmp_path):
    cfg = load_config(environ={}, config_file=_file(tmp_path, ""))
    assert not cfg.enabled


def test_standard_env_vars(tmp_path):
    cfg = load_config(environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc,x-tenant=t1",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "5000",
        "OTEL_SERVICE_NAME": "gpu-fleet",
    }, config_file=_file(tmp_path, ""))
    assert cfg.enabled and cfg.protocol == "http/protobuf"
    assert cfg.signal_endpoint("traces") == "http://collector:4318/v1/traces"
    assert cfg.signal_endpoint("metrics") == "http://collector:4318/v1/metrics"
    assert cfg.headers == {"authorization": "Bearer abc", "x-tenant": "t1"}
    assert cfg.timeout_s == 5.0          # milliseconds, as the OTel specification says
    assert cfg.service_name == "gpu-fleet"
    assert cfg.source == "OTEL_EXPORTER_OTLP_ENDPOINT"


def test_grpc_and_signal_specific_vars_win(tmp_path):
    cfg = load_config(environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "7",
    }, config_file=_file(tmp_path, ""))
    assert cfg.protocol == "grpc"
    assert cfg.signal_endpoint("traces") == "https://b:4317"     # used as is
    assert not cfg.grpc_insecure()                               # https -> TLS
    assert cfg.timeout_s == 7.0          # small values: seconds (older Python SDK habit)


def test_config_file_section(tmp_path):
    path = _file(tmp_path, """
[otel]
endpoint = "http://collector.site:4317"
protocol = "grpc"
headers = { "x-api-key" = "k" }
budget_s = 0.5
metrics = true
metrics_interval_s = 15
resource_attributes = { "deployment.environment" = "prod" }
""")
    cfg = load_config(environ={}, config_file=path)
    assert cfg.enabled and cfg.protocol == "grpc" and cfg.budget_s == 0.5
    assert cfg.signal_endpoint("traces") == "http://collector.site:4317"
    assert cfg.headers == {"x-api-key": "k"} and cfg.metrics and cfg.metrics_interval_s == 15
    assert cfg.resource_attributes == {"deployment.environment": "prod"}
    assert cfg.source == path


def test_reveal_config_env_points_at_the_file(tmp_path):
    path = _file(tmp_path, '[otel]\nendpoint = "http://c:4318"\n')
    assert load_config(environ={"REVEAL_CONFIG": path}).enabled
    with pytest.raises(OtelConfigError, match="REVEAL_CONFIG=.*no such file"):
        load_config(environ={"REVEAL_CONFIG": str(tmp_path / "missing.toml")})


def test_env_overrides_file_and_overrides_win(tmp_path):
    path = _file(tmp_path, '[otel]\nendpoint = "http://file:4318"\n')
    cfg = load_config(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"},
                      config_file=path)
    assert cfg.endpoint == "http://env:4318"
    cfg = load_config(overrides={"endpoint": "http://cli:4318"},
                      environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"},
                      config_file=path)
    assert cfg.endpoint == "http://cli:4318" and cfg.source == "command line"


def test_explicitly_disabled(tmp_path):
    path = _file(tmp_path, '[otel]\nenabled = false\n')
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"}
    assert not load_config(environ=env, config_file=path).enabled
    assert not load_config(environ=dict(env, OTEL_SDK_DISABLED="true"),
                           config_file=_file(tmp_path, "")).enabled


@pytest.mark.parametrize("text, needle", [
    ('[otel]\nprotocol = "http/json"\n', "protocol = 'http/json'"),
    ('[otel]\nendpoint = "collector:4318"\n', "endpoint = 'collector:4318'"),
    ('[otel]\nbudget_s = -1\n', "[otel] key 'budget_s' = -1: Input should be greater than 0"),
    ('[otel]\nendpont = "http://x:1"\n', "[otel] unknown key 'endpont' (known: budget_s,"),
    ('[otel]\nmax_evidence = "many"\n', "[otel] key 'max_evidence' = 'many': Input should"),
    ('[otel]\nendpoint = 4318\n', "[otel] key 'endpoint' = 4318: Input should be a valid"),
    ('[otel\n', "not valid TOML"),
])
def test_bad_file_values_name_file_key_and_value(tmp_path, text, needle):
    path = _file(tmp_path, text)
    with pytest.raises(OtelConfigError) as e:
        load_config(environ={}, config_file=path)
    assert path in str(e.value) and needle in str(e.value)


def test_the_file_model_and_the_effective_settings_agree():
    """[otel] is typed by OtelTable and applied to OtelConfig: one key set, one default each
    (docs/config.md and ``reveal config show`` list the table from the model)."""
    import dataclasses

    from reveal_plugins.otel.config import OtelConfig, OtelTable
    cfg = OtelConfig()
    assert {f.name for f in dataclasses.fields(cfg)} - {"source"} == set(OtelTable.model_fields)
    for name, f in OtelTable.model_fields.items():
        assert f.get_default(call_default_factory=True) == getattr(cfg, name), name


def test_bad_env_value_names_the_variable(tmp_path):
    with pytest.raises(OtelConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL.*'thrift'"):
        load_config(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                             "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"},
                    config_file=_file(tmp_path, ""))
    with pytest.raises(OtelConfigError, match="OTEL_EXPORTER_OTLP_HEADERS.*not key=value"):
        load_config(environ={"OTEL_EXPORTER_OTLP_HEADERS": "novalue"},
                    config_file=_file(tmp_path, ""))


def test_port_4317_without_a_protocol_means_grpc(tmp_path):
    empty = _file(tmp_path, "")
    assert load_config(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
                       config_file=empty).protocol == "grpc"
    assert load_config(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
                                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
                       config_file=empty).protocol == "http/protobuf"
    assert load_config(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
                       config_file=empty).protocol == "http/protobuf"
