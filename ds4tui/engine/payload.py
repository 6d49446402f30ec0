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
from ds4tui.engine.kernels import qgemv

def write_framing(
    fp: BinaryIO,
    header: Dsv4Header,
    fingerprint: bytes | None,
    tokens: Sequence[int],
    logits: torch.Tensor,
    compressed_counts: Sequence[int],
    indexer_counts: Sequence[int],
) -> None:
    """Header, fingerprint, tokens, logits and the per-layer row counts. fingerprint None:
    ds4's own layout (payload ABI 2), which has no fingerprint."""
    if header.magic != DSV4_MAGIC:
        raise ValueError("header magic must be DSV4")
    if fingerprint is not None and len(fingerprint) != FINGERPRINT_BYTES:
        raise ValueError("fingerprint must be 32 bytes")
    if len(tokens) != header.token_count or logits.numel() != header.vocab_size:
        raise ValueError("tokens/logits disagree with the header")
    fp.write(pack_dsv4_header(header))
    if fingerprint is not None:
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
    write_array(fp, t.contiguous().numpy(), what)


def write_array(fp: BinaryIO, a: np.ndarray, what: str) -> None:
    """write_tensor for a contiguous float32 or float16 array (a view of a session's KV buffer:
    written as it lies, no copy)."""
    if a.dtype not in (np.float32, np.float16) or not a.flags.c_contiguous:
        raise ValueError("write_array needs a contiguous float32 or float16 array")
    if a.size == 0:
        return  # e.g. a layer with no compressed rows yet (memoryview cannot cast an empty view)
    check_finite_array(a, what)
    fp.write(memoryview(a).cast("B"))


# The bits of an IEEE float that are NaN or infinity once the sign is ignored: all-ones
# exponent. Per type (the float's width): the threshold seen through the signed view (the
# positive ones) and through the unsigned view (the negative ones, sign bit set).
_NONFINITE_FROM = {
    np.dtype(np.float16): (np.int16, np.uint16, 0x7C00, 0xFC00),
    np.dtype(np.float32): (np.int32, np.uint32, 0x7F800000, 0xFF800000),
    np.dtype(np.float64): (np.int64, np.uint64, 0x7FF0000000000000, 0xFFF0000000000000),
}


def all_finite(a: np.ndarray) -> bool:
    """Whether a float16/32/64 array holds no NaN or infinity, on the calling thread.

    A contiguous f16 or f32 array (a restore's K/V runs) goes through the C kernels' one-pass
    check (kernels/finite.c). Otherwise, or without them: two integer max reductions over its
    bits, no temporary array. Seen as signed integers, a positive NaN or infinity is at or
    above the threshold of an all-ones exponent and every finite positive value below it
    (every negative value is negative); seen as unsigned, the same holds for the negative
    ones (sign bit set). numpy's max runs in SIMD; np.isfinite would write a boolean array
    first (and is scalar code for float16)."""
    signed, unsigned, pos, neg = _NONFINITE_FROM[a.dtype]
    if a.size == 0:
        return True
    if a.dtype.itemsize in (2, 4) and a.flags.c_contiguous:
        ok = qgemv.all_finite(a.ctypes.data, a.size, a.dtype.itemsize)
        if ok is not None:
            return ok
    return not (int(a.view(signed).max()) >= pos or int(a.view(unsigned).max()) >= neg)


def check_finite_array(a: np.ndarray, what: str) -> None:
    if not all_finite(a):
        raise PayloadError(f"payload {what}: NaN or infinite values")


def check_finite(tensor: torch.Tensor, what: str) -> None:
    """PayloadError when a float tensor holds NaN or infinity.

    numpy on the calling thread (all_finite): torch's isfinite splits over OpenMP threads,
    which stall on a busy 2-core host. Types numpy has no view of (bfloat16) go through torch."""
    if not tensor.numel():
        return
    if tensor.dtype not in (torch.float32, torch.float16, torch.float64):
        if not bool(torch.isfinite(tensor).all()):
            raise PayloadError(f"payload {what}: NaN or infinite values")
        return
    check_finite_array(tensor.detach().numpy(), what)  # any strides: all_finite's views keep the item size


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
        """The framing's token ids, each checked to be inside the vocab (the first one that is
        not is named)."""
        ids = np.frombuffer(self.read_bytes(4 * count, "the tokens"), dtype="<u4")
        outside = np.flatnonzero(ids >= vocab_size)
        if outside.size:
            raise PayloadError(f"payload token {int(ids[outside[0]])} is outside the vocab of {vocab_size}")
        return ids.astype(np.int64).tolist()

    def read_into(self, out: torch.Tensor, what: str) -> None:
        """Fill a contiguous float32 or float16 tensor (e.g. a staging buffer of KV rows) in place."""
        if out.dtype not in (torch.float32, torch.float16) or not out.is_contiguous():
            raise ValueError("read_into needs a contiguous float32 or float16 tensor")
        self.read_into_array(out.numpy(), what)

    def read_into_array(self, out: np.ndarray, what: str) -> None:
        """Fill a contiguous float32 or float16 array in place (a view of a session's KV buffer:
        the file's bytes land where they are used, with no copy in between)."""
        if out.dtype not in (np.float32, np.float16) or not out.flags.c_contiguous:
            raise ValueError("read_into_array needs a contiguous float32 or float16 array")
        n = out.nbytes
        self._take(n, what)
        if n == 0:
            return
        got = self._fp.readinto(memoryview(out).cast("B"))
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
