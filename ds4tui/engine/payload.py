"""Writing and reading a session payload with torch: the framing every family shares.

The layout is ds4tui/format/payload.py's (header, fingerprint, tokens, logits,
per-layer row counts, then the family's per-layer sections). A llama-family
model is the degenerate case: one raw window that covers the whole context
(head_dim = K and V of all KV heads side by side), zero compressed and indexer
rows. This module writes the framing and reads it byte-exact and bounds-checked:
every length is checked against the bytes left before anything is allocated,
and leftover bytes are an error.
"""

from __future__ import annotations

import struct
from typing import BinaryIO, Sequence

import numpy as np
import torch

from ds4tui.format.payload import (
    DSV4_HEADER_BYTES,
    DSV4_MAGIC,
    FINGERPRINT_BYTES,
    Dsv4Header,
    pack_dsv4_header,
    unpack_dsv4_header,
)
from ds4tui.engine.errors import PayloadError

def write_framing(
    fp: BinaryIO,
    header: Dsv4Header,
    fingerprint: bytes,
    tokens: Sequence[int],
    logits: torch.Tensor,
    compressed_counts: Sequence[int],
    indexer_counts: Sequence[int],
) -> None:
    """Header, fingerprint, tokens, logits and the per-layer row counts."""
    if header.magic != DSV4_MAGIC:
        raise ValueError("header magic must be DSV4")
    if len(fingerprint) != FINGERPRINT_BYTES:
        raise ValueError("fingerprint must be 32 bytes")
    if len(tokens) != header.token_count or logits.numel() != header.vocab_size:
        raise ValueError("tokens/logits disagree with the header")
    fp.write(pack_dsv4_header(header))
    fp.write(fingerprint)
    fp.write(np.asarray(tokens, dtype="<u4").tobytes())
    write_tensor(fp, logits, "the logits")
    fp.write(np.asarray(compressed_counts, dtype="<u4").tobytes())
    fp.write(np.asarray(indexer_counts, dtype="<u4").tobytes())


def write_tensor(fp: BinaryIO, tensor: torch.Tensor, what: str = "a section") -> None:
    """Raw little-endian bytes of `tensor` as float32, or as float16 when it is f16 (a llama
    session's f16 KV rows); no copy when already contiguous.

    Refuses (PayloadError) a tensor holding NaN or infinity: such a state is broken,
    and a file written from it would load into the same broken state."""
    t = tensor.detach()
    if t.dtype not in (torch.float32, torch.float16):
        t = t.to(torch.float32)
    t = t.contiguous()
    if t.numel() == 0:
        return  # e.g. a layer with no compressed rows yet (memoryview cannot cast an empty view)
    check_finite(t, what)
    fp.write(memoryview(t.numpy()).cast("B"))


def check_finite(tensor: torch.Tensor, what: str) -> None:
    """PayloadError when a float tensor holds NaN or infinity.

    numpy on the calling thread (0.1 ms for a 6.4 MB layer held in cache): torch's
    isfinite splits over OpenMP threads, which stall on a busy 2-core host. Types numpy
    has no view of (bfloat16) go through torch."""
    if not tensor.numel():
        return
    if tensor.dtype not in (torch.float32, torch.float16, torch.float64):
        if not bool(torch.isfinite(tensor).all()):
            raise PayloadError(f"payload {what}: NaN or infinite values")
        return
    a = tensor.detach().numpy()
    if a.dtype == np.float16:
        # numpy's isfinite on f16 is scalar code; an all-ones exponent (0x7c00) is NaN or inf
        bad = bool(((a.view(np.uint16) & 0x7C00) == 0x7C00).any())
    else:
        bad = not bool(np.isfinite(a).all())
    if bad:
        raise PayloadError(f"payload {what}: NaN or infinite values")


class PayloadReader:
    """Reads exactly `nbytes` from fp; every read is checked against what is left."""

    def __init__(self, fp: BinaryIO, nbytes: int) -> None:
        if nbytes < 0:
            raise PayloadError(f"negative payload size {nbytes}")
        self._fp = fp
        self.remaining = nbytes

    def _take(self, n: int, what: str) -> None:
        if n > self.remaining:
            raise PayloadError(f"payload truncated: {what} needs {n} bytes, {self.remaining} left")
        self.remaining -= n

    def read_bytes(self, n: int, what: str) -> bytes:
        self._take(n, what)
        data = self._fp.read(n)
        if len(data) != n:
            raise PayloadError(f"payload truncated: file ended inside {what}")
        return data

    def read_header(self) -> Dsv4Header:
        try:
            return unpack_dsv4_header(self.read_bytes(DSV4_HEADER_BYTES, "the DSV4 header"))
        except ValueError as exc:
            raise PayloadError(str(exc)) from None

    def read_u32(self, count: int, what: str) -> list[int]:
        data = self.read_bytes(4 * count, what)
        return np.frombuffer(data, dtype="<u4").astype(np.int64).tolist()

    def read_tokens(self, count: int, vocab_size: int) -> list[int]:
        """The framing's token ids, each checked to be inside the vocab."""
        tokens = self.read_u32(count, "the tokens")
        bad = next((x for x in tokens if x >= vocab_size), None)
        if bad is not None:
            raise PayloadError(f"payload token {bad} is outside the vocab of {vocab_size}")
        return tokens

    def read_into(self, out: torch.Tensor, what: str) -> None:
        """Fill a contiguous float32 or float16 tensor (e.g. a staging buffer of KV rows) in place."""
        if out.dtype not in (torch.float32, torch.float16) or not out.is_contiguous():
            raise ValueError("read_into needs a contiguous float32 or float16 tensor")
        n = out.numel() * out.element_size()
        self._take(n, what)
        if n == 0:
            return
        view = memoryview(out.numpy()).cast("B")
        got = self._fp.readinto(view)
        if got != n:
            raise PayloadError(f"payload truncated: file ended inside {what}")

    def read_f32(self, shape: Sequence[int], what: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A new tensor of `shape` (float32, or `dtype` float16) read from the payload."""
        count = 1
        for d in shape:
            count *= int(d)
        size = torch.empty(0, dtype=dtype).element_size()
        self._take(size * count, what)  # bounds first, then allocate
        self.remaining += size * count
        out = torch.empty(tuple(shape), dtype=dtype)
        self.read_into(out, what)
        return out

    def finish(self) -> None:
        if self.remaining:
            raise PayloadError(f"payload has {self.remaining} trailing bytes after the last section")


def check_fingerprint(got: bytes, expected: bytes, model_name: str) -> None:
    if got != expected:
        raise PayloadError(
            f"payload was written by another model or config (fingerprint {got[:6].hex()}..., "
            f"{model_name} is {expected[:6].hex()}...)"
        )


def check_field(header: Dsv4Header, name: str, expected: int) -> None:
    got = getattr(header, name)
    if got != expected:
        raise PayloadError(f"payload {name} is {got}, this session needs {expected}")


def u32(value: int) -> bytes:
    return struct.pack("<I", value)
