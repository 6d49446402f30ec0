"""The gated FFN's activation in C (glu.c): act(gate) * up over a chunk's gate|up rows.

Owns: `glu`, its checks and the call. Leaves to the caller (the llama forward) choosing
this path (the C library is loaded; otherwise torch's two ops).
"""

from __future__ import annotations

import torch

from ds4tui.engine.kernels import qgemv

ACTS = {"silu": 0, "gelu_tanh": 1}


def glu(gu: torch.Tensor, act: str) -> torch.Tensor:
    """[S, F] = act(gu[:, :F]) * gu[:, F:] for gu float32 [S, 2F] with contiguous rows."""
    lib = qgemv.library()
    if lib is None:
        raise RuntimeError("the C kernels are not available (torch backend)")
    if act not in ACTS:
        raise ValueError(f"activation {act!r}: expected one of {', '.join(ACTS)}")
    if gu.dtype != torch.float32 or gu.dim() != 2 or gu.shape[1] % 2 or gu.stride(1) != 1 or gu.device.type != "cpu":
        raise ValueError(f"gu: expected a CPU float32 [S, 2F] tensor with contiguous rows, got {gu.dtype} {tuple(gu.shape)}")
    rows, f = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(rows, f, dtype=torch.float32)
    with qgemv.kernel_lock:
        rc = lib.ds4k_glu(gu.data_ptr(), gu.stride(0), out.data_ptr(), rows, f, ACTS[act], qgemv.num_threads())
    if rc != 0:
        raise RuntimeError(f"ds4k_glu rejected [{rows}, {2 * f}]")
    return out
