"""Small-batch products over the GGUF's raw blocks (qgemm.c): Y[n, rows] = X[n, cols] W^T.

Owns: the binding of `ds4k_gemm`, its argument checks, and `QuantLinearBlocks`, the
file-block copy of one weight that `llama.model.Linear` uses for short prefills (engine/llama/model.py's
`_SMALL_ROWS`). Leaves to the caller: keeping the fp32 weight for everything
else and choosing when to call. Results equal `dequantize(blocks) @ x` up to float
summation order; `None` from `make_blocks` means the torch path (no library, other type).
"""

from __future__ import annotations

import ctypes

import torch

from ds4tui.engine.kernels import qgemv

TYPES = ("q4_1", "q8_0")
MAX_COLS = 8192  # qgemm.c's GEMM_MAX_COLS


def _bind(lib: ctypes.CDLL) -> None:
    if getattr(lib, "_ds4k_gemm_bound", False):
        return
    lib.ds4k_gemm.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    lib.ds4k_gemm.restype = ctypes.c_int
    lib._ds4k_gemm_bound = True


class QuantLinearBlocks:
    """One weight [rows, cols] as the file's blocks (uint8 [rows, row_bytes])."""

    __slots__ = ("qtype", "blocks", "rows", "cols", "_lib")

    def __init__(self, qtype: str, blocks: torch.Tensor, rows: int, cols: int, lib: ctypes.CDLL) -> None:
        if blocks.dtype != torch.uint8 or not blocks.is_contiguous() or tuple(blocks.shape) != (rows, qgemv.row_bytes(qtype, cols)):
            raise ValueError(f"{qtype} blocks {tuple(blocks.shape)} do not fit [{rows}, {cols}]")
        _bind(lib)
        self.qtype, self.blocks, self.rows, self.cols, self._lib = qtype, blocks, rows, cols, lib

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, cols] float32 -> [n, rows] float32."""
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.cols:
            raise ValueError(f"x must be float32 [n, {self.cols}], got {x.dtype} {tuple(x.shape)}")
        x = x.contiguous()
        y = torch.empty((x.shape[0], self.rows), dtype=torch.float32)
        with qgemv.kernel_lock:
            rc = self._lib.ds4k_gemm(qgemv.TYPE_IDS[self.qtype], self.blocks.data_ptr(), x.data_ptr(), y.data_ptr(),
                                     self.rows, self.cols, x.shape[0], qgemv.num_threads())
        if rc != 0:
            raise RuntimeError(f"ds4k_gemm rejected a {self.qtype} [{self.rows}, {self.cols}] product")
        return y


def make_blocks(entry: tuple[str, torch.Tensor] | None, weight: torch.Tensor) -> QuantLinearBlocks | None:
    """The block copy of `weight` for small-batch products, or None (torch path)."""
    if entry is None or entry[0] not in TYPES:
        return None
    rows, cols = weight.shape
    if cols % qgemv.QK or cols > MAX_COLS:
        return None
    lib = qgemv.library()
    if lib is None:
        return None
    return QuantLinearBlocks(entry[0], entry[1], rows, cols, lib)
