"""Hyper-connections (mHC) of DeepSeek V4, plus the RMSNorm helpers every block uses.

Owns the per-token residual mixing: the residual is `hc_mult` streams X[n, hc, D];
before a sublayer `hc_pre` collapses them (pre weights) and computes the post
gates and the Sinkhorn-normalized mixing matrix M; after it `hc_post` writes
X'[j] = post_j * y + sum_i M[i, j] * X[i] (M transposed: M is not symmetric).
HC state lives only inside one token's pass, so nothing here is session state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ds4tui.engine.dsv4.linear import linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dim, times `weight` when given (None: the unweighted norm)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


@dataclass
class HcWeights:
    fn: torch.Tensor  # [(2 + hc) * hc, hc * D]
    base: torch.Tensor  # [(2 + hc) * hc]
    scale: torch.Tensor  # [3]: pre, post, mixing


@dataclass
class HcHeadWeights:
    fn: torch.Tensor  # [hc, hc * D]
    base: torch.Tensor  # [hc]
    scale: torch.Tensor  # [1]


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """[n, hc, hc] logits -> approximately doubly-stochastic M: a row softmax (+eps), one
    column normalization, then iters-1 rounds of rows-then-columns (ds4's order).

    In numpy, in place: ~120 tiny dependent ops per call, and numpy's per-op overhead
    is a fraction of torch's (this loop was a fifth of decode time in torch)."""
    x = logits.detach().contiguous().numpy()
    add = np.add.reduce  # the ufunc itself: ndarray.sum adds a Python wrapper per call
    m = np.exp(x - np.maximum.reduce(x, axis=-1, keepdims=True))
    m /= add(m, axis=-1, keepdims=True)
    m += eps
    m /= add(m, axis=-2, keepdims=True) + eps
    for _ in range(iters - 1):
        m /= add(m, axis=-1, keepdims=True) + eps
        m /= add(m, axis=-2, keepdims=True) + eps
    return torch.from_numpy(m)


def hc_pre(
    x_hc: torch.Tensor, w: HcWeights, iters: int, hc_eps: float, norm_eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x_hc [n, hc, D] -> (sublayer input [n, D], post [n, hc], M [n, hc, hc])."""
    n, hc, d = x_hc.shape
    flat = rms_norm(x_hc.reshape(n, hc * d), None, norm_eps)  # [n, hc*D]
    mix = linear(flat, w.fn)  # [n, (2+hc)*hc]
    pre = torch.sigmoid(mix[:, :hc] * w.scale[0] + w.base[:hc]) + hc_eps
    post = 2.0 * torch.sigmoid(mix[:, hc : 2 * hc] * w.scale[1] + w.base[hc : 2 * hc])
    logits = (mix[:, 2 * hc :] * w.scale[2] + w.base[2 * hc :]).reshape(n, hc, hc)  # row-major [i, j]
    comb = sinkhorn(logits, iters, hc_eps)
    collapsed = (pre[:, :, None] * x_hc).sum(dim=1)  # [n, D]
    return collapsed, post, comb


def hc_post(y: torch.Tensor, x_hc: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """y [n, D], x_hc [n, hc, D] -> [n, hc, D] = post_j * y + sum_i M[i, j] * X_i."""
    return post[:, :, None] * y[:, None, :] + comb.transpose(1, 2) @ x_hc


def hc_head(x_hc: torch.Tensor, w: HcHeadWeights, hc_eps: float, norm_eps: float) -> torch.Tensor:
    """Final collapse of the streams before the output norm: [n, hc, D] -> [n, D]."""
    n, hc, d = x_hc.shape
    flat = rms_norm(x_hc.reshape(n, hc * d), None, norm_eps)  # [n, hc*D]
    pre = torch.sigmoid(linear(flat, w.fn) * w.scale[0] + w.base) + hc_eps  # [n, hc]
    return (pre[:, :, None] * x_hc).sum(dim=1)
