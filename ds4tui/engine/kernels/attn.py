"""Causal grouped-query attention of a chunk over the session's KV rows, in C (attn.c).

Owns: `attend`, the argument checks and the call. Leaves to the caller (the llama
forward): writing the chunk's K/V rows (a global layer's before the call, a sliding
layer's ring after it: the chunk may overwrite ring rows its first queries still read)
and choosing this path (the C library is loaded; otherwise torch's SDPA).
"""

from __future__ import annotations

import torch

from ds4tui.engine.kernels import qgemv

_KV_TYPES = (torch.float32, torch.float16)


def available() -> bool:
    return qgemv.library() is not None


def _rows(t: torch.Tensor, name: str) -> tuple[int, int]:
    """(head stride, row stride) in elements of a [heads, rows, D] tensor with contiguous rows."""
    if t.dim() != 3 or t.stride(2) != 1 or t.dtype not in _KV_TYPES or t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU f32/f16 [heads, rows, D] tensor with contiguous rows")
    return t.stride(0), t.stride(1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, qpos: int, kbase: int,
           k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
           window: int = 0, scale: float) -> torch.Tensor:
    """Attention output [S, Hq * D] (float32) of the queries q [S, Hq, D] at positions
    qpos..qpos+S-1, query head h*G + g reading KV head h.

    Query s sees keys of positions 0..qpos+s (window > 0: only the last `window` of them).
    Keys and values of positions below `kbase` are read from k, v [Hkv, rows, D] at row
    p % rows (a sliding layer's ring; a global layer's context, p < rows); those from kbase
    on from k_new, v_new [Hkv, S', D] at row p - kbase. f32 or f16 rows, one type for all.
    """
    lib = qgemv.library()
    if lib is None:
        raise RuntimeError("the C kernels are not available (torch backend)")
    s, hq, d = q.shape
    hkv, cap, dk = k.shape
    if q.dtype != torch.float32 or q.stride(2) != 1 or q.stride(1) != d:
        raise ValueError("q: expected float32 [S, Hq, D] with contiguous heads")
    if dk != d or tuple(v.shape) != tuple(k.shape) or v.stride() != k.stride() or v.dtype != k.dtype:
        raise ValueError("k, v: expected two [Hkv, rows, D] tensors of one layout")
    hs, rs = _rows(k, "k")
    if rs != d:
        raise ValueError("k, v: rows must be contiguous within a head")
    end = qpos + s
    if not 0 <= kbase <= end or not 0 <= qpos or (kbase > 0 and cap == 0):
        raise ValueError(f"positions: qpos {qpos}, kbase {kbase}, {s} queries")
    if kbase > cap and (window <= 0 or window > cap):
        raise ValueError(f"{cap} buffer rows cannot hold keys below {kbase}")
    hsn = rsn = hsv = rsv = 0
    kn, vn = k, v
    if kbase < end:
        if k_new is None or v_new is None:
            raise ValueError("keys from kbase on need k_new and v_new")
        hsn, rsn = _rows(k_new, "k_new")
        hsv, rsv = _rows(v_new, "v_new")
        for t in (k_new, v_new):
            if t.shape[0] != hkv or t.shape[1] < end - kbase or t.shape[2] != d or t.dtype != k.dtype:
                raise ValueError("k_new, v_new: expected [Hkv, >= S, D] tensors of the buffer's type")
        kn, vn = k_new, v_new
    if hq % hkv:
        raise ValueError(f"{hq} query heads over {hkv} KV heads")
    out = torch.empty(s, hq * d, dtype=torch.float32)
    with qgemv.kernel_lock:
        rc = lib.ds4k_attn(qgemv.config(), q.data_ptr(), q.stride(0), out.data_ptr(), hq * d, k.data_ptr(),
                           v.data_ptr(), hs, cap, kn.data_ptr(), hsn, rsn, vn.data_ptr(), hsv, rsv,
                           int(k.dtype == torch.float16), s, qpos, kbase, window, hq, hkv, d, scale, qgemv.num_threads())
    if rc != 0:
        raise RuntimeError(f"ds4k_attn rejected S={s}, Hq={hq}, Hkv={hkv}, D={d}")
    return out


def supports(head_dim: int) -> bool:
    """Whether attn.c takes this head size (a multiple of 8, at most 256)."""
    return head_dim % 8 == 0 and 0 < head_dim <= 256
