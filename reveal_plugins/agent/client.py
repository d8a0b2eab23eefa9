"""Talking to the node agent: a small client, and ``ensure_agent`` that joins or starts one."""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from typing import Any

from . import pending, protocol


class AgentError(RuntimeError):
    """The agent could not be reached or refused a request (the message says which)."""


class AgentUnreachable(AgentError):
    """Nobody accepts connections on the agent socket (no agent, or a dead one's socket)."""


class AgentBusy(AgentError):
    """An agent is there but did not take or answer the request in time (full backlog, slow
    reply); unlike :class:`AgentUnreachable`, starting another agent would be wrong.

    ``sent`` tells the two apart: False when nothing reached the agent (its backlog was full
    at connect, or the request could not be written whole) -- the caller must queue the
    request (:func:`queue_request`) or it is lost; True when the whole request was written
    and only the reply is missing -- the agent acts on it, queueing it again would repeat it."""

    def __init__(self, msg: str, sent: bool = True):
        super().__init__(msg)
        self.sent = sent


# A connect() that fails with these means an agent exists but cannot take us right now.
_BUSY_ERRNOS = {errno.EAGAIN, errno.EWOULDBLOCK, errno.ETIMEDOUT}


class AgentClient:
    """The one client of the agent protocol (docs/protocol.md): ``reveal record``, the Slurm
    hooks and ``reveal-torchrun`` all talk through it.  Standard library only."""

    def __init__(self, socket_path: str, timeout: float = 2.0):
        self.socket_path = socket_path
        self.timeout = timeout

    def _connect(self, timeout: float) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(max(0.01, timeout))
        try:
            s.connect(self.socket_path)
        except OSError as e:
            s.close()
            why = e.strerror or type(e).__name__
            if isinstance(e, socket.timeout) or e.errno in _BUSY_ERRNOS:
                raise AgentBusy(f"agent socket {self.socket_path} busy at connect ({why}): "
                                "nothing was sent", sent=False) from None
            raise AgentUnreachable(f"agent socket {self.socket_path} unreachable: "
                                   f"{why}") from None
        return s

    def batch(self, reqs: list[dict[str, Any]], timeout: float | None = None
              ) -> list[dict[str, Any]]:
        """Send requests on one connection; return the replies in order (bounded reads: a
        reply line over ``protocol.MAX_REPLY`` or a silent agent raise :class:`AgentBusy`)."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        s = self._connect(timeout)
        replies: list[dict[str, Any]] = []
        sent = False     # the whole request written (the agent acts on it, reply or not)
        try:
            s.sendall(b"".join(protocol.encode({"v": protocol.VERSION, **r}) for r in reqs))
            sent = True
            buf = b""
            while len(replies) < len(reqs):
                nl = buf.find(b"\n")
                if nl >= 0:
                    replies.append(protocol.decode(buf[:nl], "reply"))
                    buf = buf[nl + 1:]
                    continue
                if len(buf) > protocol.MAX_REPLY:
                    raise AgentBusy(f"agent socket {self.socket_path}: reply longer than "
                                    f"{protocol.MAX_REPLY} bytes")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout()
                s.settimeout(left)
                chunk = s.recv(65536)
                if not chunk:   # closed unanswered: it did not take (all of) the request
                    raise AgentBusy(f"agent socket {self.socket_path} closed the connection after "
                                    f"{len(replies)} of {len(reqs)} replies",
                                    sent=bool(replies))
                buf += chunk
        except socket.timeout:
            if not sent:
                raise AgentBusy(f"agent socket {self.socket_path}: the request could not be "
                                f"written within {timeout:.2f} s (nothing was sent)",
                                sent=False) from None
            raise AgentBusy(f"agent socket {self.socket_path}: no reply within {timeout:.2f} s "
                            "(the request was sent)") from None
        except protocol.ProtocolError as e:
            raise AgentBusy(f"agent socket {self.socket_path} sent an invalid reply: {e}") from None
        except OSError as e:
            # reset before any reply: the agent dropped the connection, it did not take it
            taken = sent and (bool(replies) or e.errno not in (errno.ECONNRESET, errno.EPIPE))
            raise AgentBusy(f"agent socket {self.socket_path}: "
                            f"{e.strerror or type(e).__name__}"
                            + ("" if taken else " (not taken by the agent)"), sent=taken) from None
        finally:
            s.close()
        return replies

    def request(self, req: dict[str, Any], timeout: float | None = None,
                check: bool = True) -> dict[str, Any]:
        reply = self.batch([req], timeout)[0]
        if check and not reply.get("ok"):
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

    def register(self, run: Any, watch: bool = False) -> str:
        """Register a run (a ``RunInfo`` or its dict).  ``watch=True``: the agent closes the run
        by itself when this process dies (it holds a pidfd of the peer)."""
        d = run.to_dict() if hasattr(run, "to_dict") else dict(run)
        if d.get("run_dir"):   # relative to this process, not to the agent (it runs in /)
            d["run_dir"] = os.path.abspath(d["run_dir"])
        req = protocol.register_request(d)
        if watch:
            req["watch"] = True
        return self.request(req)["run_dir"]

    def event(self, run_id: str, event: str, t: float | None = None, **fields: Any) -> None:
        self.request(protocol.event_request(run_id, event, time.time() if t is None else t,
                                            **fields))

    def unregister(self, run_id: str, exit_code: int | None = None,
                   timeout: float | None = None) -> str:
        """Close a run; returns its directory.  ``last_reply["write_error"]`` tells whether the
        agent failed to write part of the telemetry (disk full ...)."""
        self.last_reply = self.request(protocol.unregister_request(run_id, exit_code), timeout)
        return self.last_reply["run_dir"]

    def status(self) -> dict[str, Any]:
        return self.request({"op": "status"})

    def shutdown(self) -> None:
        self.request({"op": "shutdown"})


#: The queue's writer lives with its readers (:mod:`.pending`); the name callers know.
queue_request = pending.write


def start_agent(spool: str, interval_s: float = 0.1, exit_when_idle: bool = False,
                idle_grace_s: float = 30.0, live: bool = False,
                log_path: str | None = None, segment_s: float | None = None) -> subprocess.Popen:
    """Start a detached agent process (own session: it outlives the caller, ignores its ^C).

    It runs in ``/`` with ``-P``: ``-m`` would put the caller's working directory first on
    ``sys.path``, and ``sudo reveal record`` in a user's directory would import their
    ``numpy.py`` as root.  Not ``-I``: that drops ``PYTHONPATH`` too, which a package run
    from a source tree needs (the caller already runs with that environment)."""
    spool = os.path.abspath(spool)
    os.makedirs(spool, mode=0o755 if os.geteuid() == 0 else 0o700, exist_ok=True)
    cmd = [sys.executable, "-P", "-m", "reveal_plugins.agent.daemon", "--spool", spool,
           "--interval", repr(float(interval_s)), "--idle-grace", repr(float(idle_grace_s))]
    if exit_when_idle:
        cmd.append("--exit-when-idle")
    if live:
        cmd.append("--live")
    if segment_s is not None:
        cmd += ["--segment", repr(float(segment_s))]
    log_path = os.path.abspath(log_path or os.path.join(spool, "agent.log"))
    cmd += ["--log-file", log_path]  # rotated by the agent; stderr keeps only crashes
    try:
        logf = open(log_path, "ab")
    except OSError:
        logf = subprocess.DEVNULL
    try:
        # An explicit snapshot of the environment: callers (reveal-torchrun) set variables
        # for their workers in another thread while this starts, and exec'ing with the live
        # C environ while it is being rewritten fails with EFAULT.
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True, close_fds=True, cwd="/",
                                env=dict(os.environ))
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
