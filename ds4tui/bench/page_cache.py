"""How much of a file the kernel's page cache holds, and dropping it from there, without root.

Owns what `bench cache` needs to time a disk hit whose file is not in memory:
`resident_fraction` (mincore(2) over a read-only mapping, through ctypes) and
`evict` (fsync, then posix_fadvise(POSIX_FADV_DONTNEED): the kernel drops the
file's clean pages; dirty ones would stay, hence the fsync). The kernel may keep
pages another process has mapped or locked, and some filesystems (tmpfs) have
no backing store to drop to, so the bench checks the result instead of
trusting the call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value


def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_fraction(path: str | os.PathLike) -> float | None:
    """Share of `path`'s pages in the page cache (0.0-1.0); None where mincore is unavailable.

    Mapping a file does not read it: mincore only reports, it faults nothing in."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    try:
        libc = _libc()
    except (OSError, AttributeError):
        return None
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            return None
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            resident = sum(b & 1 for b in bytes(vec))
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return resident / pages


def evict(path: str | os.PathLike) -> None:
    """Ask the kernel to drop `path` from the page cache (fsync first: only clean pages go).

    Up to three asks: pages still queued for the LRU lists on another CPU when the first
    one comes are not dropped by it (seen on a busy 2-core machine), a second ask gets them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        for _ in range(3):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if not resident_fraction(path):  # 0.0, or None where mincore cannot tell
                break
    finally:
        os.close(fd)


def warm(path: str | os.PathLike) -> None:
    """Read the whole file once, so the page cache holds it (as after a recent save or hit)."""
    with open(path, "rb", buffering=0) as fp:
        while fp.read(1 << 22):
            pass
