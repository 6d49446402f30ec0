"""The KVC envelope: byte layout of a `.kv` file, its trailers, names and tables.

Owns: encode/decode of the 48-byte header + u32 text length (docs/format.md, "KVC file
format" > "Header"; `HEADER_FIELDS`), the
reason and ext-flag tables, the `KTM` tool-map trailer (ext bit 0), the
session-title trailer (ext bit 3), the checksum trailer (ext bit 6, ds4tui's;
computed in cache/integrity.py), the length bounds of a header, SHA-1 file naming, the display names of
model ids and payload ABIs, and a peek at the payload's own DSV4 header.

Leaves to callers: the payload itself (opaque bytes, written and read by the
engine), every policy decision (store.py, policy.py) and all file-system work
beyond reading one open stream.

Every parse failure raises `KvcFormatError`, and nothing else: the parser is
fed files from other programs and from disk corruption, so "what went wrong"
must always be one catchable type with a one-line reason.

Where ds4tui extends the format: ext_flags bit 7 marks a pinned file. ds4 does
not define bit 7 and, when it touches a file on a hit, rewrites ext_flags
unchanged, so a pin survives ds4 sharing the directory; flipping one bit in
place also keeps the file name (the SHA-1 of the text) valid.
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
from dataclasses import dataclass, replace
from typing import BinaryIO

from ds4tui.errors import Ds4tuiError
from ds4tui.format.payload import (
    DS4_PAYLOAD_ABI,
    DS4TUI_PAYLOAD_ABI,
    DSV4_HEADER_BYTES,
    DSV4_MAGIC_BYTES,
    MODEL_ID_DS4_FLASH,
    MODEL_ID_DSV4_CUSTOM,
    MODEL_ID_LLAMA,
    Dsv4Header,
    unpack_dsv4_header,
)

MAGIC = b"KVC"
VERSION = 1
FIXED_HEADER_BYTES = 48
# The fixed header plus the u32 text length that always follows it.
PREFIX_BYTES = FIXED_HEADER_BYTES + 4

# The header and text length, field by field: (offset, size in bytes, name), in file
# order. The one declaration of the layout: the struct below, the in-place offsets,
# the cache browser's hex view and docs/format.md's "Header" table are checked against it.
HEADER_FIELDS: tuple[tuple[int, int, str], ...] = (
    (0, 3, "magic"), (3, 1, "version"), (4, 1, "quant_bits"), (5, 1, "reason"),
    (6, 1, "ext_flags"), (7, 1, "model_id"), (8, 4, "tokens"), (12, 4, "hits"),
    (16, 4, "ctx_size"), (20, 1, "payload_abi"), (21, 3, "reserved"),
    (24, 8, "created_at"), (32, 8, "last_used"), (40, 8, "payload_bytes"), (48, 4, "text_bytes"),
)
_FIELD_OFFSETS = {name: offset for offset, _, name in HEADER_FIELDS}
assert all(o == p + s for (p, s, _), (o, _, _) in zip(HEADER_FIELDS, HEADER_FIELDS[1:]))
assert sum(size for _, size, _ in HEADER_FIELDS) == PREFIX_BYTES

# The same fields as struct codes (magic 3s, reserved 3x, u8 B, u32 I, u64 Q).
_HEADER = struct.Struct("<3sBBBBBIIIB3xQQQI")
assert _HEADER.size == PREFIX_BYTES

# Header byte 4: ds4tui sets bit 7 of quant_bits on every file it writes. ds4's
# ds4_kvstore_read_header accepts a file only when quant_bits is 2 or 4, and a
# ds4 hit rewrites the whole header from its own fields (zeroing bytes 7 and 20);
# with the mark no published ds4 reads, rewrites or deletes a ds4tui file.
# The bit count itself is the low 7 bits (`KvcHeader.quant`).
QUANT_DS4TUI_MARK = 0x80

# Byte offsets of the fields rewritten in place (hits/last_used on a hit, the
# pin bit); everything else in a file is written once.
OFFSET_QUANT_BITS = _FIELD_OFFSETS["quant_bits"]  # the ds4tui mark, set by a header repair
OFFSET_EXT_FLAGS = _FIELD_OFFSETS["ext_flags"]
OFFSET_MODEL_ID = _FIELD_OFFSETS["model_id"]  # a header repair (zeroed by a ds4 hit)
OFFSET_HITS = _FIELD_OFFSETS["hits"]
OFFSET_PAYLOAD_ABI = _FIELD_OFFSETS["payload_abi"]  # a header repair (zeroed by a ds4 hit)
OFFSET_CREATED_AT = _FIELD_OFFSETS["created_at"]  # rewritten only in a save's own temp file (a titled name collision)
OFFSET_LAST_USED = _FIELD_OFFSETS["last_used"]

# Save reasons (header byte 5), as in ds4_kvstore.h. A byte above 6 reads as unknown.
REASON_UNKNOWN = 0
REASON_COLD = 1
REASON_CONTINUED = 2
REASON_EVICT = 3
REASON_SHUTDOWN = 4
REASON_AGENT_SYSTEM = 5
REASON_AGENT_SESSION = 6
REASON_NAMES = {
    REASON_UNKNOWN: "unknown",
    REASON_COLD: "cold",
    REASON_CONTINUED: "continued",
    REASON_EVICT: "evict",
    REASON_SHUTDOWN: "shutdown",
    REASON_AGENT_SYSTEM: "agent-system",
    REASON_AGENT_SESSION: "agent-session",
}
REASON_CODES = {name: code for code, name in REASON_NAMES.items()}

# Extension flags (header byte 6). Bits 0-3 are ds4's; bit 7 is ds4tui's pin.
EXT_TOOL_MAP = 1 << 0
EXT_RESPONSES_VISIBLE = 1 << 1
EXT_THINKING_VISIBLE = 1 << 2
EXT_SESSION_TITLE = 1 << 3
EXT_CHECKSUM = 1 << 6
EXT_PINNED = 1 << 7
EXT_FLAG_NAMES = {
    EXT_TOOL_MAP: "tool-map",
    EXT_RESPONSES_VISIBLE: "responses-visible",
    EXT_THINKING_VISIBLE: "thinking-visible",
    EXT_SESSION_TITLE: "session-title",
    EXT_CHECKSUM: "checksum",
    EXT_PINNED: "pinned",
}
# The trailers a writer lays out itself (the pin and the key-kind bits carry no trailer).
EXT_TRAILERS = EXT_TOOL_MAP | EXT_SESSION_TITLE | EXT_CHECKSUM

# Header byte 7. ds4 names only id 0 in its sources (Flash; old files wrote 0
# in this reserved byte, so they read as Flash). ds4tui's ids start at 0x80.
MODEL_NAMES = {
    MODEL_ID_DS4_FLASH: "deepseek-v4-flash",
    MODEL_ID_LLAMA: "ds4tui-llama",
    MODEL_ID_DSV4_CUSTOM: "ds4tui-dsv4",
}

# Header byte 20. Old ds4 builds wrote 0 there (the byte was reserved).
PAYLOAD_ABI_NAMES = {
    0: "ds4 (pre-ABI)",
    DS4_PAYLOAD_ABI: "ds4",
    DS4TUI_PAYLOAD_ABI: "ds4tui",
}

TOOL_MAP_MAGIC = b"KTM"
TOOL_MAP_VERSION = 1
_TOOL_MAP_HEADER = struct.Struct("<3sBI")
# ds4tui's checksum trailer (ext bit 6), always the last trailer: `KXH`, u8 version,
# u64 XXH3-64 of every byte from the end of the header to the trailer's start.
CHECKSUM_MAGIC = b"KXH"
CHECKSUM_VERSION = 1
_CHECKSUM = struct.Struct("<3sBQ")
CHECKSUM_TRAILER_BYTES = _CHECKSUM.size
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Bounds on what a header may claim, checked before anything is read or
# allocated from the claim (a crafted sparse file can claim 4 GiB of text).
# The text renders `tokens` tokens, and no tokenizer has a token of more than
# MAX_TOKEN_BYTES bytes (the longest in common vocabularies are a few hundred
# bytes of whitespace); MAX_TEXT_BYTES caps it outright (16M tokens at 4 bytes).
# Trailers are small (tool ids -> DSML blocks, a title, a checksum); a larger
# tail is certainly not one.
MAX_TOKEN_BYTES = 1024
MAX_TEXT_BYTES = 64 << 20
MAX_TRAILER_BYTES = 16 << 20

_KV_NAME = re.compile(r"^[0-9a-fA-F]{40}\.kv$")


class KvcFormatError(Ds4tuiError, ValueError):
    """A `.kv` file (or byte string) that does not follow the KVC layout."""


def reason_name(code: int) -> str:
    return REASON_NAMES.get(code, "unknown")


def reason_code(name: str) -> int:
    """The byte for a reason name; raises KvcFormatError for a name ds4 does not define."""
    try:
        return REASON_CODES[name]
    except KeyError:
        raise KvcFormatError(f"unknown save reason {name!r}") from None


def ext_flag_names(flags: int) -> list[str]:
    """Names of the set bits, lowest first; bits nobody defined read as `bitN`."""
    return [EXT_FLAG_NAMES.get(1 << bit, f"bit{bit}") for bit in range(8) if flags & (1 << bit)]


def model_name(model_id: int) -> str:
    return MODEL_NAMES.get(model_id, f"model#{model_id}")


def payload_abi_name(abi: int) -> str:
    return PAYLOAD_ABI_NAMES.get(abi, f"abi#{abi}")


@dataclass(frozen=True)
class KvcHeader:
    """The 48-byte fixed header plus the u32 text length that follows it."""

    quant_bits: int
    reason_code: int
    ext_flags: int
    model_id: int
    tokens: int
    hits: int
    ctx_size: int
    payload_abi: int
    created_at: int
    last_used: int
    payload_bytes: int
    text_bytes: int
    version: int = VERSION

    @property
    def reason(self) -> str:
        return reason_name(self.reason_code)

    @property
    def ext_flag_names(self) -> list[str]:
        return ext_flag_names(self.ext_flags)

    @property
    def quant(self) -> int:
        """Quantization bits without ds4tui's mark (bit 7 of the byte)."""
        return self.quant_bits & ~QUANT_DS4TUI_MARK

    @property
    def pinned(self) -> bool:
        return bool(self.ext_flags & EXT_PINNED)

    @property
    def titled(self) -> bool:
        return bool(self.ext_flags & EXT_SESSION_TITLE)

    @property
    def body_bytes(self) -> int:
        """Bytes up to the end of the payload: where the trailers start."""
        return PREFIX_BYTES + self.text_bytes + self.payload_bytes

    def with_(self, **changes) -> KvcHeader:
        return replace(self, **changes)


def encode_header(h: KvcHeader) -> bytes:
    """The first 52 bytes of a file. Reserved bytes 21-23 are written as 0."""
    try:
        return _HEADER.pack(
            MAGIC, h.version, h.quant_bits, h.reason_code, h.ext_flags, h.model_id,
            h.tokens, h.hits, h.ctx_size, h.payload_abi,
            h.created_at, h.last_used, h.payload_bytes, h.text_bytes,
        )
    except struct.error as exc:
        raise KvcFormatError(f"header field out of range: {exc}") from None


def check_lengths(h: KvcHeader, file_bytes: int) -> None:
    """KvcFormatError when the header claims more text or file than the bounds and the file allow.

    Cheap and read-free: every reader calls it before trusting a length."""
    limit = min(h.tokens * MAX_TOKEN_BYTES, MAX_TEXT_BYTES)
    if h.text_bytes > limit:
        raise KvcFormatError(f"text of {h.text_bytes} bytes for {h.tokens} tokens exceeds the bound of {limit}"
                             f" ({MAX_TOKEN_BYTES} bytes a token, {MAX_TEXT_BYTES >> 20} MiB at most)")
    if h.body_bytes > file_bytes:
        raise KvcFormatError(f"truncated file: {file_bytes} bytes, header promises {h.body_bytes}"
                             f" (text {h.text_bytes} + payload {h.payload_bytes})")


def decode_header(data: bytes) -> KvcHeader:
    """Decode the first 52 bytes. Checks only what the layout needs: length, magic, version."""
    if len(data) < PREFIX_BYTES:
        raise KvcFormatError(f"truncated header: {len(data)} of {PREFIX_BYTES} bytes")
    (magic, version, quant, reason, ext, model, tokens, hits, ctx, abi,
     created, last_used, payload_bytes, text_bytes) = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise KvcFormatError(f"bad magic {magic!r}, not a KVC file")
    if version != VERSION:
        raise KvcFormatError(f"KVC version {version}, only version {VERSION} is known")
    return KvcHeader(
        quant_bits=quant, reason_code=reason, ext_flags=ext, model_id=model,
        tokens=tokens, hits=hits, ctx_size=ctx, payload_abi=abi,
        created_at=created, last_used=last_used,
        payload_bytes=payload_bytes, text_bytes=text_bytes, version=version,
    )


@dataclass(frozen=True)
class ToolMapEntry:
    """One `KTM` record: an API tool-call id and the exact DSML text the model sampled."""

    tool_id: bytes
    dsml: bytes


def encode_tool_map(entries: list[ToolMapEntry] | tuple[ToolMapEntry, ...]) -> bytes:
    out = [_TOOL_MAP_HEADER.pack(TOOL_MAP_MAGIC, TOOL_MAP_VERSION, len(entries))]
    for e in entries:
        out.append(struct.pack("<II", len(e.tool_id), len(e.dsml)))
        out.append(e.tool_id)
        out.append(e.dsml)
    return b"".join(out)


def encode_title(title: bytes) -> bytes:
    return _U32.pack(len(title)) + title


def encode_checksum(digest: int) -> bytes:
    return _CHECKSUM.pack(CHECKSUM_MAGIC, CHECKSUM_VERSION, digest)


def trailer_bytes(tool_map=None, title: bytes | None = None) -> bytes:
    """All trailers in ext-flag bit order (tool map, then title), as a save writes them."""
    parts = []
    if tool_map is not None:
        parts.append(encode_tool_map(tool_map))
    if title is not None:
        parts.append(encode_title(title))
    return b"".join(parts)


def text_sha(text: bytes) -> str:
    """File name stem of an untitled checkpoint: SHA-1 of the rendered text prefix."""
    return hashlib.sha1(text).hexdigest()


def title_sha(title: bytes, created_at: int) -> str:
    """File name stem of a titled session: SHA-1(title bytes || created_at u64 LE).

    The name stays the same across re-saves while the transcript grows,
    as long as the caller keeps `created_at`.
    """
    return hashlib.sha1(title + _U64.pack(created_at)).hexdigest()


def sha_from_name(name: str) -> str | None:
    """The lowercase SHA of a `<40 hex>.kv` name, or None for any other name (tmp files included)."""
    if not _KV_NAME.match(name):
        return None
    return name[:40].lower()


def kv_name(sha: str) -> str:
    return f"{sha}.kv"


@dataclass(frozen=True)
class KvcFile:
    """A parsed file: header, text, where the payload lies, the trailers."""

    header: KvcHeader
    text: bytes
    file_bytes: int
    payload_header: Dsv4Header | None
    tool_map: tuple[ToolMapEntry, ...] | None
    title_bytes: bytes | None
    trailer_bytes: int
    extra_bytes: int  # bytes after the known trailers; ds4 ignores them too
    checksum: int | None = None  # the stored XXH3-64 (ext bit 6), None without one
    checksum_offset: int = 0  # where the checksum trailer starts: the end of the covered bytes

    @property
    def payload_offset(self) -> int:
        return PREFIX_BYTES + self.header.text_bytes

    @property
    def title(self) -> str | None:
        if self.title_bytes is None:
            return None
        return self.title_bytes.decode("utf-8", errors="replace")

    @property
    def identity_sha(self) -> str:
        """What the file name must be: the title identity if titled, else the text SHA."""
        if self.header.titled:
            return title_sha(self.title_bytes or b"", self.header.created_at)
        return text_sha(self.text)


def _read_exact(fp: BinaryIO, n: int, what: str) -> bytes:
    data = fp.read(n)
    if len(data) != n:
        raise KvcFormatError(f"truncated {what}: {len(data)} of {n} bytes")
    return data


def decode_payload_header(head: bytes) -> Dsv4Header | None:
    """The payload's DSV4 header when the payload starts with `DSV4`, else None."""
    if not head.startswith(DSV4_MAGIC_BYTES):
        return None
    try:
        return unpack_dsv4_header(head)
    except ValueError as exc:
        raise KvcFormatError(f"bad DSV4 payload header: {exc}") from None


def _parse_tool_map(buf: bytes, pos: int) -> tuple[tuple[ToolMapEntry, ...], int]:
    if len(buf) - pos < _TOOL_MAP_HEADER.size:
        raise KvcFormatError("truncated tool-map trailer header")
    magic, version, count = _TOOL_MAP_HEADER.unpack_from(buf, pos)
    if magic != TOOL_MAP_MAGIC or version != TOOL_MAP_VERSION:
        raise KvcFormatError(f"bad tool-map trailer (magic {magic!r}, version {version})")
    pos += _TOOL_MAP_HEADER.size
    entries = []
    for i in range(count):
        if len(buf) - pos < 8:
            raise KvcFormatError(f"truncated tool-map entry {i} of {count}")
        id_len, dsml_len = struct.unpack_from("<II", buf, pos)
        pos += 8
        if len(buf) - pos < id_len + dsml_len:
            raise KvcFormatError(f"truncated tool-map entry {i} of {count}")
        entries.append(ToolMapEntry(buf[pos:pos + id_len], buf[pos + id_len:pos + id_len + dsml_len]))
        pos += id_len + dsml_len
    return tuple(entries), pos


def _parse_title(buf: bytes, pos: int) -> tuple[bytes, int]:
    if len(buf) - pos < 4:
        raise KvcFormatError("missing session-title trailer")
    (n,) = _U32.unpack_from(buf, pos)
    pos += 4
    if len(buf) - pos < n:
        raise KvcFormatError(f"truncated session-title trailer: {len(buf) - pos} of {n} bytes")
    return buf[pos:pos + n], pos + n


def _parse_checksum(buf: bytes, pos: int) -> tuple[int, int]:
    if len(buf) - pos < _CHECKSUM.size:
        raise KvcFormatError("truncated checksum trailer")
    magic, version, digest = _CHECKSUM.unpack_from(buf, pos)
    if magic != CHECKSUM_MAGIC or version != CHECKSUM_VERSION:
        raise KvcFormatError(f"bad checksum trailer (magic {magic!r}, version {version})")
    return digest, pos + _CHECKSUM.size


def read_kvc(fp: BinaryIO, *, with_trailers: bool = True) -> KvcFile:
    """Parse a seekable stream positioned anywhere; reads the header, the text,
    the first 52 payload bytes and the trailers, never the payload body."""
    try:
        size = fp.seek(0, io.SEEK_END)
        fp.seek(0)
        header = decode_header(fp.read(PREFIX_BYTES))
        check_lengths(header, size)
        text = _read_exact(fp, header.text_bytes, "text")
        head = fp.read(min(header.payload_bytes, DSV4_HEADER_BYTES))
        payload_header = decode_payload_header(head)
        tool_map = title = checksum = None
        end = checksum_at = header.body_bytes
        if with_trailers and header.ext_flags & EXT_TRAILERS:
            tail_len = size - header.body_bytes
            if tail_len > MAX_TRAILER_BYTES:
                raise KvcFormatError(f"{tail_len} bytes after the payload, too many for trailers")
            fp.seek(header.body_bytes)
            tail = fp.read(tail_len)
            pos = 0
            if header.ext_flags & EXT_TOOL_MAP:
                tool_map, pos = _parse_tool_map(tail, pos)
            if header.ext_flags & EXT_SESSION_TITLE:
                title, pos = _parse_title(tail, pos)
            checksum_at = header.body_bytes + pos
            if header.ext_flags & EXT_CHECKSUM:
                checksum, pos = _parse_checksum(tail, pos)
            end = header.body_bytes + pos
    except (OSError, struct.error, OverflowError) as exc:
        # A stream error mid-parse (or a seek past what the OS allows) is still
        # "this file cannot be parsed" to every caller.
        raise KvcFormatError(f"read failed: {exc}") from None
    return KvcFile(
        header=header, text=text, file_bytes=size, payload_header=payload_header,
        tool_map=tool_map, title_bytes=title,
        trailer_bytes=end - header.body_bytes, extra_bytes=size - end,
        checksum=checksum, checksum_offset=checksum_at,
    )


def parse_kvc(data: bytes) -> KvcFile:
    """Parse a whole file held in memory."""
    return read_kvc(io.BytesIO(data))


def build_kvc(header: KvcHeader, text: bytes, payload: bytes, *, tool_map=None,
              title: bytes | None = None, checksum: bool = False) -> bytes:
    """A whole file in memory; text_bytes, payload_bytes and the trailer flags
    follow the arguments. For tests and small tools; the store streams instead."""
    ext = header.ext_flags & ~EXT_TRAILERS
    if tool_map is not None:
        ext |= EXT_TOOL_MAP
    if title is not None:
        ext |= EXT_SESSION_TITLE
    if checksum:
        ext |= EXT_CHECKSUM
    h = header.with_(ext_flags=ext, text_bytes=len(text), payload_bytes=len(payload))
    covered = text + payload + trailer_bytes(tool_map, title)
    if checksum:
        import xxhash

        covered += encode_checksum(xxhash.xxh3_64_intdigest(covered))
    return encode_header(h) + covered
