"""Creating run directories safely when the agent runs as root (Slurm nodes).

Called by the agent whenever a run registers (``create_run_dir``) and by root hooks that write
into a run directory afterwards (``write_file``).  The permission model, and why:

* The spool (``<spool>``) is root-owned and not writable by group/other; ``<spool>/jobs`` is
  ``0711`` so users can reach their own job by id but cannot list other users' jobs.
* A job's directory and its run directory are owned by root, mode ``0750`` with group root,
  plus a POSIX ACL entry ``user:<job uid>:r-x`` (and, on the run directory, the same entry as a
  default ACL, so every file the agent creates there inherits ``user:<uid>:r--``).  Only root
  and the job's user can read; users who share the job user's primary group cannot, and
  nobody but root can write, so a user can never plant a file or a symlink where root writes.
  ACLs are set through the ``system.posix_acl_*`` extended attributes (no ``setfacl``
  needed; ext4, xfs and tmpfs support them).
* Where the file system has no ACLs (some NFS exports) the run directory falls back to group
  ownership ``root:<primary gid>`` with mode ``2750`` -- but only when that group is proven
  the user's private group (named like the user, no other member, no other account with it
  as primary group, and the account database enumerable in full: local sources only in
  nsswitch.conf -- under sssd/LDAP ``getpwall`` lists local users only, so a shared group
  such as "users" would look private); otherwise it stays root-only (``0700``) and a
  warning says why the user cannot read it.
* Root never follows a path component it did not check: every directory below the spool is
  opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's descriptor (openat-style),
  must be owned by root and not writable by others, and ownership and modes are changed
  through the descriptor (``fchown``/``fchmod``), never by path.  Paths outside the spool are
  refused for runs of other users.
"""
from __future__ import annotations

import contextlib
import errno
import grp
import itertools
import logging
import os
import pwd
import stat
import struct
import time
from typing import BinaryIO, Iterator

log = logging.getLogger("reveal.rundir")

# POSIX ACL extended-attribute encoding (linux/posix_acl_xattr.h).
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF
_XATTR_ACCESS = "system.posix_acl_access"
_XATTR_DEFAULT = "system.posix_acl_default"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RunDirError(OSError):
    """A run directory cannot be created safely; the message names the path and the reason."""


def _acl(uid: int) -> bytes:
    """ACL ``u::rwx, u:<uid>:r-x, g::r-x, m::r-x, o::---``."""
    entries = [(_USER_OBJ, 7, _UNDEFINED_ID), (_USER, 5, uid), (_GROUP_OBJ, 5, _UNDEFINED_ID),
               (_MASK, 5, _UNDEFINED_ID), (_OTHER, 0, _UNDEFINED_ID)]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def acl_users(path_or_fd: str | int) -> list[int]:
    """The uids named in a file's access ACL ([] when it has none or ACLs are unsupported)."""
    try:
        blob = os.getxattr(path_or_fd, _XATTR_ACCESS)
    except OSError:
        return []
    out = []
    for off in range(4, len(blob) - 7, 8):
        tag, _perm, ident = struct.unpack_from("<HHI", blob, off)
        if tag == _USER:
            out.append(ident)
    return out


#: Where the name-service sources are configured (tests point it elsewhere).
NSSWITCH_CONF = "/etc/nsswitch.conf"
#: Sources whose ``getpwall``/``getgrall`` enumeration is complete (local files, systemd's
#: dynamic users).  Anything else (sss, ldap, winbind, nis, compat's +/- entries) may answer
#: ``getpwnam`` for accounts that ``getpwall`` never lists (sssd's ``enumerate = false``).
_LOCAL_SOURCES = {"files", "systemd"}


def _nss_sources(db: str) -> list[str] | None:
    """The sources nsswitch.conf names for ``db`` (None when it cannot be read)."""
    try:
        with open(NSSWITCH_CONF) as f:
            lines = f.read(1 << 20).splitlines()
    except FileNotFoundError:
        return ["files"]              # glibc's default without nsswitch.conf
    except OSError:
        return None
    for line in lines:
        line = line.split("#", 1)[0]
        key, sep, rest = line.partition(":")
        if sep and key.strip() == db:
            return [w for w in rest.split() if not w.startswith("[")]
    return ["files"]


def _enumeration_complete() -> bool:
    """True only when every account and group comes from sources ``getpwall`` enumerates."""
    for db in ("passwd", "group"):
        src = _nss_sources(db)
        if not src or any(s not in _LOCAL_SOURCES for s in src):
            return False
    return True


def _private_group(uid: int, gid: int) -> bool:
    """True only when ``gid`` is proven a user-private group of ``uid``: the account database
    is enumerable in full (local sources only, see :func:`_enumeration_complete`), the group
    carries the user's name (the user-private-group convention), lists no other member, the
    enumeration lists the user, and no other account has it as primary group.  Under
    sssd/LDAP nothing can be proven, so this is False there (the caller falls back to
    root-only)."""
    try:
        g = grp.getgrgid(gid)
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return False
    if g.gr_name != name or any(m != name for m in g.gr_mem):
        return False
    if not _enumeration_complete():
        return False
    seen_self = False
    for p in pwd.getpwall():
        if p.pw_uid == uid:
            seen_self = True
        elif p.pw_gid == gid:
            return False
    return seen_self


def _grant(fd: int, path: str, uid: int, gid: int | None, default: bool) -> str:
    """Give ``uid`` read access to the directory open at ``fd``; return how ('acl', ...)."""
    os.fchown(fd, 0, 0)
    os.fchmod(fd, 0o750)  # nosec B103  # root-owned, group 0; the user is granted by ACL below
    try:
        os.setxattr(fd, _XATTR_ACCESS, _acl(uid))
        if default:
            os.setxattr(fd, _XATTR_DEFAULT, _acl(uid))
        return "acl"
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS):
            raise
    if gid is not None and _private_group(uid, gid):
        os.fchown(fd, 0, gid)
        os.fchmod(fd, 0o2750)  # nosec B103  # group proven private to the user (_private_group)
        return "group"
    os.fchmod(fd, 0o700)
    log.warning("%s: the file system has no POSIX ACLs and gid %s is not proven a private "
                "group of uid %s (named like the user, no other member, accounts only from "
                "local files); the run directory stays readable by root only", path, gid, uid)
    return "root-only"


def _check_trusted(fd: int, path: str, euid: int) -> os.stat_result:
    st = os.fstat(fd)
    if st.st_uid != euid:
        raise RunDirError(errno.EPERM, f"{path}: owned by uid {st.st_uid}, not by uid {euid}; "
                          "refusing to write into a directory another user controls")
    if st.st_mode & 0o022:
        raise RunDirError(errno.EPERM, f"{path}: writable by group/other (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}); refusing to write into it as root")
    return st


def _spool_of(path: str) -> str | None:
    """The spool of a Slurm-layout path ``<spool>/jobs/<job>/<host>``, else None."""
    parts = path.rstrip("/").split("/")
    if len(parts) >= 4 and parts[-3] == "jobs":
        return "/".join(parts[:-3]) or "/"
    return None


def _open_spool(spool: str, euid: int) -> int:
    """Open (creating it root-owned 0755 if missing) and check the spool root."""
    real = os.path.realpath(spool)
    try:
        os.makedirs(real, mode=0o755, exist_ok=True)
        fd = os.open(real, _DIR_FLAGS)
    except OSError as e:
        raise RunDirError(e.errno, f"spool {spool}: {e.strerror}") from None
    try:
        _check_trusted(fd, spool, euid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _move_aside(parent_fd: int, name: str, parent_path: str) -> None:
    """A stale directory of an earlier job with the same id (ids wrap): keep it, root-only."""
    new = f".{name}.stale-{time.time_ns()}"
    os.rename(name, new, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    fd = os.open(new, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    log.warning("%s/%s belonged to another user (an earlier job with the same id); moved to %s",
                parent_path, name, new)


def create_run_dir(path: str, uid: int | None = None, gid: int | None = None, *,
                   spool: str | None = None) -> str:
    """Create the run directory ``path`` for a run of user ``uid`` and return its path.

    Called by the agent when a run registers.  Without a privilege boundary (the caller is not
    root, or the run is root's own) this is ``makedirs(path, 0o750)``.  As root for another
    user the path must lie inside ``spool`` (default: the ``<spool>`` of a
    ``<spool>/jobs/<job>/<host>`` path) and is created with the checks and the ACL described in
    the module docstring.  Raises :class:`RunDirError` naming the offending path otherwise.
    """
    euid = os.geteuid()
    path = os.path.abspath(path)
    if uid is not None and gid is None:
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = None
    spool = spool or _spool_of(path)
    if spool is None:
        if euid == 0 and uid not in (None, 0):
            raise RunDirError(errno.EPERM, f"{path}: a root agent creates run directories of "
                              f"uid {uid} only inside its spool (<spool>/jobs/<job>/<host>)")
        os.makedirs(path, mode=0o750, exist_ok=True)
        if os.path.islink(path):
            raise RunDirError(errno.ELOOP, f"{path}: is a symlink; refusing to use it")
        return path
    spool = os.path.abspath(spool)
    rel = os.path.relpath(path, spool)
    parts = rel.split(os.sep)
    if rel == "." or any(p in ("", ".", "..") for p in parts):
        raise RunDirError(errno.EPERM, f"{path}: outside the spool {spool}; refusing")
    guarded = euid == 0
    fd = _open_spool(spool, euid) if guarded else None
    if not guarded:
        os.makedirs(path, mode=0o750, exist_ok=True)
        return path
    cur = spool
    try:
        for i, name in enumerate(parts):
            depth_from_end = len(parts) - 1 - i        # 0: run dir, 1: job dir, ...
            cur = os.path.join(cur, name)
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
                created = True
            except FileExistsError:
                created = False
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise RunDirError(e.errno, f"{cur}: is a symlink or not a directory; "
                                      "refusing to follow it as root") from None
                raise RunDirError(e.errno, f"{cur}: {e.strerror}") from None
            try:
                _check_trusted(nfd, cur, euid)
                user_dir = uid not in (None, 0) and depth_from_end <= 1 and len(parts) >= 3
                if (user_dir and not created and depth_from_end == 1
                        and any(u != uid for u in acl_users(nfd))):
                    os.close(nfd)
                    nfd = -1
                    _move_aside(fd, name, os.path.dirname(cur))
                    os.mkdir(name, 0o700, dir_fd=fd)
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    _check_trusted(nfd, cur, euid)
                if user_dir:
                    _grant(nfd, cur, uid, gid, default=depth_from_end == 0)
                elif depth_from_end == 0:
                    os.fchmod(nfd, 0o750)  # nosec B103  # root:root, no group members but root
                elif created:
                    # Shared levels (``jobs``): users may traverse to their job, not list others.
                    os.fchmod(nfd, 0o711)  # nosec B103  # traverse only, no listing of other jobs
            except BaseException:
                if nfd >= 0:
                    os.close(nfd)
                raise
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    return os.path.join(os.path.realpath(spool), rel)


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def open_dir(path: str) -> int:
    """Open the directory ``path`` for writing into it; return its descriptor.

    The last component is never followed if it is a symlink.  As root the directory must be
    owned by root and not group/other-writable (:class:`RunDirError` naming the directory and
    its owner otherwise): a user who can write there could swap a name for a symlink between
    root's check and root's write.
    """
    try:
        dfd = os.open(path, _DIR_FLAGS)
    except OSError as e:
        raise RunDirError(e.errno, f"{path}: {e.strerror} (symlinks are not followed)") \
            from None
    if os.geteuid() == 0:
        st = os.fstat(dfd)
        if st.st_uid != 0 or st.st_mode & 0o022:
            os.close(dfd)
            raise RunDirError(errno.EPERM, (
                f"{path}: owned by {_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}; "
                "as root, reveal writes only into directories owned by root and not "
                "group/other-writable (a planted symlink could redirect the write) -- run "
                "this as the directory's owner instead"))
    return dfd


_tmp_seq = itertools.count()


@contextlib.contextmanager
def atomic_file(directory: str | int, name: str, mode: int = 0o640, *,
                sync: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``directory/name`` atomically when the block ends.

    The one way files are written into run directories (meta.json, segments, report.json,
    otel.json, summary.txt), by root or not.  ``directory`` is a path (opened with
    :func:`open_dir`) or an open directory descriptor.  The temporary file
    ``.<name>.<pid>.<n>.tmp`` is created ``O_EXCL | O_NOFOLLOW`` relative to the directory,
    its mode set through the descriptor (``fchmod``: the umask does not matter), and renamed
    over ``name`` relative to the directory: a symlink planted at ``name`` is replaced, never
    written through, and a reader sees the old or the new file, never a partial one.  With
    ``sync`` the file is fsynced before the rename and the directory after it, so that after
    a crash ``name`` is either the old or the complete new file (never empty).  On an error
    inside the block the temporary file is removed and ``name`` is left as it was.
    """
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"file name {name!r}: must be a plain name")
    own = not isinstance(directory, int)
    dfd = open_dir(directory) if own else directory
    try:
        tmp = f".{name}.{os.getpid()}.{next(_tmp_seq)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(fd, mode)
                yield f
                f.flush()
                if sync:
                    os.fsync(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        if sync:
            os.fsync(dfd)
    finally:
        if own:
            os.close(dfd)


def write_file(run_dir: str, name: str, data: bytes, mode: int = 0o640, *,
               sync: bool = True) -> str:
    """Atomically write ``run_dir/name`` (see :func:`atomic_file`); return the path.

    Used for every whole-file write into a run directory; as root it refuses a directory that
    root does not own (:func:`open_dir`).
    """
    with atomic_file(run_dir, name, mode, sync=sync) as f:
        f.write(data)
    return os.path.join(run_dir, name)
