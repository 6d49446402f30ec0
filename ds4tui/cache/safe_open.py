"""Opening cache files without trusting the directory: regular files only, never through a link.

A cache directory is shared with other programs and may hold anything under a
`<40 hex>.kv` name: a FIFO (a plain open() blocks until a writer appears, so a
scan would hang), a device, a directory, or a symlink whose target lies
outside the directory (an in-place header write would land in that target).
Every open here `lstat()`s first, refuses anything but a regular file, opens
with O_NONBLOCK | O_NOFOLLOW (a swap to a FIFO or link between the two calls
cannot block or be followed) and checks with `fstat()` that the open file is
the very file that was lstat()ed.

Also here: the one-line diagnosis of a cache directory that cannot be used.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from ds4tui.errors import Ds4tuiError

SKIPPED = "skipped: not a regular file"

_KINDS = (
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


class NotRegularFile(Ds4tuiError, OSError):
    """The name exists but is not a regular file (or changed into something else while opened)."""

    def __init__(self, path: str | os.PathLike, kind: str) -> None:
        super().__init__(errno.EINVAL, f"{SKIPPED} ({kind})", str(path))
        self.kind = kind

    def __str__(self) -> str:
        return f"{SKIPPED} ({self.kind})"


class CacheDirError(Ds4tuiError, OSError):
    """The cache directory itself cannot be used (not a directory, unreadable, read-only)."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def file_kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "regular file" if stat.S_ISREG(mode) else "special file"


def lstat_regular(path: str | os.PathLike) -> os.stat_result:
    """lstat() of `path`; NotRegularFile unless it is a regular file (FileNotFoundError passes)."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(path, file_kind(st.st_mode))
    return st


def open_regular(path: str | os.PathLike, *, write: bool = False) -> BinaryIO:
    """Open a regular file for reading (or reading and writing), never blocking, never via a link."""
    before = lstat_regular(path)
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a symlink since the lstat
            raise NotRegularFile(path, "symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise NotRegularFile(path, file_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "replaced while opened")
        return os.fdopen(fd, "r+b" if write else "rb")
    except BaseException:
        os.close(fd)
        raise


def dir_problem(directory: str | os.PathLike, *, write: bool) -> str | None:
    """Why `directory` cannot serve as a cache directory, in one line; None when it can.

    A directory that does not exist yet is fine (the first save creates it),
    unless its nearest existing ancestor is not a writable directory.
    """
    path = Path(directory)
    probe = path
    while True:
        try:
            st = os.stat(probe)
            break
        except FileNotFoundError:
            if probe.parent == probe:
                return None
            probe = probe.parent
        except OSError as exc:
            return f"cache directory {path}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        what = "it" if probe == path else f"{probe}"
        return f"cache directory {path}: {what} is not a directory ({file_kind(st.st_mode)})"
    if probe == path and not os.access(path, os.R_OK | os.X_OK):
        return f"cache directory {path}: not readable"
    if write and not os.access(probe, os.W_OK | os.X_OK):
        return f"cache directory {path}: {'read-only' if probe == path else f'{probe} is read-only'}"
    return None
