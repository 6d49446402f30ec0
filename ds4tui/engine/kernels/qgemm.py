"""Small-batch products over the GGUF's raw blocks (qgemm.c): Y[n, rows] = X[n, cols] W^T.

Owns: `make_blocks`, which turns a raw-weights entry into the `QuantMatrix` that
`engine/llama/model.py`'s `Linear` uses for products of up to 256 rows (a short prefill, the 1-row head).
Leaves to the caller: keeping the fp32 weight for everything else and choosing when to
call. Results equal `dequantize(blocks) @ x` up to float summation order (qgemm.c
dequantizes tiles bit-exactly, then multiplies in fp32), except on a CPU with AVX512_BF16
products of 96 rows and more, and Q4_1 ones of 2 and more, which multiply bf16-rounded tiles
(qgemv.bf16_products()).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ds4tui.engine.kernels import qgemv
from ds4tui.engine.kernels.qgemv import Part, QuantMatrix

TYPES = qgemv.quants.BLOCK_TYPES
MAX_COLS = qgemv.GEMM_MAX_COLS


def make_blocks(entry: Part | Sequence[Part] | None, weight: torch.Tensor) -> QuantMatrix | None:
    """The block copy of `weight` [rows, cols] for small-batch products (`.matmul(x)`), or
    None: no entry, a type the kernels do not read, a shape qgemm.c does not take, or no
    compiled library (the torch path then multiplies by `weight`)."""
    if entry is None or qgemv.library() is None:
        return None
    parts = qgemv.as_parts(entry)
    rows, cols = weight.shape
    if any(t not in TYPES for t, _ in parts) or cols % 8 or cols > MAX_COLS:
        return None
    m = QuantMatrix.from_parts(parts, cols)
    if m.rows != rows:
        raise ValueError(f"blocks of {m.rows} rows do not fit a [{rows}, {cols}] weight")
    return m
