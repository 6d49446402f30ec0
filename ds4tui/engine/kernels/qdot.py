"""Integer-dot products of a `QuantMatrix` with 8-bit activations (qdot.c), as ds4's CPU path.

Owns `Q8Matrix`, a `QuantMatrix` whose products take this path (what ds4-mode DSV4 models
bind their Q8_0 and routed-expert matrices as), and `matmul_q8(m, x)`: Y = X W^T with each row of X quantized to Q8_K (Q2_K, IQ2_XXS and
Q4_K weights) or ds4's Q8A (Q8_0 weights, a float scale per 32) and integer block dot
products; `supports(m)` says whether every part of m has such a path; `quantize(x, kind)`
returns the activation blocks themselves (tests compare them with llama.cpp's algorithm).
The numbers differ from the fp32-activation GEMV by the activation's rounding (about 0.4%
of a value per block) and are the same on every ISA. Leaves to qgemv.py: loading the
library, the lock, the thread count and the calling thread's configuration word.
"""

from __future__ import annotations

import ctypes

import torch

from ds4tui.engine.kernels import qgemv

TYPES = ("q2_k", "iq2_xxs", "q4_k", "q8_0")
Q8K, Q8A = 1, 2  # activation kinds (qdot.c)
BLOCK = {Q8K: (256, 292), Q8A: (32, 36)}  # (values, bytes) per activation block
_bound: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL | None:
    global _bound
    lib = qgemv.library()
    if lib is not None and lib is not _bound:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.ds4k_qdot_gemm.argtypes = [ctypes.c_int, p, ctypes.c_int, p, p, i64, i64, ctypes.c_int]
        lib.ds4k_qdot_gemm.restype = ctypes.c_int
        lib.ds4k_qdot_quantize.argtypes = [ctypes.c_int, ctypes.c_int, p, p, i64]
        lib.ds4k_qdot_quantize.restype = ctypes.c_int
        _bound = lib
    return lib


def supports(m: qgemv.QuantMatrix) -> bool:
    return all(qtype in TYPES for qtype, _ in m.parts) and m.cols % (256 if m.qtype != "q8_0" else 32) == 0


def matmul_q8(m: qgemv.QuantMatrix, x: torch.Tensor) -> torch.Tensor:
    """x [n, cols] (or [cols]) float32 -> [n, rows] (or [rows]); RuntimeError without the kernels."""
    lib = _lib()
    if lib is None:
        raise RuntimeError(f"no C kernels for the integer-dot product ({qgemv.backend_reason()})")
    one = x.dim() == 1
    x = x.reshape(-1, m.cols).to(torch.float32).contiguous()
    y = torch.empty((x.shape[0], m.rows), dtype=torch.float32)
    with qgemv.kernel_lock:
        rc = lib.ds4k_qdot_gemm(qgemv.config(), m._mats, len(m.parts), x.data_ptr(), y.data_ptr(), m.cols, x.shape[0],
                                qgemv.num_threads())
    if rc != 0:
        raise RuntimeError(f"ds4k_qdot_gemm rejected a {m.qtype} [{m.rows}, {m.cols}] product")
    return y[0] if one else y


def quantize(x: torch.Tensor, kind: int) -> bytes:
    """The activation blocks of x (float32 [n]) as qdot.c makes them."""
    lib = _lib()
    if lib is None:
        raise RuntimeError("no C kernels")
    values, nbytes = BLOCK[kind]
    x = x.to(torch.float32).contiguous()
    out = ctypes.create_string_buffer(x.numel() // values * nbytes)
    if lib.ds4k_qdot_quantize(qgemv.config(), kind, x.data_ptr(), out, x.numel()) != 0:
        raise ValueError(f"{x.numel()} values are not whole blocks of {values}")
    return out.raw


class Q8Matrix(qgemv.QuantMatrix):
    """A QuantMatrix whose matvec / matmul round the activation to 8 bits and use integer dot
    products (every part's type must be one of TYPES); the fp32-activation path without the
    C kernels."""

    __slots__ = ()

    @classmethod
    def of(cls, m: qgemv.QuantMatrix) -> "Q8Matrix":
        if not supports(m):
            raise ValueError(f"no integer-dot path for a {m.qtype} [{m.rows}, {m.cols}] matrix")
        return cls.from_parts(m.parts, m.cols)

    def matvec(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if _lib() is None:
            return super().matvec(x, out)
        y = matmul_q8(self, x.reshape(-1))
        if out is not None:
            out.view(-1).copy_(y)
            return out
        return y

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if _lib() is None or x.shape[0] == 0:
            return super().matmul(x)
        return matmul_q8(self, x)
