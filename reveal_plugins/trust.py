"""What root may load: configuration files and plugin code owned by root and writable by no one else.

Root reads ``/etc/reveal/*.toml`` and imports analyzers and third-party plugins.  If any of them,
or a directory above them, can be written by another user, that user can make root run code of
their choosing (an ``analyzer = "mine:run"`` line, a replaced module).  The rule is the one
``sshd``'s StrictModes applies: the file and every directory up to ``/`` belong to root and are
not group/other-writable; a sticky directory (``/tmp``) is accepted above a root-owned child,
because others cannot replace what root owns there.  Checks apply only when the process runs
as root; an ordinary user may load whatever they own.
"""
from __future__ import annotations

import errno
import importlib.util
import os
import stat


class UntrustedPath(PermissionError):
    """A file root was asked to load fails the ownership rule; the message says which part."""


def _who(uid: int) -> str:
    try:
        import pwd
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def untrusted_reason(path: str) -> str | None:
    """Why root must not load ``path`` (None when it may).  Symlinks are resolved first, and the
    real file and all its real parent directories are checked."""
    real = os.path.realpath(path)
    cur = real
    while True:
        try:
            st = os.lstat(cur)
        except OSError as e:
            return f"{cur}: {e.strerror}"
        writable = st.st_mode & 0o022
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_uid != 0:
            return f"{cur} is owned by {_who(st.st_uid)}, not root"
        if writable and not (sticky and cur != real):  # below it: a root-owned child
            return (f"{cur} is writable by group or others "
                    f"(mode {stat.S_IMODE(st.st_mode):04o})")
        if cur == "/":
            return None
        cur = os.path.dirname(cur)


def require_trusted(path: str, what: str) -> None:
    """Raise :class:`UntrustedPath` when running as root and ``path`` fails the rule."""
    if os.geteuid() != 0:
        return
    why = untrusted_reason(path)
    if why:
        raise UntrustedPath(f"{what} {path}: refused as root: {why}; make it root-owned and "
                            "not group/other-writable (chown root; chmod go-w)")


def read_trusted(path: str, what: str, max_bytes: int = 4 << 20) -> bytes:
    """The content of ``path``; as root only if the file fails nothing in the rule.

    Opened first, judged after: the descriptor's file must be a regular root-owned file not
    group/other-writable, and the path it is reachable by now (``/proc/self/fd``) must pass
    :func:`untrusted_reason` and still lead to that same file.  Checking a path and then
    opening it would let a symlink re-pointed in between (in sticky ``/tmp``) choose the file.
    Raises FileNotFoundError when absent, :class:`UntrustedPath` when refused."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if os.geteuid() == 0:
            why = None
            if st.st_uid != 0:
                why = f"{path} is owned by {_who(st.st_uid)}, not root"
            elif st.st_mode & 0o022:
                why = (f"{path} is writable by group or others "
                       f"(mode {stat.S_IMODE(st.st_mode):04o})")
            else:
                try:
                    real = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    real = os.path.realpath(path)
                why = untrusted_reason(real)
                if why is None:
                    try:
                        now = os.lstat(real)
                        same = (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
                    except OSError:
                        same = False
                    if not same:
                        why = f"{real} changed while it was being opened"
            if why:
                raise UntrustedPath(f"{what} {path}: refused as root: {why}; make it "
                                    "root-owned and not group/other-writable "
                                    "(chown root; chmod go-w)")
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than the {max_bytes} a "
                          f"{what} may hold")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(max_bytes + 1)[:max_bytes]
    finally:
        os.close(fd)


def module_files(module: str) -> list[str]:
    """The files and directories an import of ``module`` would execute from, found without
    importing anything untrusted: each package on the dotted path is checked before it is
    imported to locate the next."""
    out: list[str] = []
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        spec = importlib.util.find_spec(name)  # imports the (already checked) parents only
        if spec is None:
            raise ModuleNotFoundError(f"no module named {name!r}")
        if spec.origin and spec.origin not in ("built-in", "frozen"):
            out.append(spec.origin)
        out.extend(spec.submodule_search_locations or [])
        if i < len(parts) and os.geteuid() == 0:
            for p in out:
                require_trusted(p, f"module {name}")
    return out


def require_trusted_module(module: str, what: str) -> None:
    """As root: refuse ``module`` unless all its files pass :func:`untrusted_reason`."""
    if os.geteuid() != 0:
        return
    for p in module_files(module):
        require_trusted(p, what)
