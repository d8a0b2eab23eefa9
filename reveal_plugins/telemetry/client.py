"""Talking to the node agent: a small client, and ``ensure_agent`` that joins or starts one."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

from ..types import RunInfo


class AgentError(RuntimeError):
    """The agent could not be reached or refused a request (the message says which)."""


class AgentClient:
    def __init__(self, socket_path: str, timeout: float = 2.0):
        self.socket_path = socket_path
        self.timeout = timeout

    def request(self, req: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout if timeout is None else timeout)
        try:
            s.connect(self.socket_path)
            s.sendall((json.dumps(req, default=str) + "\n").encode())
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except OSError as e:
            raise AgentError(f"agent at {self.socket_path} unreachable: "
                             f"{e.strerror or type(e).__name__}") from None
        finally:
            s.close()
        try:
            reply = json.loads(buf)
        except ValueError:
            raise AgentError(f"agent at {self.socket_path} sent no valid reply") from None
        if not reply.get("ok"):
            raise AgentError(f"agent refused {req.get('op')}: {reply.get('error')}")
        return reply

    def ping(self, timeout: float | None = None) -> dict[str, Any]:
        return self.request({"op": "ping"}, timeout)

    def alive(self, timeout: float = 0.5) -> bool:
        try:
            self.ping(timeout)
            return True
        except AgentError:
            return False

    def register(self, run: RunInfo) -> str:
        return self.request({"op": "register", "run": run.to_dict()})["run_dir"]

    def event(self, run_id: str, event: str, t: float | None = None, **fields: Any) -> None:
        self.request({"op": "event", "run_id": run_id, "event": event,
                      "t": time.time() if t is None else t, **fields})

    def unregister(self, run_id: str, exit_code: int | None = None,
                   timeout: float | None = None) -> str:
        """Close a run; returns its directory.  ``last_reply["write_error"]`` tells whether the
        agent failed to write part of the telemetry (disk full ...)."""
        self.last_reply = self.request({"op": "unregister", "run_id": run_id,
                                        "exit_code": exit_code}, timeout)
        return self.last_reply["run_dir"]

    def status(self) -> dict[str, Any]:
        return self.request({"op": "status"})

    def shutdown(self) -> None:
        self.request({"op": "shutdown"})


def queue_request(spool: str, req: dict[str, Any]) -> str:
    """Leave a request for an agent that is not listening yet (it takes ``pending/`` files)."""
    pend = os.path.join(spool, "pending")
    os.makedirs(pend, mode=0o700, exist_ok=True)
    name = f"{time.time():.6f}-{uuid.uuid4().hex[:8]}.json"
    tmp = os.path.join(pend, "." + name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(req, f, default=str)
    os.rename(tmp, os.path.join(pend, name))
    return os.path.join(pend, name)


def start_agent(spool: str, interval_s: float = 0.1, exit_when_idle: bool = False,
                idle_grace_s: float = 30.0, live: bool = False,
                log_path: str | None = None, segment_s: float | None = None) -> subprocess.Popen:
    """Start a detached agent process (own session: it outlives the caller, ignores its ^C)."""
    os.makedirs(spool, mode=0o755 if os.geteuid() == 0 else 0o700, exist_ok=True)
    cmd = [sys.executable, "-m", "reveal_plugins.telemetry.agent", "--spool", spool,
           "--interval", repr(float(interval_s)), "--idle-grace", repr(float(idle_grace_s))]
    if exit_when_idle:
        cmd.append("--exit-when-idle")
    if live:
        cmd.append("--live")
    if segment_s is not None:
        cmd += ["--segment", repr(float(segment_s))]
    log_path = log_path or os.path.join(spool, "agent.log")
    try:
        logf = open(log_path, "ab")
    except OSError:
        logf = subprocess.DEVNULL
    try:
        # An explicit snapshot of the environment: callers (reveal-torchrun) set variables
        # for their workers in another thread while this starts, and exec'ing with the live
        # C environ while it is being rewritten fails with EFAULT.
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True, close_fds=True, env=dict(os.environ))
    finally:
        if logf is not subprocess.DEVNULL:
            logf.close()


def ensure_agent(spool: str, interval_s: float = 0.1, wait_s: float = 5.0,
                 exit_when_idle: bool = False, idle_grace_s: float = 30.0,
                 live: bool = False, segment_s: float | None = None) -> AgentClient:
    """Return a client for the agent of ``spool``, starting one if none answers.

    With ``wait_s=0`` it does not wait for a new agent to come up (callers under a tight time
    budget queue their registration with :func:`queue_request` instead).
    """
    client = AgentClient(os.path.join(spool, "agent.sock"))
    if client.alive():
        return client
    proc = start_agent(spool, interval_s, exit_when_idle, idle_grace_s, live,
                       segment_s=segment_s)
    client.proc = proc  # type: ignore[attr-defined]
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AgentError(f"agent exited with code {proc.returncode} at start; see "
                             f"{os.path.join(spool, 'agent.log')}")
        if client.alive(0.2):
            return client
        time.sleep(0.05)
    if wait_s > 0:
        raise AgentError(f"agent did not answer within {wait_s:.1f} s at {client.socket_path}")
    return client
