"""The agent's queue directory, ``<spool>/pending/``: requests left by root hooks (and the
SPANK plugin) while no agent answers.  This module owns the queue: :func:`write` (the hooks'
and the launcher's writer, ``client.queue_request``), :func:`take` (the agent) and
:func:`registration_queued` (the Epilog's look-up) -- the readers share one parser, so what one
side writes the other finds whatever the JSON's spacing (the C plugin's or ``protocol.encode``).

Only root (or a private agent's own user) writes here, so the directory is 0700 and owned by
the agent's uid; a directory left by an older version (1733, world-writable) is tightened.
Reading never blocks or follows links: a FIFO, a device, a symlink or a file over the request
limit named ``*.json`` is removed unread; at most ``MAX_FILES`` are taken per scan.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import time
import uuid
from typing import Any

from . import protocol

log = logging.getLogger("reveal.agent")

MAX_FILES = 1000


def prepare_dir(pend: str, uid: int) -> None:
    """Create (or tighten) the queue directory; refuse one that is not ours."""
    try:
        os.mkdir(pend, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(pend)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise RuntimeError(f"{pend}: not a directory owned by uid {uid} (a symlink or another "
                           f"user's); refusing to read queued requests from it")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(pend, 0o700, follow_symlinks=False)


def write(spool: str, req: dict[str, Any]) -> str:
    """Leave a request in ``<spool>/pending/`` for an agent that is not listening yet.

    Only root (or a private agent's own user) queues, so the directory is 0700; the file is
    created beside it and renamed in, never following a symlink."""
    pend = os.path.join(spool, "pending")
    try:
        os.mkdir(pend, 0o700)
    except FileExistsError:
        pass
    dfd = os.open(pend, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        name = f"{time.time():.6f}-{uuid.uuid4().hex[:8]}.json"
        tmp = "." + name + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                     dir_fd=dfd)
        with os.fdopen(fd, "wb") as f:
            f.write(protocol.encode({"v": protocol.VERSION, **req}))
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)
    return os.path.join(pend, name)


def _names(dfd: int) -> list[str]:
    """The queued files, oldest first (names sort by time)."""
    return sorted(n for n in os.listdir(dfd) if n.endswith(".json") and
                  not n.startswith("."))[:MAX_FILES]


def _read(dfd: int, name: str, uids: tuple[int, ...]) -> dict[str, Any]:
    """One queued request, parsed; OSError (ENOENT: gone meanwhile) or ValueError (not a
    regular file, another owner, too big, not a request) when it is not one."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_uid not in uids:
            raise ValueError(f"owned by uid {st.st_uid}")
        if st.st_size > protocol.MAX_REQUEST:
            raise ValueError(f"{st.st_size} bytes, over {protocol.MAX_REQUEST}")
        data = os.read(fd, protocol.MAX_REQUEST + 1)
        return protocol.decode(data.strip())
    finally:
        os.close(fd)


def registration_queued(spool: str, run_id: str, uids: tuple[int, ...] | None = None
                        ) -> bool:
    """True when a registration of ``run_id`` waits in ``<spool>/pending/`` (read, not
    taken).  ``uids``: the owners trusted to have queued it (root and this process's user)."""
    uids = uids if uids is not None else tuple({0, os.geteuid()})
    try:
        dfd = os.open(os.path.join(spool, "pending"),
                      os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        for n in _names(dfd):
            try:
                req = _read(dfd, n, uids)
            except (ValueError, OSError):
                continue       # the agent's take() removes it and says why
            run = req.get("run")
            if req.get("op") == "register" and isinstance(run, dict) and \
                    run.get("run_id") == run_id:
                return True
    finally:
        os.close(dfd)
    return False


def _remove(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass


def take(pend: str, uids: tuple[int, ...]) -> list[tuple[str, dict[str, Any]]]:
    """Queued requests, oldest first (names sort by time), each removed once read."""
    try:
        dfd = os.open(pend, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    try:
        for n in _names(dfd):
            try:
                out.append((os.path.join(pend, n), _read(dfd, n, uids)))
            except OSError as e:
                if e.errno == errno.ENOENT:
                    continue
                log.warning("pending %s/%s removed unread: %s", pend, n, e.strerror or e)
            except ValueError as e:
                log.warning("pending %s/%s removed unread: %s", pend, n, e)
            _remove(dfd, n)
    finally:
        os.close(dfd)
    return out
