"""A llama-family payload rewritten in the token-major row order that ds4tui wrote before the
head-major one (no KV_HEAD_MAJOR bit; per layer [rows, 2, Hkv, D]): what an old file holds."""

from __future__ import annotations

import numpy as np

from ds4tui.format.payload import unpack_dsv4_header
from ds4tui.format.swa_policy import KV_F16, KV_HEAD_MAJOR

MARKED = (2, 3)  # periodic and zero payloads carry a 16-byte marker block


def as_token_major(data: bytes, cfg) -> bytes:
    h = unpack_dsv4_header(data[:52])
    assert h.payload_version & KV_HEAD_MAJOR, "already token-major"
    itemsize = 2 if h.payload_version & KV_F16 else 4
    code = h.payload_version & 0x3F
    at = 52 + 32 + 4 * h.token_count + 4 * h.vocab_size + 8 * h.layer_count + (16 if code in MARKED else 0)
    out = bytearray(data[:at])
    out[4:8] = (h.payload_version & ~KV_HEAD_MAJOR).to_bytes(4, "little")
    dtype = np.float16 if itemsize == 2 else np.float32
    for layer in range(h.layer_count):
        rows = h.live_raw_rows if cfg.is_sliding(layer) else h.token_count
        n = rows * 2 * cfg.num_kv_heads * cfg.head_dim * itemsize
        block = np.frombuffer(data[at:at + n], dtype=dtype).reshape(2, cfg.num_kv_heads, rows, cfg.head_dim)
        out += block.transpose(2, 0, 1, 3).tobytes()  # [2, Hkv, rows, D] -> [rows, 2, Hkv, D]
        at += n
    assert at == len(data)
    return bytes(out)
