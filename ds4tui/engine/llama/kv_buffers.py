"""The K/V buffers of a llama-family session: their shapes, types and allocation.

Owns the layout every forward, the fused C step and the payload read: per layer
[2 (K, V), Hkv, rows, D], rows = ctx for a global layer and min(W, ctx) for a sliding
layer's ring (a model without sliding layers has them as one [layers, 2, Hkv, ctx, D]
tensor, which the fused C decode step reads); f16 (llama.cpp's default) or f32; zeroed,
in huge pages where the system has them.
"""

from __future__ import annotations

from typing import Union

import torch

from ds4tui.engine.kernels import huge_pages
from ds4tui.engine.llama.config import LlamaConfig

# The K/V types a session can hold ("f16" rounds each row once, when it is written).
KV_DTYPES = {"f16": torch.float16, "f32": torch.float32}
DEFAULT_KV_DTYPE = "f16"

# One [layers, 2, Hkv, ctx, D] tensor (no sliding layers) or one [2, Hkv, rows, D] per layer.
KvBuffers = Union[torch.Tensor, list]


def kv_shapes(cfg: LlamaConfig, ctx: int) -> list[tuple[int, ...]]:
    """Per layer [2, Hkv, rows, D]: rows = ctx for a global layer, min(W, ctx) for a sliding one."""
    ring = min(cfg.sliding_window, ctx) if cfg.sliding_layers else ctx
    return [(2, cfg.num_kv_heads, ring if cfg.is_sliding(i) else ctx, cfg.head_dim) for i in range(cfg.num_layers)]


def kv_torch_dtype(kv_dtype: str) -> torch.dtype:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype {kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")
    return KV_DTYPES[kv_dtype]


def new_kv(cfg: LlamaConfig, ctx: int, kv_dtype: str = DEFAULT_KV_DTYPE) -> KvBuffers:
    """Zero-filled buffers (a zero-policy replay attends to ring rows it has not rebuilt yet),
    in huge pages where the system has them: decode at depth reads them all every token
    (kernels/huge_pages.py)."""
    dtype = kv_torch_dtype(kv_dtype)
    if not cfg.sliding_layers:
        return huge_pages.zeros((cfg.num_layers, 2, cfg.num_kv_heads, ctx, cfg.head_dim), dtype)
    return [huge_pages.zeros(shape, dtype) for shape in kv_shapes(cfg, ctx)]


def kv_bytes(kv: KvBuffers) -> int:
    if isinstance(kv, torch.Tensor):
        return kv.numel() * kv.element_size()
    return sum(t.numel() * t.element_size() for t in kv)


def fits(kv: KvBuffers, cfg: LlamaConfig, ctx: int, dtype: torch.dtype) -> bool:
    """Whether `kv` is a buffer set of these shapes (kv_shapes) and type, each contiguous.
    One tensor is checked whole: iterating it makes a view per layer (torch's unbind, whose
    first call in a process took ~0.2 ms of a disk hit)."""
    if isinstance(kv, torch.Tensor):
        want = (cfg.num_layers, 2, cfg.num_kv_heads, ctx, cfg.head_dim)
        return not cfg.sliding_layers and tuple(kv.shape) == want and kv.dtype == dtype and kv.is_contiguous()
    return ([tuple(t.shape) for t in kv] == kv_shapes(cfg, ctx)
            and all(t.dtype == dtype and t.is_contiguous() for t in kv))
