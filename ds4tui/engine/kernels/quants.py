"""Weight types the C kernels read, their block formats, and the reference semantics.

Owns: the type table (our names, GGML ids, block sizes), `row_bytes`, `dequantize` and
`quantize` (both `gguf.quants` itself: the reference the kernels are tested against), and
`QuantMix`, which says which tensors of a file the kernels read as the file's own blocks
and which go through gguf's dequantize to fp32. Leaves to qgemv.py: building and calling
the kernels. Pure Python + numpy: importing this module compiles nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import torch

# name -> (GGML type id, weights per block, bytes per block); ids as in GGML and ds4k.h.
TYPES: dict[str, tuple[int, int, int]] = {
    "f32": (0, 1, 4),
    "f16": (1, 1, 2),
    "bf16": (30, 1, 2),
    "q4_0": (2, 32, 18),
    "q4_1": (3, 32, 20),
    "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24),
    "q8_0": (8, 32, 34),
    "q2_k": (10, 256, 84),
    "q4_k": (12, 256, 144),
    "q5_k": (13, 256, 176),
    "q6_k": (14, 256, 210),
    "iq2_xxs": (16, 256, 66),
}
TYPE_IDS = {name: v[0] for name, v in TYPES.items()}
# Types whose GGUF blocks the kernels read as they are (f32 is read from the fp32 copy).
BLOCK_TYPES = tuple(t for t in TYPES if t != "f32")


def gguf_name(qtype: str) -> str:
    """Our name -> GGML's ("q4_k" -> "Q4_K")."""
    return qtype.upper()


def from_gguf(name: str) -> str | None:
    """GGML's type name -> ours, or None for a type the kernels do not read."""
    ours = name.lower()
    return ours if ours in TYPES else None


def row_bytes(qtype: str, cols: int) -> int:
    """Bytes of one row of `cols` weights; ValueError for another type or a partial block."""
    if qtype not in TYPES:
        raise ValueError(f"unsupported weight type {qtype!r} (have {', '.join(TYPES)})")
    _, qk, bs = TYPES[qtype]
    if cols <= 0 or cols % qk:
        raise ValueError(f"row length {cols} is not a positive multiple of {qk} ({qtype})")
    return cols // qk * bs


def _gguf_type(qtype: str):
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[gguf_name(qtype)]


def dequantize(blocks: torch.Tensor, qtype: str, cols: int) -> torch.Tensor:
    """fp32 [rows, cols] from uint8 blocks [rows, row_bytes]: gguf.quants.dequantize's values."""
    from gguf.quants import dequantize as gguf_dequantize

    rb = row_bytes(qtype, cols)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != rb:
        raise ValueError(f"expected uint8 [rows, {rb}] blocks, got {blocks.dtype} {tuple(blocks.shape)}")
    raw = np.ascontiguousarray(blocks.numpy())
    if qtype in ("f32", "f16"):  # gguf wants these as their own dtype
        raw = raw.view(np.float32 if qtype == "f32" else np.float16)
    out = gguf_dequantize(raw, _gguf_type(qtype))
    return torch.from_numpy(np.array(out, dtype=np.float32, copy=True)).reshape(blocks.shape[0], cols)


def quantize(w: torch.Tensor, qtype: str) -> torch.Tensor:
    """uint8 blocks [rows, row_bytes] for fp32 w [rows, cols], rounded by gguf.quants.quantize
    (tests and tiny models; real weights keep the file's own blocks); Q2_K and IQ2_XXS, which
    gguf cannot quantize, by simple_quants' plain rounding. gguf has no quantizer for the
    other K-quants: NotImplementedError."""
    from gguf.quants import quantize as gguf_quantize

    from ds4tui.engine.kernels.simple_quants import quantize_iq2_xxs, quantize_q2_k

    rows, cols = w.shape
    rb = row_bytes(qtype, cols)
    plain = {"q2_k": quantize_q2_k, "iq2_xxs": quantize_iq2_xxs}.get(qtype)
    if plain is not None:
        return torch.from_numpy(plain(w.detach().float().numpy()))
    out = gguf_quantize(np.ascontiguousarray(w.detach().float().numpy()), _gguf_type(qtype))
    return torch.from_numpy(np.ascontiguousarray(out).view(np.uint8).reshape(rows, rb).copy())


@dataclass(frozen=True)
class QuantMix:
    """GGUF type name -> number of 2-D tensors, split by how the kernels read them.

    fast: the C kernels read the file's blocks (or the fp32 weights, for F32 tensors);
    fallback: gguf dequantizes them to fp32 at conversion, and the kernels read that copy
    (correct, but 3-8x the memory traffic of the blocks)."""

    fast: dict[str, int] = field(default_factory=dict)
    fallback: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line, e.g. "Q4_K x96, Q6_K x13 (C kernels); IQ4_XS x12 (fp32 fallback)"."""
        def part(counts: dict[str, int]) -> str:
            return ", ".join(f"{t} x{n}" for t, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

        parts = []
        if self.fast:
            parts.append(f"{part(self.fast)} (C kernels)")
        if self.fallback:
            parts.append(f"{part(self.fallback)} (fp32 fallback)")
        return "; ".join(parts) or "no weight matrices"

    def as_dict(self) -> dict:
        return {"fast": dict(self.fast), "fallback": dict(self.fallback)}

    @classmethod
    def from_dict(cls, d: dict | None) -> "QuantMix | None":
        if not isinstance(d, dict):
            return None
        try:
            return cls({str(k): int(v) for k, v in d.get("fast", {}).items()},
                       {str(k): int(v) for k, v in d.get("fallback", {}).items()})
        except (TypeError, ValueError, AttributeError):
            return None


def quant_mix(tensors: Iterable[tuple[str, int]]) -> QuantMix:
    """QuantMix of (GGUF type name, row length) pairs, one per 2-D weight tensor: a tensor is
    fast when the kernels read its type and its rows are whole blocks."""
    fast: Counter[str] = Counter()
    fallback: Counter[str] = Counter()
    for name, cols in tensors:
        ours = from_gguf(name)
        ok = ours is not None
        if ok:
            try:
                row_bytes(ours, cols)
            except ValueError:
                ok = False
        (fast if ok else fallback)[name] += 1
    return QuantMix(dict(fast), dict(fallback))
