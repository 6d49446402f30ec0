"""The checksum of a ds4tui file: XXH3-64 over text, payload and the trailers before it.

Owns: hashing a file as it is written (`HashingWriter`), verifying it as it is
restored (`VerifyingReader`: the payload streams through the hash on its way
into the session, so the check costs no second pass over the file), and a
whole-file check for `kv inspect` and the browser (`verify_file`).

Covered bytes are everything from the end of the 52-byte header to the start
of the checksum trailer, in file order. The header is not covered: hits,
last_used and the pin are rewritten in place, and each other field is checked
against the file name, the payload or the engine on load.

Restoring: the engine fills its buffers from the reader, and the reader checks
the digest the moment the last payload byte has been read, before the engine
commits the state (sets its tokens). A mismatch raises `ChecksumMismatch` out
of that read, the engine resets the session to empty (its contract for any
failed load), and the store rejects the file as corrupt. So bytes of a corrupt
file may sit in a session's unused buffer rows, but no session ever holds a
state built from them.
"""

from __future__ import annotations

from typing import BinaryIO

import xxhash

from ds4tui.errors import Ds4tuiError
from ds4tui.format.kvc import PREFIX_BYTES, KvcFile

CHUNK = 1 << 20
# Pieces of one core's L2 (1 MiB here): hashed right after the read that filled them.
# Measured by `ds4tui bench checksum` (4K tokens of SmolLM2) against one read per layer
# and 256 KiB pieces, which cost more syscalls.
READ_PIECE = 1 << 20


class ChecksumMismatch(Ds4tuiError):
    """The bytes read do not hash to the digest the file carries."""


def new_hasher():
    return xxhash.xxh3_64()


def mismatch_reason(got: int, want: int) -> str:
    return f"checksum mismatch: xxh3 {got:016x}, file says {want:016x}"


class HashingWriter:
    """A write-only stream that hashes everything written through it."""

    def __init__(self, fp: BinaryIO, hasher) -> None:
        self._fp = fp
        self._hasher = hasher

    def write(self, data) -> int:
        self._hasher.update(data)
        return self._fp.write(data)

    def tell(self) -> int:
        return self._fp.tell()

    def flush(self) -> None:
        self._fp.flush()


class VerifyingReader:
    """Reads exactly the payload of `kf` from `fp`, hashing it; checks the digest at its end.

    `hasher` has already seen the text. When the payload's last byte has been
    read, the trailers before the checksum (`tail`) are hashed too and the digest
    compared: a mismatch raises ChecksumMismatch from that read. Reads past the
    payload return nothing.
    """

    def __init__(self, fp: BinaryIO, hasher, payload_bytes: int, tail: bytes, expected: int) -> None:
        self._fp = fp
        self._hasher = hasher
        self._left = payload_bytes
        self._tail = tail
        self._expected = expected
        self.verified = False
        if payload_bytes == 0:
            self._finish()

    def _account(self, view) -> None:
        self._hasher.update(view)
        self._left -= len(view)
        if self._left == 0:
            self._finish()

    def _finish(self) -> None:
        self._hasher.update(self._tail)
        got = self._hasher.intdigest()
        if got != self._expected:
            raise ChecksumMismatch(mismatch_reason(got, self._expected))
        self.verified = True

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        if n <= 0:
            return b""
        data = self._fp.read(n)
        if data:
            self._account(data)
        return data

    def readinto(self, buf) -> int:
        """Fill `buf` piece by piece, hashing each piece while it is still in the core's cache
        (hashing a 6.4 MB layer after one big read would fetch it back from L3 or memory)."""
        view = memoryview(buf).cast("B")
        if len(view) > self._left:
            view = view[:self._left]
        done = 0
        while done < len(view):
            got = self._fp.readinto(view[done:done + READ_PIECE])  # type: ignore[attr-defined]  # a binary file
            if not got:
                break
            self._account(view[done:done + got])
            done += got
        return done

    def drain(self) -> None:
        """Hash whatever payload the engine left unread, so the digest is checked all the same."""
        while self._left > 0:
            if not self.read(min(self._left, CHUNK)):
                raise ChecksumMismatch("checksum not verified: the file ended inside the payload")


def covered_tail(fp: BinaryIO, kf: KvcFile) -> bytes:
    """The trailer bytes before the checksum trailer (small: bounded by MAX_TRAILER_BYTES)."""
    start = kf.header.body_bytes
    fp.seek(start)
    return fp.read(kf.checksum_offset - start)


def verify_file(fp: BinaryIO, kf: KvcFile) -> str:
    """"ok", "none" (no checksum trailer) or the mismatch reason, reading the whole file once."""
    if kf.checksum is None:
        return "none"
    h = new_hasher()
    h.update(kf.text)
    tail = covered_tail(fp, kf)
    fp.seek(PREFIX_BYTES + kf.header.text_bytes)
    try:
        VerifyingReader(fp, h, kf.header.payload_bytes, tail, kf.checksum).drain()
    except ChecksumMismatch as exc:
        return str(exc)
    return "ok"
