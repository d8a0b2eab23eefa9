"""The agent protocol's constants and framing, shared by the agent and its one client.

Specification: docs/protocol.md.  Standard library only: the Slurm hooks import this on a
0.5 s budget, so nothing heavy (no numpy) may come in through here.
"""
from __future__ import annotations

import json
from typing import Any

VERSION = 1
#: Longest request line the agent reads; a longer one is refused and the connection closed
#: without reading the rest (it is never buffered whole).
MAX_REQUEST = 256 * 1024
#: Longest reply line a client reads (``status`` of a busy node stays far below).
MAX_REPLY = 4 * 1024 * 1024
#: A request line must be complete this many seconds after its first byte (slow-drip bound).
REQUEST_DEADLINE_S = 5.0
#: A connection with no request in progress is closed after this many idle seconds.
IDLE_TIMEOUT_S = 10.0

OPS = ("ping", "status", "register", "event", "unregister", "shutdown")


def register_request(run: dict[str, Any]) -> dict[str, Any]:
    """``register``: ``run`` is a RunInfo as a dict (docs/protocol.md)."""
    return {"op": "register", "run": run}


def event_request(run_id: str, event: str, t: float | None = None, **fields: Any
                  ) -> dict[str, Any]:
    """``event``: a step marker, an iteration, an elastic event... of a registered run."""
    req: dict[str, Any] = {"op": "event", "run_id": run_id, "event": event}
    if t is not None:
        req["t"] = t
    req.update(fields)
    return req


def unregister_request(run_id: str, exit_code: int | None = None) -> dict[str, Any]:
    """``unregister``: the run ended (``exit_code`` None when unknown)."""
    return {"op": "unregister", "run_id": run_id, "exit_code": exit_code}


class ProtocolError(ValueError):
    """A line that is not a valid request or reply (the message says why)."""


def encode(obj: dict[str, Any]) -> bytes:
    """One message: a JSON object on one line.  ``default=str`` keeps odd field values
    (paths, numpy scalars) from failing a request."""
    return (json.dumps(obj, default=str, separators=(",", ":")) + "\n").encode()


def _finite(text: str) -> float:
    v = float(text)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} out of range")
    return v


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")


def decode(line: bytes, what: str = "request") -> dict[str, Any]:
    """One message.  Raises only :class:`ProtocolError`: on anything not JSON (also nesting too
    deep for the parser, integers too long to convert); a request also on NaN/Infinity or a
    number that only fits as infinity (what the agent accepts is standard JSON, and so are the
    meta.json and events.jsonl it writes from it)."""
    try:
        obj = (json.loads(line, parse_float=_finite, parse_constant=_no_constant)
               if what == "request" else json.loads(line))
    except RecursionError:
        raise ProtocolError(f"{what} is not JSON: nested too deeply") from None
    except ValueError as e:
        raise ProtocolError(f"{what} is not JSON: {str(e)[:200]}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} must be a JSON object, not {type(obj).__name__}")
    v = obj.get("v", VERSION)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ProtocolError(f"{what} field v={v!r}: must be a protocol version >= 1")
    if v > VERSION:
        raise ProtocolError(f"{what} field v={v}: this side speaks protocol version {VERSION}")
    return obj
