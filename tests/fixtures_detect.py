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
    """Validate a report dict against the repository's schema and, where the workspace has it,
    the shared contract it extends (../shared/report.schema.json); raises on error."""
    import jsonschema
    from conftest import SHARED_SCHEMA_PATH

    schemas = [_schema()]
    if SHARED_SCHEMA_PATH.exists():
        schemas.append(json.loads(SHARED_SCHEMA_PATH.read_text()))

    def check(rep):
        for schema in schemas:
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
