"""The payload framing shared by ds4 and ds4tui: the "DSV4" header, the fingerprint, ids and ABIs.

A payload opens with 13 little-endian u32 fields (`DSV4_FIELDS`; docs/format.md's
"Session payload" section names them). ds4tui's own payloads, which carry
`DS4TUI_PAYLOAD_ABI` in the KVC header (byte 20), then continue, in every family:

| section | type | size |
|---|---|---|
| header | 13 x u32 | 52 bytes |
| fingerprint | bytes | 32 (SHA-256 of family + config + weights identity) |
| tokens | u32 | token_count |
| logits | f32 | vocab_size (next-token logits) |
| compressed row counts | u32 | layer_count |
| indexer row counts | u32 | layer_count |
| per layer, in order | f32 | the family's sections (engine/<family>/) |

ds4's own payloads (ABI 2, and 0 in files from ds4 versions before the ABI byte) have the
same framing without the fingerprint; ds4tui reads and writes them for a model in ds4's
GGUF with V4 Flash's shape (engine/dsv4/payload.py), and lists them otherwise.
Pure Python on purpose: the cache (which must not import torch) decodes the
header and reads the fingerprint to show files; the engine writes them.
"""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass, fields
from typing import BinaryIO

DSV4_MAGIC = 0x34565344  # b"DSV4" read as a little-endian u32
DSV4_MAGIC_BYTES = b"DSV4"
DSV4_FIELDS = (
    "magic",
    "payload_version",
    "saved_ctx",
    "prefill_chunk",
    "raw_capacity",
    "raw_window",
    "compressed_capacity",
    "token_count",
    "layer_count",
    "head_dim",
    "indexer_head_dim",
    "vocab_size",
    "live_raw_rows",
)
_STRUCT = struct.Struct("<13I")
DSV4_HEADER_BYTES = _STRUCT.size  # 52
# ds4tui payloads: the writing model's identity, right after the DSV4 header.
FINGERPRINT_BYTES = 32

# KVC header byte 20 for payloads written by ds4tui's engine. ds4 itself writes 2;
# a different layout must never be misread, so ours gets a value ds4 will not reach soon.
DS4TUI_PAYLOAD_ABI = 128
DS4_PAYLOAD_ABI = 2

# KVC header byte 7 (model_id). 0 is what ds4 writes for DeepSeek V4 Flash (and what
# old files hold). ds4tui's own families take ids from 0x80 up, outside ds4's range.
MODEL_ID_DS4_FLASH = 0
MODEL_ID_LLAMA = 0x80
MODEL_ID_DSV4_CUSTOM = 0x81


@dataclass(frozen=True)
class Dsv4Header:
    magic: int
    payload_version: int
    saved_ctx: int
    prefill_chunk: int
    raw_capacity: int
    raw_window: int
    compressed_capacity: int
    token_count: int
    layer_count: int
    head_dim: int
    indexer_head_dim: int
    vocab_size: int
    live_raw_rows: int

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


assert tuple(f.name for f in fields(Dsv4Header)) == DSV4_FIELDS


def pack_dsv4_header(header: Dsv4Header) -> bytes:
    return _STRUCT.pack(*astuple(header))


def unpack_dsv4_header(data: bytes) -> Dsv4Header:
    """Decode the first 52 bytes; raises ValueError when too short or the magic is wrong."""
    if len(data) < DSV4_HEADER_BYTES:
        raise ValueError(f"DSV4 header needs {DSV4_HEADER_BYTES} bytes, got {len(data)}")
    header = Dsv4Header(*_STRUCT.unpack_from(data, 0))
    if header.magic != DSV4_MAGIC:
        raise ValueError(f"payload magic is {header.magic:#010x}, not DSV4")
    return header


def framing_bytes(token_count: int, vocab_size: int, layer_count: int, fingerprint: bool = True) -> int:
    """Bytes of a payload's framing: everything but the per-layer sections. `fingerprint`
    False: ds4's own layout (payload ABI 2), which has none."""
    fp_bytes = FINGERPRINT_BYTES if fingerprint else 0
    return DSV4_HEADER_BYTES + fp_bytes + 4 * token_count + 4 * vocab_size + 8 * layer_count


def read_fingerprint(fp: BinaryIO, payload_offset: int, payload_bytes: int) -> bytes | None:
    """The 32-byte model fingerprint of the ds4tui payload at `payload_offset` of an open file,
    or None when the payload is too short to hold one or the file ends first."""
    if payload_bytes < DSV4_HEADER_BYTES + FINGERPRINT_BYTES:
        return None
    fp.seek(payload_offset + DSV4_HEADER_BYTES)
    data = fp.read(FINGERPRINT_BYTES)
    return data if len(data) == FINGERPRINT_BYTES else None
