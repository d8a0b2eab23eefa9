"""The agent's socket server: one selector thread, bounded in every dimension a local user
controls (docs/protocol.md).

A root agent accepts any local user, so nothing here may be held by a client: a request line
is read only up to ``protocol.MAX_REQUEST`` (never buffered whole), must complete within
``REQUEST_DEADLINE_S`` of its first byte (slow drip), idle connections are closed after
``IDLE_TIMEOUT_S``, and each uid holds at most ``per_uid`` connections (root and the agent's own
uid are exempt, so an attack by one user never locks out the hooks).  ``ping`` is answered on
the selector thread; other requests go to a small worker pool, a separate one for privileged
peers, so a flood of one user's events never queues in front of a registration.
"""
from __future__ import annotations

import logging
import os
import selectors
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from . import protocol

log = logging.getLogger("reveal.agent")

Handler = Callable[[dict[str, Any], int, int], dict[str, Any]]


class RateLimitedLog:
    """At most ``burst`` lines per ``per_s`` seconds for each kind of message, then one line
    saying how many were suppressed: a hostile client must not fill the disk with the log."""

    def __init__(self, burst: int = 5, per_s: float = 60.0):
        self.burst, self.per_s = burst, per_s
        self._seen: dict[str, list[float]] = {}
        self._dropped: dict[str, int] = {}

    def warning(self, kind: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        times = [t for t in self._seen.get(kind, []) if now - t < self.per_s]
        if len(times) >= self.burst:
            self._dropped[kind] = self._dropped.get(kind, 0) + 1
            self._seen[kind] = times
            return
        n = self._dropped.pop(kind, 0)
        times.append(now)
        self._seen[kind] = times
        log.warning(msg + (f" ({n} similar messages suppressed)" if n else ""), *args)


def peer_cred(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the peer, from SO_PEERCRED (the kernel's word, not the client's)."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return pid, uid


class _Conn:
    __slots__ = ("sock", "pid", "uid", "buf", "out", "busy", "first_byte", "last", "closing")

    def __init__(self, sock: socket.socket, pid: int, uid: int):
        self.sock, self.pid, self.uid = sock, pid, uid
        self.buf = bytearray()
        self.out = bytearray()
        self.busy = False                 # a request of this connection is being handled
        self.first_byte: float | None = None
        self.last = time.monotonic()
        self.closing = False              # close once the pending reply is written


class AgentServer:
    def __init__(self, sock_path: str, handle: Handler, privileged: Callable[[int], bool],
                 mode: int = 0o600, gid: int | None = None, max_conns: int = 1024,
                 per_uid: int = 64, workers: int = 4):
        self.sock_path = sock_path
        self.handle = handle
        self.privileged = privileged
        self.max_conns, self.per_uid = max_conns, per_uid
        self.rlog = RateLimitedLog()
        self.stats = {"accepted": 0, "refused": 0, "requests": 0, "closed_slow": 0,
                      "closed_idle": 0, "closed_oversized": 0}
        self._conns: dict[int, _Conn] = {}
        self._per_uid: dict[int, int] = {}
        self._sel = selectors.DefaultSelector()
        self._done: list[tuple[_Conn, dict[str, Any]]] = []
        self._done_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._pools = {True: ThreadPoolExecutor(workers, thread_name_prefix="reveal-req-root"),
                       False: ThreadPoolExecutor(workers, thread_name_prefix="reveal-req-user")}
        self._stop = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(sock_path)
        # Permissions before listen(): nobody may connect while the mode is still the umask's.
        if gid is not None:
            os.chown(sock_path, -1, gid)
        os.chmod(sock_path, mode)
        self.listener.listen(min(socket.SOMAXCONN, 4096))
        self.listener.setblocking(False)
        self._sel.register(self.listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    # -- the loop -------------------------------------------------------------------------
    def serve_forever(self) -> None:
        while not self._stop.is_set():
            for key, ev in self._sel.select(timeout=self._next_expiry()):
                try:
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        c = key.data
                        if ev & selectors.EVENT_READ:
                            self._read(c)
                        if ev & selectors.EVENT_WRITE and c.sock.fileno() >= 0:
                            self._write(c)
                except Exception as e:  # one bad connection never stops the server
                    self.rlog.warning("loop", "socket server: %s: %s", type(e).__name__, e)
                    if isinstance(key.data, _Conn):
                        self._close(key.data)
            self._finish_done()
            self._expire()
        for c in list(self._conns.values()):
            self._close(c)
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        self._sel.close()
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def shutdown(self) -> None:
        self._stop.set()
        self._wakeup()

    def _wakeup(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # already a byte waiting (buffer full) or closed: the loop wakes anyway

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    # -- connections ----------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(256):  # bounded: a connect storm cannot starve the other connections
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and friends: refuse for now, log rarely
                self.rlog.warning("accept", "socket server: accept failed: %s", e)
                return
            try:
                pid, uid = peer_cred(sock)
            except OSError:
                sock.close()
                continue
            priv = self.privileged(uid)
            if not priv and (len(self._conns) >= self.max_conns
                             or self._per_uid.get(uid, 0) >= self.per_uid):
                self.stats["refused"] += 1
                self.rlog.warning(f"cap{uid}", "socket server: uid %d holds %d connections "
                                  "(cap %d per uid, %d in all); refusing more", uid,
                                  self._per_uid.get(uid, 0), self.per_uid, self.max_conns)
                sock.close()
                continue
            sock.setblocking(False)
            c = _Conn(sock, pid, uid)
            self._conns[sock.fileno()] = c
            self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            self._sel.register(sock, selectors.EVENT_READ, c)
            self.stats["accepted"] += 1

    def _close(self, c: _Conn) -> None:
        fd = c.sock.fileno()
        if fd < 0 or self._conns.get(fd) is not c:
            return
        del self._conns[fd]
        self._per_uid[c.uid] -= 1
        if not self._per_uid[c.uid]:
            del self._per_uid[c.uid]
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    def _read(self, c: _Conn) -> None:
        try:
            chunk = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)
            return
        if not chunk:  # peer closed its side: answer what is in progress, then close
            if c.busy or c.out:
                c.closing = True
                self._watch(c, selectors.EVENT_WRITE if c.out else 0)
            else:
                self._close(c)
            return
        now = time.monotonic()
        c.last = now
        if not c.buf:
            c.first_byte = now
        c.buf += chunk
        if c.busy and len(c.buf) > 2 * protocol.MAX_REQUEST:
            self._close(c)  # pipelining faster than it is answered: nobody needs that
            return
        self._next_request(c)

    def _next_request(self, c: _Conn) -> None:
        if c.busy:
            return
        nl = c.buf.find(b"\n")
        if nl < 0:
            if len(c.buf) > protocol.MAX_REQUEST:
                self.stats["closed_oversized"] += 1
                self.rlog.warning("oversized", "socket server: uid %d sent a request line over "
                                  "%d bytes; closed", c.uid, protocol.MAX_REQUEST)
                self._reply(c, {"ok": False, "error": f"request line longer than "
                                                      f"{protocol.MAX_REQUEST} bytes"})
                c.buf.clear()
                c.closing = True
            return
        line = bytes(c.buf[:nl])
        del c.buf[:nl + 1]
        c.first_byte = time.monotonic() if c.buf else None
        if len(line) > protocol.MAX_REQUEST:
            self.stats["closed_oversized"] += 1
            self._reply(c, {"ok": False, "error": f"request line longer than "
                                                  f"{protocol.MAX_REQUEST} bytes"})
            c.closing = True
            return
        self.stats["requests"] += 1
        try:
            req = protocol.decode(line)
        except protocol.ProtocolError as e:
            self._reply(c, {"ok": False, "error": str(e)})
            return
        if req.get("op") == "ping":  # answered at once, whatever the pools are doing
            self._reply(c, self._call(req, c))
            return
        c.busy = True
        self._pools[self.privileged(c.uid)].submit(self._work, c, req)

    def _call(self, req: dict[str, Any], c: _Conn) -> dict[str, Any]:
        try:
            return self.handle(req, c.uid, c.pid)
        except Exception as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}

    def _work(self, c: _Conn, req: dict[str, Any]) -> None:
        reply = self._call(req, c)
        with self._done_lock:
            self._done.append((c, reply))
        self._wakeup()

    def _finish_done(self) -> None:
        with self._done_lock:
            done, self._done = self._done, []
        for c, reply in done:
            c.busy = False
            if self._conns.get(c.sock.fileno()) is not c:
                continue  # closed meanwhile (deadline, peer gone)
            self._reply(c, reply)
            if not c.closing:
                self._next_request(c)

    def _reply(self, c: _Conn, reply: dict[str, Any]) -> None:
        c.out += protocol.encode({"v": protocol.VERSION, **reply})
        c.last = time.monotonic()
        self._write(c)

    def _write(self, c: _Conn) -> None:
        try:
            while c.out:
                n = c.sock.send(c.out)
                del c.out[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(c)
            return
        if len(c.out) > protocol.MAX_REPLY:  # a client that never reads its replies
            self._close(c)
            return
        if not c.out and c.closing and not c.busy:
            self._close(c)
            return
        if c.closing:  # stop reading: a closed peer stays readable (EOF) forever
            self._watch(c, selectors.EVENT_WRITE if c.out else 0)
        else:
            self._watch(c, selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0))

    def _watch(self, c: _Conn, events: int) -> None:
        """Select ``events`` on the connection (0: none, until its reply is ready)."""
        try:
            key = self._sel.get_key(c.sock)
        except (KeyError, ValueError):
            key = None
        if not events:
            if key is not None:
                self._sel.unregister(c.sock)
        elif key is None:
            self._sel.register(c.sock, events, c)
        elif key.events != events:
            self._sel.modify(c.sock, events, c)

    @staticmethod
    def _deadline(c: _Conn) -> tuple[str, float] | None:
        """The moment ``c`` is closed unless it moves on: a request begun and not completed
        within REQUEST_DEADLINE_S ("slow"; it comes first, as first_byte <= last), or an
        empty connection idle for IDLE_TIMEOUT_S ("idle").  None while a worker holds it
        (its reply wakes the loop)."""
        if c.busy:
            return None
        if c.first_byte is not None:
            return "slow", c.first_byte + protocol.REQUEST_DEADLINE_S
        if not c.buf:
            return "idle", c.last + protocol.IDLE_TIMEOUT_S
        return None

    def _next_expiry(self) -> float | None:
        """Seconds until the earliest connection deadline, None with nothing to expire.  The
        workers and shutdown wake the selector themselves, so an idle agent sleeps here
        instead of waking 5 times a second (which cost ~0.07 % of a core on a VM)."""
        dues = [d[1] for d in map(self._deadline, self._conns.values()) if d is not None]
        if not dues:
            return None
        return min(1.0, max(0.01, min(dues) - time.monotonic()))

    def _expire(self) -> None:
        now = time.monotonic()
        for c in list(self._conns.values()):
            d = self._deadline(c)
            if d is None or now <= d[1]:
                continue
            if d[0] == "slow":
                self.stats["closed_slow"] += 1
                self.rlog.warning("slow", "socket server: uid %d did not complete a request "
                                  "within %.0f s; closed", c.uid, protocol.REQUEST_DEADLINE_S)
            else:
                self.stats["closed_idle"] += 1
            self._close(c)
