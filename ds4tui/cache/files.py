"""Low-level file operations of the store: atomic write, in-place header edits, cleanup.

Owns: how bytes reach disk safely. A save goes to `<sha>.kv.tmp.<pid>.<rand>`,
is fsynced and renamed over `<sha>.kv`, then the directory is fsynced, so a
reader sees no file or a whole file, and a crash leaves at most a temp file
(which no scan lists; every scan removes those whose writer's PID is gone, see
`remove_stale_tmp`, and they count toward the budget while they exist). In-place edits touch
only hits/last_used and ext_flags, after checking the file is still KVC.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ds4tui.cache.integrity import HashingWriter, new_hasher
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
    OFFSET_LAST_USED,
    PREFIX_BYTES,
    KvcFormatError,
    KvcHeader,
    check_lengths,
    decode_header,
    encode_checksum,
    encode_header,
)
from ds4tui.cache.safe_open import open_regular
from ds4tui.format.payload import DSV4_HEADER_BYTES, unpack_dsv4_header

WritePayload = Callable[[BinaryIO], Any]
TMP_MARK = ".tmp."


class PayloadSizeError(Exception):
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
            write_payload(fp)
            written = fp.tell() - start
            if written != header.payload_bytes:
                raise PayloadSizeError(f"payload writer wrote {written} bytes, declared {header.payload_bytes}")
            fp.write(tail)
            raw.write(encode_checksum(hasher.intdigest()))
            raw.flush()
            os.fsync(raw.fileno())
        created = header.created_at
        if new_name is None:
            os.replace(tmp, final)
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
        with open_regular(path, write=True) as fp:
            fcntl.flock(fp.fileno(), fcntl.LOCK_EX)  # serializes with other ds4tui header writers
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
        with open_regular(path, write=True) as fp:
            fcntl.flock(fp.fileno(), fcntl.LOCK_EX)
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
    """Delete `path` only if it is still the open file `fp` (a writer may have replaced it)."""
    try:
        if os.lstat(path).st_ino != os.fstat(fp.fileno()).st_ino:
            return False
        os.unlink(path)
        return True
    except FileNotFoundError:
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
