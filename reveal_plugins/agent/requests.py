"""The agent's request handler: one decoded request and the peer's credentials in, one reply
out (docs/protocol.md).  Who may do what is decided here, from ``SO_PEERCRED``, never from
what the client says."""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from .. import __version__
from ..types import RunInfo
from . import protocol


class RequestHandler:
    """Mixin of :class:`~reveal_plugins.agent.daemon.Agent`: the socket protocol."""

    def privileged(self, uid: int) -> bool:
        return uid in (0, self.uid)

    def handle(self, req: dict[str, Any], peer_uid: int, peer_pid: int = 0) -> dict[str, Any]:
        op = req.get("op")
        privileged = self.privileged(peer_uid)
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "interval_s": self.interval_s,
                    "uid": self.uid, "host": self.host, "version": __version__,
                    "protocol": protocol.VERSION}
        if op == "status":
            with self._lock:
                runs = [st.run.to_dict() for st in self._runs.values()
                        if privileged or st.run.uid == peer_uid]
            out = {"ok": True, "runs": runs, "probes": self.probe_table(),
                   "ticks": self.ticks, "missed_ticks": self.missed_ticks,
                   "sample_cpu_s": self.sample_cpu_s}
            if privileged and getattr(self, "_server", None) is not None:
                out["server"] = dict(self._server.stats, connections=len(self._server._conns))
            return out
        if op == "register":
            if not privileged:
                return {"ok": False, "error": f"uid {peer_uid} may not register runs with an "
                                              f"agent of uid {self.uid}"}
            run = RunInfo.from_dict(req.get("run") or {})
            owner = peer_pid if req.get("watch") is True and peer_pid > 0 else None
            return {"ok": True, "run_dir": self.register(run, owner_pid=owner)}
        if op in ("event", "unregister"):
            run_id = req.get("run_id")
            with self._lock:
                st = self._runs.get(run_id)
            if st is None:
                return {"ok": False, "error": f"run_id {str(run_id)[:80]!r} is not registered"}
            if not privileged and st.run.uid != peer_uid:
                return {"ok": False, "error": f"uid {peer_uid} may not act on run {run_id!r}"}
            if op == "unregister":
                if not privileged:
                    return {"ok": False, "error": "only root or the agent's user may unregister"}
                err = st.write_error
                run_dir = self.unregister(run_id, req.get("exit_code"))
                return {"ok": True, "run_dir": run_dir, "write_error": st.write_error or err}
            event = req.get("event")
            if not isinstance(event, str) or not event or len(event) > 64 or \
                    event in ("run_start", "run_end", "owner_gone"):
                return {"ok": False, "error": f"event {str(event)[:80]!r}: not a valid event name"}
            fields = {k: v for k, v in req.items() if k not in ("op", "run_id", "event", "t", "v")}
            t = req.get("t")
            if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool)):
                return {"ok": False, "error": f"t={str(t)[:40]!r}: must be a number (seconds)"}
            if not self.event(run_id, event, t, **fields):
                return {"ok": False, "error": f"run {run_id!r}: event dropped, over the run's "
                                              "limits (docs/protocol.md)"}
            return {"ok": True}
        if op == "shutdown":
            if not privileged:
                return {"ok": False, "error": "only root or the agent's user may shut it down"}
            # A non-daemon thread: the interpreter waits for it, so the runs are finished
            # (last segment, run_end, meta.json) even when the process is exiting.
            threading.Thread(target=self._stop_soon, name="reveal-shutdown").start()
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {str(op)[:40]!r}"}

    def _stop_soon(self) -> None:
        time.sleep(0.2)  # let the reply go out first
        self.stop()
