"""Loading a cache file into a session: the validation chain, in docs/format.md's order.

Owns: `load_first` (the first of a lookup's candidates that passes, else a Miss that
says why), `load_path` (one file: open it as a regular file, validate, stream the
payload to the caller's `load_payload` (told the file's text first when it is a
`LoadWithText`), count the hit), the checks themselves
(`validate`: magic and ABI -> model -> name hash -> byte prefix -> payload token
count -> checksum) and `payload_stream`, the payload read through its checksum.
A file proven corrupt is deleted unless it is a titled session or the name now
points at another file; a file that is intact but not loadable here is left alone.
Leaves to the caller what a payload means (an opaque stream of `payload_bytes`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ds4tui.cache import files
from ds4tui.cache.entry import NOT_LOADABLE, Acceptor, KvEntry, is_foreign_version
from ds4tui.cache.events import Hit, Miss, Rejected
from ds4tui.cache.integrity import ChecksumMismatch, VerifyingReader, covered_tail, new_hasher
from ds4tui.cache.listing import CacheDirectory
from ds4tui.cache.safe_open import NotRegularFile, open_regular
from ds4tui.errors import Ds4tuiError
from ds4tui.format.kvc import (
    EXT_SESSION_TITLE,
    OFFSET_EXT_FLAGS,
    PREFIX_BYTES,
    KvcFile,
    KvcFormatError,
    decode_header,
    read_kvc,
)


class LoadWithText:
    """A payload loader that is also told the text the file stores (its bytes), once every check
    before the payload has passed: `load(stream, nbytes, text)`. The chat's loader uses it
    to tokenize the rest of its prompt after that text, so the session can run it
    while the payload is still being read."""

    def __init__(self, load: Callable[[BinaryIO, int, bytes], int | None]) -> None:
        self.load = load


# (stream, nbytes) -> the number of tokens it restored, or None when it cannot tell; or a
# LoadWithText.
LoadPayload = Callable[[BinaryIO, int], int | None] | LoadWithText


@dataclass(frozen=True)
class LoadResult:
    """`event` is the Hit or the Miss; `events` every step (rejections first)."""

    event: Hit | Miss
    events: tuple
    tool_map: tuple | None = None

    @property
    def hit(self) -> Hit | None:
        return self.event if isinstance(self.event, Hit) else None


class Reject(Ds4tuiError):
    """A file failed a check; `corrupt` says whether it may be deleted for it."""

    def __init__(self, reason: str, corrupt: bool):
        super().__init__(reason)
        self.reason, self.corrupt = reason, corrupt


def missed(reason: str, events: list | tuple = ()) -> LoadResult:
    miss = Miss(reason)
    return LoadResult(miss, tuple(events) + (miss,))


def load_first(directory: CacheDirectory, candidates: list[KvEntry], prompt: bytes, acceptor: Acceptor,
               load_payload: LoadPayload) -> LoadResult:
    """Restore the first candidate (the lookup's order: longest first) that passes every check."""
    events: list = []
    for e in candidates:
        result = load_path(directory, Path(e.path), e.sha, prompt, acceptor, load_payload, events)
        if result is not None:
            return result
    if not candidates:
        return missed("no cached prefix of this prompt", events)
    return missed(f"{len(candidates)} candidate(s) rejected", events)


def load_named(directory: CacheDirectory, sha: str, prompt: bytes | None, acceptor: Acceptor,
               load_payload: LoadPayload) -> LoadResult:
    """Restore the file named `sha`; a Miss carries the reason it was rejected."""
    events: list = []
    result = load_path(directory, directory.path_for(sha), sha, prompt, acceptor, load_payload, events)
    if result is not None:
        return result
    return missed(events[-1].reason if events else "file not found", events)


def load_path(directory: CacheDirectory, path: Path, sha: str, prompt: bytes | None, acceptor: Acceptor,
              load_payload: LoadPayload, events: list) -> LoadResult | None:
    """Restore one file; None (with a Rejected appended to `events`, unless it had vanished) when it fails."""
    t0 = time.perf_counter()
    try:
        fp = open_regular(path)
    except FileNotFoundError:
        return None  # evicted by someone else since the scan
    except OSError as exc:  # a FIFO, directory or link under this name; unreadable
        events.append(Rejected(sha, str(exc) if isinstance(exc, NotRegularFile)
                               else f"cannot read: {exc.strerror or exc}", False))
        return None
    with fp:
        try:
            kf = validate(fp, sha, prompt, acceptor, load_payload)
        except Reject as rej:
            # A titled session is someone's conversation: even corrupt, it stays (listed
            # with its reason) until they delete it. Untitled checkpoints are only a cache.
            deleted = rej.corrupt and not _titled(fp) and files.unlink_if_same(path, fp)
            events.append(Rejected(sha, rej.reason, deleted))
            return None
    h = kf.header
    files.write_header_fields(path, hits=h.hits + 1, last_used=int(directory.now()))
    hit = Hit(sha=sha, path=str(path), reason=h.reason, tokens=h.tokens, text_bytes=h.text_bytes,
              bytes=kf.file_bytes, hits=h.hits + 1, ms=(time.perf_counter() - t0) * 1000.0, title=kf.title)
    return LoadResult(hit, tuple(events) + (hit,), kf.tool_map)


def validate(fp: BinaryIO, sha: str, prompt: bytes | None, acceptor: Acceptor,
             load_payload: LoadPayload) -> KvcFile:
    """docs/format.md's load checks, in order: magic and ABI -> model -> name hash -> byte prefix
    -> payload token count. The acceptor runs before anything that could
    call a file corrupt, so a foreign file is never deleted."""
    head = fp.read(PREFIX_BYTES)
    try:
        header = decode_header(head)
    except KvcFormatError as exc:
        foreign = is_foreign_version(head)
        raise Reject(NOT_LOADABLE + str(exc) if foreign else str(exc), corrupt=not foreign) from None
    why = acceptor.why_not(header)
    if why:
        raise Reject(NOT_LOADABLE + why, corrupt=False)
    if header.tokens == 0:
        raise Reject("header says 0 tokens", corrupt=True)
    try:
        kf = read_kvc(fp)
    except KvcFormatError as exc:
        raise Reject(str(exc), corrupt=True) from None
    if kf.identity_sha != sha:
        what = "title identity" if header.titled else "stored text hash"
        raise Reject(f"{what} does not match the file name", corrupt=True)
    if prompt is not None and not prompt.startswith(kf.text):
        raise Reject("cached text is not a byte prefix of the prompt", corrupt=False)
    ph = kf.payload_header
    if ph is not None and ph.token_count != header.tokens:
        raise Reject(f"payload token count {ph.token_count} != header tokens {header.tokens}", corrupt=True)
    try:
        stream = payload_stream(fp, kf)
        if isinstance(load_payload, LoadWithText):
            restored = load_payload.load(stream, header.payload_bytes, kf.text)  # type: ignore[arg-type]  # VerifyingReader reads as a BinaryIO
        else:
            restored = load_payload(stream, header.payload_bytes)  # type: ignore[arg-type]  # likewise
        if isinstance(stream, VerifyingReader) and not stream.verified:
            stream.drain()  # the engine stopped short: the digest is still checked
    except ChecksumMismatch as exc:
        raise Reject(str(exc), corrupt=True) from None
    except Exception as exc:  # the engine's own error: report it, keep the file
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ChecksumMismatch):
            raise Reject(str(cause), corrupt=True) from None
        raise Reject(f"payload load failed: {exc}", corrupt=False) from None
    if isinstance(restored, int) and restored != header.tokens:
        raise Reject(f"payload restored {restored} tokens, header says {header.tokens}", corrupt=True)
    return kf


def payload_stream(fp: BinaryIO, kf: KvcFile) -> BinaryIO | VerifyingReader:
    """The payload of `kf`, positioned at its start; through the checksum when the file has one
    (ChecksumMismatch is raised by the read that completes the payload)."""
    if kf.checksum is None:
        fp.seek(kf.payload_offset)
        return fp
    hasher = new_hasher()
    hasher.update(kf.text)
    tail = covered_tail(fp, kf)
    fp.seek(kf.payload_offset)
    return VerifyingReader(fp, hasher, kf.header.payload_bytes, tail, kf.checksum)


def _titled(fp: BinaryIO) -> bool:
    """Whether the open file's ext_flags carry the session-title bit (False when unreadable)."""
    try:
        fp.seek(OFFSET_EXT_FLAGS)
        flags = fp.read(1)
    except OSError:
        return False
    return bool(flags) and bool(flags[0] & EXT_SESSION_TITLE)
