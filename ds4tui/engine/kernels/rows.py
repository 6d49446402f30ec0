"""The llama forward's per-row steps in C (rows.c): gated activation, RMSNorm, q/k RoPE.

Owns: `glu`, `rms_norm` and `qk_rope`, their checks and the calls. Leaves to the caller
(the llama forward) choosing this path (the C library is loaded; otherwise torch's ops).
"""

from __future__ import annotations

import torch

from ds4tui.engine.kernels import qgemv

ACTS = {"silu": 0, "gelu_tanh": 1}


def _lib():
    lib = qgemv.library()
    if lib is None:
        raise RuntimeError("the C kernels are not available (torch backend)")
    return lib


def _rows_of(x: torch.Tensor, name: str) -> None:
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1 or x.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU float32 [rows, n] tensor with contiguous rows, "
                         f"got {x.dtype} {tuple(x.shape)}")


def _vector(w: torch.Tensor, n: int, name: str) -> None:
    if w.dtype != torch.float32 or w.numel() != n or not w.is_contiguous():
        raise ValueError(f"{name}: expected {n} contiguous float32 values")


def glu(gu: torch.Tensor, act: str) -> torch.Tensor:
    """[S, F] = act(gu[:, :F]) * gu[:, F:] for gu float32 [S, 2F] with contiguous rows."""
    lib = _lib()
    if act not in ACTS:
        raise ValueError(f"activation {act!r}: expected one of {', '.join(ACTS)}")
    _rows_of(gu, "gu")
    if gu.shape[1] % 2:
        raise ValueError(f"gu: an even number of columns, got {gu.shape[1]}")
    rows, f = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(rows, f, dtype=torch.float32)
    with qgemv.kernel_lock:
        rc = lib.ds4k_glu(qgemv.config(), gu.data_ptr(), gu.stride(0), out.data_ptr(), rows, f, ACTS[act], qgemv.num_threads())
    if rc != 0:
        raise RuntimeError(f"ds4k_glu rejected [{rows}, {2 * f}]")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.rms_norm(x, (n,), weight, eps) for x float32 [rows, n] (up to summation order)."""
    lib = _lib()
    _rows_of(x, "x")
    rows, n = x.shape
    _vector(weight, n, "weight")
    out = torch.empty(rows, n, dtype=torch.float32)
    with qgemv.kernel_lock:
        rc = lib.ds4k_rms_norm(qgemv.config(), x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), rows, n, eps,
                               qgemv.num_threads())
    if rc != 0:
        raise RuntimeError(f"ds4k_rms_norm rejected [{rows}, {n}]")
    return out


def qk_rope(x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor,
            norm: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """[S, heads, D]: the first heads * D columns of x [S, >= heads * D] as heads, each
    RMS-normalized by its row of `norm` [heads, D] when given (eps), then rotated by RoPE
    (halves: x1 cos - x2 sin, x2 cos + x1 sin) with cos, sin [S, D/2]."""
    lib = _lib()
    _rows_of(x, "x")
    s = x.shape[0]
    if x.shape[1] < heads * head_dim or head_dim % 2:
        raise ValueError(f"x: {x.shape[1]} columns cannot hold {heads} heads of {head_dim}")
    for t, name in ((cos, "cos"), (sin, "sin")):
        if t.dtype != torch.float32 or tuple(t.shape) != (s, head_dim // 2) or not t.is_contiguous():
            raise ValueError(f"{name}: expected contiguous float32 [{s}, {head_dim // 2}]")
    if norm is not None:
        _vector(norm, heads * head_dim, "norm")
    out = torch.empty(s, heads, head_dim, dtype=torch.float32)
    with qgemv.kernel_lock:
        rc = lib.ds4k_qk_rope(qgemv.config(), x.data_ptr(), x.stride(0), None if norm is None else norm.data_ptr(), eps,
                              cos.data_ptr(), sin.data_ptr(), out.data_ptr(), s, heads, head_dim,
                              qgemv.num_threads())
    if rc != 0:
        raise RuntimeError(f"ds4k_qk_rope rejected {heads} heads of {head_dim}")
    return out
