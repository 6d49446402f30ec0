"""Hand-built KVC files for tests, from the byte layout the README publishes
("KVC file format", "The session payload").

Deliberately not using ds4tui's own encoder: if both sides shared a mistake,
round-trip tests would still pass. Everything here is struct.pack by offset.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

DSV4_MAGIC = 0x34565344


def header_bytes(*, tokens: int, text_bytes: int, payload_bytes: int, quant: int = 4, reason: int = 1,
                 ext: int = 0, model: int = 0, hits: int = 0, ctx: int = 32768, abi: int = 2,
                 created: int = 1_700_000_000, last_used: int = 1_700_000_000,
                 version: int = 1, reserved: bytes = b"\0\0\0") -> bytes:
    """The 48-byte header + u32 text length, byte by byte."""
    out = b"KVC"                                  # 0..2 magic
    out += bytes([version, quant, reason, ext, model])  # 3 version, 4 quant, 5 reason, 6 ext, 7 model
    out += struct.pack("<I", tokens)              # 8
    out += struct.pack("<I", hits)                # 12
    out += struct.pack("<I", ctx)                 # 16
    out += bytes([abi]) + reserved                # 20 ABI, 21..23 reserved
    out += struct.pack("<Q", created)             # 24
    out += struct.pack("<Q", last_used)           # 32
    out += struct.pack("<Q", payload_bytes)       # 40
    assert len(out) == 48
    return out + struct.pack("<I", text_bytes)    # 48


def dsv4_payload(token_count: int, *, body: bytes = b"", ctx: int = 32768) -> bytes:
    """A payload that opens with ds4's 13 u32 fields (magic DSV4 first), then `body`."""
    fields = [DSV4_MAGIC, 1, ctx, 2048, 256, 128, 1024, token_count, 2, 64, 32, 1000, 7]
    return struct.pack("<13I", *fields) + body


def tool_map_trailer(entries: list[tuple[bytes, bytes]]) -> bytes:
    out = b"KTM" + bytes([1]) + struct.pack("<I", len(entries))
    for tool_id, dsml in entries:
        out += struct.pack("<II", len(tool_id), len(dsml)) + tool_id + dsml
    return out


def title_trailer(title: bytes) -> bytes:
    return struct.pack("<I", len(title)) + title


def kv_file(text: bytes, payload: bytes, *, trailers: bytes = b"", **hdr) -> bytes:
    hdr.setdefault("tokens", 1000)
    return header_bytes(text_bytes=len(text), payload_bytes=len(payload), **hdr) + text + payload + trailers


def write_kv(directory: Path, text: bytes, payload: bytes, *, name: str | None = None, **kw) -> Path:
    """Write a file named SHA-1(text).kv (or `name`) and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or hashlib.sha1(text).hexdigest() + ".kv")
    path.write_bytes(kv_file(text, payload, **kw))
    return path


def titled_name(title: bytes, created: int) -> str:
    return hashlib.sha1(title + struct.pack("<Q", created)).hexdigest() + ".kv"
