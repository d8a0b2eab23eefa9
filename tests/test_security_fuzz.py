"""Fuzz tests (Hypothesis) of what a user controls, issue 22: the agent's request lines
(protocol.decode, then the handler) and the run-directory readers the fleet pass and the Epilog
use on user-writable run directories (store.read_meta, read_events, load_run).

Each reader may fail only with its documented error (ProtocolError; StoreError; invalid event
lines skipped with a warning), never with another exception that would stop the agent's event
loop or a fleet pass.  Kept to a few seconds: small max_examples, no deadline.
"""
import json
import os
import shutil
import tempfile

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from reveal_plugins.agent import protocol
from reveal_plugins.store import store  # noqa: E402

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# JSON-ish values: what a hostile client or run can put in a JSON document, including the
# non-standard NaN/Infinity tokens Python's json reads, huge numbers and odd strings.
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40))
jsonish = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)),
    max_leaves=20)
KEYS = ["op", "v", "run_id", "event", "t", "step_id", "exit_code", "run", "watch", "pids",
        "note"]
request_dicts = st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)),
                                jsonish, max_size=8)
hostile_lines = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda n, c: (c * n).encode(), st.integers(1, 50_000), st.sampled_from("[{")),
    st.builds(lambda n: ("[" * n + "]" * n).encode(), st.integers(1, 50_000)),
    st.builds(lambda n: b'{"v":1,"t":' + b"9" * n + b"}", st.integers(1, 6000)),
    st.sampled_from([b'{"op":"event","t":NaN}', b'{"op":"event","t":Infinity}',
                     b'{"op":"event","t":-Infinity}', b'{"op":"ping","t":1e999}',
                     b'\xff\xfe{"op":"ping"}', b'{"v":true}', b'{"v":1.5}', b"null"]),
)


def _check_decoded(obj):
    assert isinstance(obj, dict)
    # What is accepted is standard JSON again (meta.json, events.jsonl are written from it).
    json.dumps(obj, allow_nan=False)


@FAST
@given(hostile_lines)
def test_decode_raises_only_protocol_error_on_arbitrary_bytes(line):
    try:
        obj = protocol.decode(line)
    except protocol.ProtocolError:
        return
    _check_decoded(obj)


@FAST
@given(request_dicts)
def test_decode_of_arbitrary_request_objects(req):
    line = json.dumps(req, allow_nan=True).encode()
    try:
        obj = protocol.decode(line)
    except protocol.ProtocolError:
        return
    _check_decoded(obj)


@pytest.fixture(scope="module")
def agent():
    from reveal_plugins.agent.daemon import Agent
    from reveal_plugins.types import RunInfo
    d = tempfile.mkdtemp(prefix="reveal-fuzz-")
    a = Agent(os.path.join(d, "spool"), interval_s=0.5)
    a.register(RunInfo(run_id="r", source="test", run_dir=os.path.join(d, "run")))
    yield a
    for run_id in list(a._runs):
        a.unregister(run_id, 0)
    shutil.rmtree(d, ignore_errors=True)


@FAST
@given(req=request_dicts, run_id=st.sampled_from(["r", "missing", None]),
       op=st.sampled_from(["ping", "status", "event", "unregister", "register", "nope", None]),
       uid=st.sampled_from([0, 65534]))
def test_handler_answers_any_decoded_request(agent, req, run_id, op, uid):
    """Whatever decodes reaches the handler: it answers with a reply, never raises (the
    server turns an exception into an error reply, but the handler should not need it).
    Unregister and register as a privileged peer are left out (they end or add runs)."""
    req = dict(req, op=op, run_id=run_id)
    if uid == 0 and op in ("unregister", "register"):
        return
    try:
        req = protocol.decode(json.dumps(req, allow_nan=True).encode())
    except protocol.ProtocolError:
        return
    reply = agent.handle(req, uid, 0)
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
    json.dumps(protocol.encode(reply).decode())
    # meta.json and the run's state stay standard JSON whatever was accepted
    st_ = agent._runs["r"]
    json.dumps(list(st_.steps.values()), allow_nan=False)


# --- run-directory readers ---------------------------------------------------------------

file_contents = st.one_of(
    st.binary(max_size=400),
    st.builds(lambda o: json.dumps(o, allow_nan=True).encode(), jsonish),
    st.builds(lambda d: json.dumps(dict(d, channels=d.get("channels", [])),
                                   allow_nan=True).encode(),
              st.dictionaries(st.sampled_from(["channels", "start", "end", "interval_s", "run",
                                               "steps", "host"]), jsonish, max_size=6)),
    st.builds(lambda n: b"[" * n, st.integers(1, 20_000)),
    st.builds(lambda n: b'{"channels":[],"start":' + b"7" * n + b"}", st.integers(1, 6000)),
)
event_lines = st.lists(st.one_of(
    st.binary(max_size=60),
    st.builds(lambda o: json.dumps(o, allow_nan=True).encode(), jsonish),
    st.builds(lambda t: json.dumps({"t": t, "event": "x"}).encode(),
              st.one_of(st.integers(-10**400, 10**400), st.floats(), st.text(max_size=5))),
    st.builds(lambda n: b'{"t":1' + b"0" * n + b"}", st.integers(300, 5000)),
), max_size=8)


@pytest.fixture(scope="module")
def run_dir():
    d = tempfile.mkdtemp(prefix="reveal-fuzz-run-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _write(d, name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


@FAST
@given(file_contents)
def test_read_meta_raises_only_store_error(run_dir, data):
    _write(run_dir, "meta.json", data)
    try:
        meta = store.read_meta(run_dir)
    except store.StoreError:
        return
    assert isinstance(meta, dict) and "channels" in meta


@FAST
@given(event_lines)
def test_read_events_skips_bad_lines(run_dir, lines):
    _write(run_dir, "events.jsonl", b"\n".join(lines))
    warnings = []
    try:
        events = store.read_events(run_dir, warnings)
    except store.StoreError:
        return
    for e in events:
        assert isinstance(e, dict)
        float(e["t"])


@FAST
@given(meta=file_contents, lines=event_lines)
def test_load_run_raises_only_store_error(run_dir, meta, lines):
    """What the Epilog and the fleet pass call on a run directory."""
    _write(run_dir, "meta.json", meta)
    _write(run_dir, "events.jsonl", b"\n".join(lines))
    try:
        store.load_run(run_dir)
    except store.StoreError:
        return
