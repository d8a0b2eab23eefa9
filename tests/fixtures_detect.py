"""Fixtures for the detection tests: synthetic run directories written through the real store."""
import json
import os

import pytest


def _schema():
    from conftest import SCHEMA_PATH
    with open(SCHEMA_PATH) as f:
        return json.load(f)


@pytest.fixture
def report_schema_validate():
    """Validate a report dict against the shared report schema (raises on error)."""
    import jsonschema

    schema = _schema()

    def check(rep):
        jsonschema.validate(rep, schema)
        json.dumps(rep)  # plain JSON, no numpy types
        return rep
    return check


@pytest.fixture
def synth_run(tmp_path):
    """``synth_run(name, duration_s, anomalies=[(kind, start, end)], **kw) -> run_dir``."""
    from reveal_plugins.detect.synth import SynthHost

    def make(name="run", duration_s=120.0, anomalies=None, seed=0, interval_s=0.1,
             meta_extra=None, **kw):
        h = SynthHost(2, seed=seed, anomalies=anomalies or [], **kw)
        d = os.path.join(str(tmp_path), name)
        h.write_run(d, duration_s, interval_s, meta_extra=meta_extra)
        return d
    return make
