"""The agent's queue directory, ``<spool>/pending/``: requests left by root hooks (and the
SPANK plugin) while no agent answers.  ``client.queue_request`` writes; this reads.

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
        names = sorted(n for n in os.listdir(dfd) if n.endswith(".json") and
                       not n.startswith("."))[:MAX_FILES]
        for n in names:
            try:
                fd = os.open(n, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=dfd)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    log.warning("pending %s/%s removed unread: %s", pend, n, e.strerror)
                    _remove(dfd, n)
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise ValueError("not a regular file")
                if st.st_uid not in uids:
                    raise ValueError(f"owned by uid {st.st_uid}")
                if st.st_size > protocol.MAX_REQUEST:
                    raise ValueError(f"{st.st_size} bytes, over {protocol.MAX_REQUEST}")
                data = os.read(fd, protocol.MAX_REQUEST + 1)
                out.append((os.path.join(pend, n), protocol.decode(data.strip())))
            except (ValueError, OSError) as e:
                log.warning("pending %s/%s removed unread: %s", pend, n, e)
            finally:
                os.close(fd)
                _remove(dfd, n)
    finally:
        os.close(dfd)
    return out
