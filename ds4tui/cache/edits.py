"""Changes to files already in the cache: count a hit, pin, delete, retitle.

Owns: the only in-place writes (hits/last_used on a hit, ext_flags bit 7 for the
pin), removing one name (never a symlink's target), and retitling a titled
session, which writes a copy under its new name before removing the old one.
Leaves to files.py the byte-level header edits and atomic writes.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from ds4tui.cache import files, loading
from ds4tui.cache.entry import inspect_file
from ds4tui.cache.integrity import ChecksumMismatch
from ds4tui.cache.listing import CacheDirectory
from ds4tui.cache.safe_open import NotRegularFile, open_regular
from ds4tui.format.kvc import (
    EXT_CHECKSUM,
    EXT_PINNED,
    QUANT_DS4TUI_MARK,
    PREFIX_BYTES,
    KvcFormatError,
    read_kvc,
    title_sha,
    trailer_bytes,
)


def touch(directory: CacheDirectory, sha: str) -> bool:
    """Count a hit: hits+1 and last_used=now, in place."""
    path = directory.path_for(sha)
    e = inspect_file(path, acceptor=None, deep=False)
    if e.header is None:
        return False
    return files.write_header_fields(path, hits=e.header.hits + 1, last_used=int(directory.now()))


def set_pinned(directory: CacheDirectory, sha: str, pinned: bool) -> bool:
    """Pin (never evicted) or unpin: ext_flags bit 7, in place."""
    if pinned:
        return files.write_header_fields(directory.path_for(sha), ext_flags=lambda f: f | EXT_PINNED)
    return files.write_header_fields(directory.path_for(sha), ext_flags=lambda f: f & ~EXT_PINNED)


def delete(directory: CacheDirectory, sha: str) -> bool:
    """Remove one name (a symlink itself, never its target); False when already gone.

    Raises OSError for what cannot be removed (a directory under that name, a read-only directory)."""
    path = directory.path_for(sha)
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            raise IsADirectoryError(21, "is a directory, not a cache file", str(path))
        # A cache file goes under its header lock (no pin or hit is being written into it
        # as it goes); a FIFO or link under the name is removed as a name.
        return files.remove_checked(path, keep_pinned=False) is None
    except NotRegularFile:
        pass
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def rename_title(directory: CacheDirectory, sha: str, title: bytes) -> str:
    """`KvStore.rename_title`, with `title` already bytes (see there)."""
    if not title:
        raise ValueError("a title cannot be empty")
    with open_regular(directory.path_for(sha)) as fp:
        try:
            kf = read_kvc(fp)
        except KvcFormatError as exc:
            raise ValueError(f"{sha[:12]}: {exc}") from None
        if not kf.header.titled:
            raise ValueError(f"{sha[:12]} is not a titled session")
        new_sha = title_sha(title, kf.header.created_at)
        if new_sha == sha:
            return sha
        if os.path.lexists(directory.path_for(new_sha)):
            raise ValueError(f"a session with that title and creation time exists ({new_sha[:12]})")

        source = loading.payload_stream(fp, kf)  # a corrupt source must not get a fresh checksum

        def copy_payload(out: BinaryIO) -> None:
            left = kf.header.payload_bytes
            while left:
                chunk = source.read(min(left, 1 << 20))
                if not chunk:
                    raise OSError(f"{sha[:12]} shrank while it was copied")
                out.write(chunk)
                left -= len(chunk)

        # The copy is written as every ds4tui file now is: checksummed and marked for ds4.
        header = kf.header.with_(ext_flags=kf.header.ext_flags | EXT_CHECKSUM,
                                 quant_bits=kf.header.quant_bits | QUANT_DS4TUI_MARK)
        try:
            files.write_atomic(directory.path_for(new_sha), header, kf.text, copy_payload,
                               trailer_bytes(kf.tool_map, title))
        except ChecksumMismatch as exc:
            raise ValueError(f"{sha[:12]}: {exc}") from None
    _carry_pin_and_remove(directory, sha, new_sha)
    return new_sha


def _carry_pin_and_remove(directory: CacheDirectory, old_sha: str, new_sha: str) -> None:
    """Remove the old name of a retitled session, under its lock; a pin set on it while the
    copy was written moves to the copy first."""
    try:
        with files.locked(directory.path_for(old_sha)) as fp:
            if files.pinned_head(fp.read(PREFIX_BYTES)):
                files.write_header_fields(directory.path_for(new_sha), ext_flags=lambda f: f | EXT_PINNED)
            os.unlink(directory.path_for(old_sha))
    except FileNotFoundError:
        pass
