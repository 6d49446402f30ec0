"""DeepSeek V4 rotary embedding: interleaved pairs in the LAST `rope_head_dim` dims of a head.

Owns the two RoPE variants and their application:
- window-only layers: plain RoPE, base `rope_theta` (1e4);
- compressed layers (ratio != 0; queries, raw KV, compressed rows and the
  indexer alike): base `compress_rope_theta` (1.6e5) with YaRN frequency
  interpolation and NO magnitude factor (ds4 cancels it; HF forces
  attention_factor = 1).

Angles are built in float64 from integer absolute positions, so a position gets
the same rotation whether it is computed in a batch or alone (up to the
elementwise cos/sin themselves), then cast to the compute dtype.
"""

from __future__ import annotations

import math

import torch

from ds4tui.engine.dsv4.config import Dsv4Config


def yarn_ramp(rope_dims: int, base: float, original_max: int, beta_fast: float, beta_slow: float) -> torch.Tensor:
    """Per pair i: 0 keeps the original frequency, 1 divides it by the factor (float64 [r/2])."""

    def corr(beta: float) -> float:
        return rope_dims * math.log(original_max / (beta * 2 * math.pi)) / (2 * math.log(base))

    lo = max(0.0, math.floor(corr(beta_fast)))
    hi = min(rope_dims - 1.0, math.ceil(corr(beta_slow)))
    i = torch.arange(rope_dims // 2, dtype=torch.float64)
    return ((i - lo) / max(0.001, hi - lo)).clamp(0.0, 1.0)


class Rope:
    """Frequencies of one RoPE variant; `cos_sin(positions)` gives the rotation per position."""

    def __init__(self, rope_dims: int, base: float, yarn: tuple[float, int, float, float] | None) -> None:
        self.rope_dims = rope_dims
        i = torch.arange(rope_dims // 2, dtype=torch.float64)
        freqs = base ** (-2.0 * i / rope_dims)  # f_i = base^(-2i/r)
        if yarn is not None and yarn[0] > 1.0:
            factor, original_max, beta_fast, beta_slow = yarn
            ramp = yarn_ramp(rope_dims, base, original_max, beta_fast, beta_slow)
            # theta_i = t * f_i * (ramp/factor + 1 - ramp): the high pairs are interpolated.
            freqs = freqs * (ramp / factor + (1.0 - ramp))
        self.freqs = freqs  # float64 [r/2]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: int [n] -> (cos, sin), each [n, r/2] in `dtype`."""
        angles = positions.to(torch.float64)[:, None] * self.freqs[None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)


def layer_ropes(cfg: Dsv4Config) -> tuple[Rope, Rope]:
    """(window-only rope, compressed-layer rope)."""
    main = Rope(cfg.rope_head_dim, cfg.rope_theta, None)
    yarn = (cfg.yarn_factor, cfg.yarn_original_max_position, cfg.yarn_beta_fast, cfg.yarn_beta_slow)
    comp = Rope(cfg.rope_head_dim, cfg.compress_rope_theta, yarn)
    return main, comp


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last r dims of x [n, ..., d] in interleaved pairs; cos/sin are [n, r/2].

    inverse=True rotates by -theta (used on attention outputs, since V = K carried RoPE).
    """
    r = cos.shape[-1] * 2
    extra = x.dim() - 2  # broadcast cos/sin over the head axes between n and d
    shape = (cos.shape[0],) + (1,) * extra + (r // 2,)
    c, s = cos.reshape(shape), sin.reshape(shape)
    if inverse:
        s = -s
    tail = x[..., -r:]
    x0, x1 = tail[..., 0::2], tail[..., 1::2]
    rot = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)  # [.., r/2, 2] -> [.., r]
    return torch.cat([x[..., :-r], rot], dim=-1)
