"""Low-level file operations of the store: atomic write, in-place header edits, cleanup.

Owns: how bytes reach disk safely. A save goes to `<sha>.kv.tmp.<pid>.<rand>`,
is fsynced and renamed over `<sha>.kv`, then the directory is fsynced, so a
reader sees no file or a whole file, and a crash leaves at most a temp file
(which no scan lists; every scan removes those whose writer's PID is gone, see
`remove_stale_tmp`, and they count toward the budget while they exist). In-place edits touch
only hits/last_used and ext_flags, after checking the file is still KVC.

The header lock: every ds4tui step that changes or removes an existing file
(a header write, an eviction, a delete, a save replacing a file) takes
`flock(LOCK_EX)` on that file and, holding it, checks that the name still
points at the file it opened (and, for an eviction, that the file is the
version that was scanned: inode, size, mtime, and not pinned). A pin can
therefore never land in a file another process is unlinking, and an eviction
planned from an older scan never removes a newer save or a file pinned since.
ds4 takes no such lock (docs/format.md, "Sharing a directory with ds4").
Leaves to saving.py and edits.py: what to write, when, and the budget.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import re
import secrets
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ds4tui.cache.integrity import HashingWriter, new_hasher
from ds4tui.errors import Ds4tuiError
from ds4tui.format.kvc import (
    EXT_CHECKSUM,
    MAX_TEXT_BYTES,
    OFFSET_CREATED_AT,
    OFFSET_EXT_FLAGS,
    OFFSET_MODEL_ID,
    OFFSET_PAYLOAD_ABI,
    OFFSET_QUANT_BITS,
    QUANT_DS4TUI_MARK,
    OFFSET_HITS,
    EXT_PINNED,
    MAGIC,
    OFFSET_LAST_USED,
    PREFIX_BYTES,
    KvcFormatError,
    KvcHeader,
    check_lengths,
    decode_header,
    encode_checksum,
    encode_header,
)
from ds4tui.cache.safe_open import NotRegularFile, open_regular
from ds4tui.format.payload import DSV4_HEADER_BYTES, unpack_dsv4_header

WritePayload = Callable[[BinaryIO], Any]
TMP_MARK = ".tmp."

StatKey = tuple[int, int, int]  # (inode, size, mtime_ns): one version of a file
# A name replaced between our open and our lock is opened again, this many times at most.
LOCK_RETRIES = 8


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _same_file(path: Path, st: os.stat_result) -> bool:
    """Whether `path` still names the file `st` describes (not removed, not replaced)."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


@contextmanager
def locked(path: str | Path, *, write: bool = False) -> Iterator[BinaryIO]:
    """The regular file at `path`, opened and held under the header lock, the name checked to
    still point at it after the lock was taken (a file replaced meanwhile is opened again).

    Raises FileNotFoundError when the name is gone, NotRegularFile (an OSError) when it is not
    a regular file."""
    path = Path(path)
    for _ in range(LOCK_RETRIES):
        fp = open_regular(path, write=write)
        try:
            fcntl.flock(fp.fileno(), fcntl.LOCK_EX)
            if not _same_file(path, os.fstat(fp.fileno())):
                fp.close()
                continue
        except BaseException:
            fp.close()
            raise
        with fp:
            yield fp
        return
    raise FileNotFoundError(errno.ENOENT, "replaced again and again while being locked", str(path))


def pinned_head(head: bytes) -> bool:
    return len(head) > OFFSET_EXT_FLAGS and head[:3] == MAGIC and bool(head[OFFSET_EXT_FLAGS] & EXT_PINNED)


# Why a removal did not happen (None: it did).
GONE, CHANGED, PINNED = "gone", "changed since it was scanned", "pinned since it was scanned"


def remove_checked(path: str | Path, expect: StatKey | None = None, *, keep_pinned: bool = True) -> str | None:
    """Unlink `path` under its header lock, only if it is still the version `expect` (inode,
    size, mtime_ns; None: any) and, with `keep_pinned`, not pinned. None when it was removed,
    else why not (GONE, CHANGED, PINNED). Raises OSError when it cannot be removed."""
    try:
        with locked(path) as fp:
            fd = fp.fileno()
            if expect is not None and stat_key(os.fstat(fd)) != tuple(expect):
                return CHANGED
            if keep_pinned and pinned_head(os.pread(fd, PREFIX_BYTES, 0)):
                return PINNED
            os.unlink(path)
            return None
    except FileNotFoundError:
        return GONE


class PayloadSizeError(Ds4tuiError):
    """The payload writer wrote a different number of bytes than it declared."""


def write_atomic(final: Path, header: KvcHeader, text: bytes, write_payload: WritePayload,
                 tail: bytes, *, new_name: Callable[[int], Path] | None = None) -> tuple[Path, int]:
    """Write a whole file under a temp name and rename it to `final`; returns (path, created_at).

    The header must carry EXT_CHECKSUM: text, payload and `tail` are hashed as
    they are written and the checksum trailer closes the file. On any failure
    (including KeyboardInterrupt) the temp file is removed and the exception
    propagates; `final` is then exactly as it was.

    `new_name` (a titled session's first save): the file must not replace
    anything. `new_name(created_at)` gives the name for a creation time; a taken
    name bumps created_at by one second (rewritten in the temp file's header,
    which the checksum does not cover) until a free one is claimed, atomically
    against other processes.
    """
    if not header.ext_flags & EXT_CHECKSUM:
        raise ValueError("ds4tui writes every file with its checksum trailer")
    final.parent.mkdir(parents=True, exist_ok=True)
    # pid + random: unique across processes and threads; never a cache-file name.
    tmp = final.with_name(f"{final.name}{TMP_MARK}{os.getpid()}.{secrets.token_hex(4)}")
    _track(tmp, True)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as raw:
            raw.write(encode_header(header))
            hasher = new_hasher()
            fp = HashingWriter(raw, hasher)
            fp.write(text)
            start = fp.tell()
            write_payload(fp)  # type: ignore[arg-type]  # HashingWriter: the write side of a BinaryIO
            written = fp.tell() - start
            if written != header.payload_bytes:
                raise PayloadSizeError(f"payload writer wrote {written} bytes, declared {header.payload_bytes}")
            fp.write(tail)
            raw.write(encode_checksum(hasher.intdigest()))
            raw.flush()
            os.fsync(raw.fileno())
        created = header.created_at
        if new_name is None:
            _install(tmp, final)
        else:
            final, created = _claim_new_name(tmp, new_name, created)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    finally:
        _track(tmp, False)
    fsync_dir(final.parent)
    return final, created


MAX_NAME_BUMPS = 1000


def _install(tmp: Path, final: Path) -> None:
    """Rename `tmp` onto `final`. A file already there is replaced under its header lock, its
    pin and hit count carried into the new file as they are at that moment (read under the
    lock: a pin set after the save's scan is not lost); with nothing there, the name is
    claimed by a hard link, so a file that appears meanwhile is locked and read first."""
    for _ in range(LOCK_RETRIES):
        try:
            with locked(final) as old:
                _inherit(tmp, old.read(PREFIX_BYTES))
                os.replace(tmp, final)
                return
        except FileNotFoundError:
            pass
        except NotRegularFile:
            os.replace(tmp, final)  # a FIFO or link under our name: never opened, replaced
            return
        try:
            os.link(tmp, final)
        except FileExistsError:
            continue  # another save got there first: lock that one
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            os.replace(tmp, final)  # no hard links here: a narrow race remains
            return
        os.unlink(tmp)
        return
    os.replace(tmp, final)


def _inherit(tmp: Path, old_head: bytes) -> None:
    """Give our temp file the pin and hit count of the file it replaces (header bytes the
    checksum does not cover)."""
    try:
        old = decode_header(old_head)
    except KvcFormatError:
        return
    with open(tmp, "r+b") as fp:
        mine = decode_header(fp.read(PREFIX_BYTES))
        flags = mine.ext_flags | (old.ext_flags & EXT_PINNED)
        if flags == mine.ext_flags and mine.hits == old.hits:
            return
        os.pwrite(fp.fileno(), struct.pack("<I", old.hits), OFFSET_HITS)
        os.pwrite(fp.fileno(), bytes([flags]), OFFSET_EXT_FLAGS)
        os.fsync(fp.fileno())


def _claim_new_name(tmp: Path, new_name: Callable[[int], Path], created: int) -> tuple[Path, int]:
    """Hard-link `tmp` to the first free name (link never replaces: EEXIST is the other writer's
    claim), then drop the temp name."""
    for _ in range(MAX_NAME_BUMPS):
        final = new_name(created)
        try:
            os.link(tmp, final)
        except FileExistsError:
            created += 1
            with open(tmp, "r+b") as fp:  # our own temp file: the header's created_at follows the name
                os.pwrite(fp.fileno(), struct.pack("<Q", created), OFFSET_CREATED_AT)
                os.fsync(fp.fileno())
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            # A file system without hard links: check, then rename (a narrow race remains).
            if os.path.lexists(final):
                created += 1
                with open(tmp, "r+b") as fp:
                    os.pwrite(fp.fileno(), struct.pack("<Q", created), OFFSET_CREATED_AT)
                continue
            os.replace(tmp, final)
            return final, created
        os.unlink(tmp)
        return final, created
    raise FileExistsError(f"no free name after {MAX_NAME_BUMPS} creation times from {created - MAX_NAME_BUMPS}")


def fsync_dir(directory: Path) -> None:
    # Makes a rename durable; some file systems refuse fsync on a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def describe_failure(exc: Exception) -> str:
    """One line for a failed save."""
    if isinstance(exc, PayloadSizeError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"disk full (ENOSPC): {exc.strerror or exc}"
    if isinstance(exc, OSError):
        return f"write failed: {exc.strerror or exc}"
    return f"payload writer failed: {type(exc).__name__}: {exc}"


def write_header_fields(path: Path, *, hits: int | None = None, last_used: int | None = None,
                        ext_flags: Callable[[int], int] | None = None) -> bool:
    """Rewrite header fields in place (the only in-place writes of the format).

    Only a regular file is opened, never through a symlink: a link named like a
    cache file must not make ds4tui write into its target outside the directory."""
    try:
        # Under the header lock, the name re-checked: a write into a file that another
        # process has just unlinked or replaced would report a pin that holds nothing.
        with locked(path, write=True) as fp:
            header = decode_header(fp.read(PREFIX_BYTES))
            fd = fp.fileno()
            if hits is not None:
                os.pwrite(fd, struct.pack("<I", hits & 0xFFFFFFFF), OFFSET_HITS)
            if last_used is not None:
                os.pwrite(fd, struct.pack("<Q", last_used), OFFSET_LAST_USED)
            if ext_flags is not None:
                os.pwrite(fd, bytes([ext_flags(header.ext_flags) & 0xFF]), OFFSET_EXT_FLAGS)
    except (OSError, KvcFormatError):
        return False
    return True


def repair_zeroed_header(path: Path, *, model_id: int, payload_abi: int, fingerprint: bytes) -> bool:
    """Give back a ds4tui file the header bytes a ds4 hit zeroed; True when it was repaired.

    A ds4 hit rewrites the whole header from ds4's own fields, leaving model_id
    (byte 7) and payload_abi (byte 20) at 0. The file is recognized as ours from
    its payload: DSV4 framing whose 32-byte fingerprint (SHA-256 of the model's
    family, config and weights) is the running model's and whose token count is
    the header's. The repair sets bytes 7 and 20 and ds4tui's quant mark (byte
    4, so ds4 leaves the file alone from now on) in one write of bytes 4-20,
    made under the lock every ds4tui header writer takes, with the bytes in
    between re-read under that lock.
    """
    try:
        with locked(path, write=True) as fp:
            head = fp.read(PREFIX_BYTES)
            h = decode_header(head)
            if h.model_id != 0 or h.payload_abi != 0:
                return False
            check_lengths(h, os.fstat(fp.fileno()).st_size)
            if h.payload_bytes < DSV4_HEADER_BYTES + len(fingerprint):
                return False
            fp.seek(PREFIX_BYTES + h.text_bytes)
            payload_head = fp.read(DSV4_HEADER_BYTES + len(fingerprint))
            if payload_head[DSV4_HEADER_BYTES:] != fingerprint:
                return False
            if unpack_dsv4_header(payload_head).token_count != h.tokens:
                return False
            fixed = bytearray(head[OFFSET_QUANT_BITS:OFFSET_PAYLOAD_ABI + 1])
            fixed[0] |= QUANT_DS4TUI_MARK
            fixed[OFFSET_MODEL_ID - OFFSET_QUANT_BITS] = model_id
            fixed[OFFSET_PAYLOAD_ABI - OFFSET_QUANT_BITS] = payload_abi
            os.pwrite(fp.fileno(), bytes(fixed), OFFSET_QUANT_BITS)
            os.fsync(fp.fileno())
    except (OSError, KvcFormatError, ValueError):
        return False
    return True


def read_text(path: str | Path, text_bytes: int) -> bytes | None:
    """The stored text of a file, or None if it vanished, is short, or claims more than any text can be."""
    if text_bytes > MAX_TEXT_BYTES:
        return None
    try:
        with open_regular(path) as fp:
            fp.seek(PREFIX_BYTES)
            text = fp.read(text_bytes)
    except OSError:
        return None
    return text if len(text) == text_bytes else None


def unlink_if_same(path: Path, fp: BinaryIO) -> bool:
    """Delete `path` only if it is still the open file `fp`, unchanged (a writer may have
    replaced or rewritten it), under the header lock."""
    try:
        return remove_checked(path, stat_key(os.fstat(fp.fileno())), keep_pinned=False) is None
    except OSError:
        return False


_TMP_NAME = re.compile(r"^([0-9a-fA-F]{40})\.kv\.tmp\.(\d+)\.[0-9a-f]+$")


@dataclass(frozen=True)
class TempFile:
    """A save in progress (or left behind): `<sha>.kv.tmp.<pid>.<rand>`."""

    name: str
    pid: int
    bytes: int
    mtime: float


def temp_files(directory: Path) -> list[TempFile]:
    """The temp files of saves in `directory` (regular files only)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for name in names:
        if TMP_MARK not in name:
            continue  # most names: no regex for them
        m = _TMP_NAME.match(name)
        if not m:
            continue
        try:
            st = os.lstat(directory / name)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(TempFile(name, int(m.group(2)), st.st_size, st.st_mtime))
    return out


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (signal 0 probes without sending)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def remove_stale_tmp(directory: Path, older_than_s: float) -> list[str]:
    """Remove temp files whose writer is gone (at once) or that are older than `older_than_s`
    (a live PID may be a reused one; a live writer keeps its file's mtime fresh).

    The writer's PID is in the name, so a crash leaves nothing that outlives the next scan."""
    cutoff = time.time() - older_than_s
    removed = []
    for t in temp_files(directory):
        mine = t.pid == os.getpid()
        if (not mine and not pid_alive(t.pid)) or t.mtime < cutoff:
            try:
                os.unlink(directory / t.name)
                removed.append(t.name)
            except OSError:
                pass
    return removed


# Temp files this process is writing: removed at interpreter exit should a save
# thread be cut short (a daemon worker), so a clean exit leaves none behind.
_live_tmp: set[Path] = set()
_live_lock = threading.Lock()


def _track(tmp: Path, live: bool) -> None:
    with _live_lock:
        (_live_tmp.add if live else _live_tmp.discard)(tmp)


@atexit.register
def _remove_live_tmp() -> None:
    with _live_lock:
        left = list(_live_tmp)
    for tmp in left:
        try:
            os.unlink(tmp)
        except OSError:
            pass
