"""One analysis per job, and at most ``analysis_max_concurrent`` on a node.

The detached analysis runs as root after every Epilog.  Two Epilogs of one job (the SPANK
plugin's and a script Epilog both installed, or slurmd retrying) must not analyse it twice --
the second would race the first on ``report.json`` and the sinks would publish twice -- and a
burst of short jobs ending together must not start one analysis each on a node that already
runs the next jobs.

Both are ``flock`` locks on files in ``<spool>/analysis/`` (root's, 0700, opened without
following symlinks): ``job-<id>.lock`` is held for the whole analysis of a job and says
``done <run_dir>`` once it finished; ``slot-<k>.lock`` (``k < analysis_max_concurrent``) is
held while an analysis runs.  Locks die with their process, so a killed analysis frees both.
"""
from __future__ import annotations

import fcntl
import os
import stat
import time

LOCK_DIR = "analysis"
#: job lock files older than this are removed when an analysis starts (one file per job)
KEEP_S = 2 * 86400.0


class Busy(Exception):
    """The lock is held by another analysis."""


def _dir(spool: str) -> int:
    """A descriptor of ``<spool>/analysis`` (created 0700); refuses anything not root's."""
    path = os.path.join(spool, LOCK_DIR)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise PermissionError(f"{path}: not owned by uid {os.geteuid()} or writable by others")
    return fd


def _open(dfd: int, name: str) -> int:
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                 0o600, dir_fd=dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PermissionError(f"{name}: not a regular file")
    return fd


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class JobLock:
    """``with JobLock(spool, job) as lk:`` -- raises :class:`Busy` when another analysis of
    the job runs; ``lk.done`` is the run directory an earlier analysis finished, else None;
    ``lk.mark_done(run_dir)`` records this one."""

    def __init__(self, spool: str, job: str):
        self.spool, self.job, self.fd = spool, job, -1
        self.done: str | None = None

    def __enter__(self) -> "JobLock":
        dfd = _dir(self.spool)
        try:
            _prune(dfd)
            self.fd = _open(dfd, f"job-{self.job}.lock")
        finally:
            os.close(dfd)
        if not _try(self.fd):
            os.close(self.fd)
            self.fd = -1
            raise Busy(f"another analysis of job {self.job} is running")
        text = os.pread(self.fd, 4096, 0).decode(errors="replace")
        if text.startswith("done "):
            self.done = text[5:].strip()
        return self

    def mark_done(self, run_dir: str) -> None:
        data = f"done {run_dir}\n".encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)      # releases the flock


def acquire_slot(spool: str, slots: int, wait_s: float, poll_s: float = 0.5) -> int | None:
    """Hold one of ``slots`` analysis slots: its descriptor (close it to free the slot), or
    None when none freed within ``wait_s``."""
    dfd = _dir(spool)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            for k in range(slots):
                fd = _open(dfd, f"slot-{k}.lock")
                if _try(fd):
                    return fd
                os.close(fd)
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)
    finally:
        os.close(dfd)


def _prune(dfd: int) -> None:
    now = time.time()
    for name in os.listdir(dfd):
        if not (name.startswith("job-") and name.endswith(".lock")):
            continue
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if now - st.st_mtime > KEEP_S:
                fd = _open(dfd, name)
                try:
                    if _try(fd):                    # nobody holds it: gone
                        os.unlink(name, dir_fd=dfd)
                finally:
                    os.close(fd)
        except OSError:
            continue
