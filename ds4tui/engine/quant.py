"""Low-precision number formats of DeepSeek V4: checkpoint dequantization and QAT rounding.

Owns two kinds of helpers, all pure torch and vectorized:
- checkpoint formats: FP8 E4M3 weights with one E8M0 (power-of-two) scale per
  128x128 block, and FP4 E2M1 routed-expert weights packed two per byte (low
  nibble first) with one E8M0 scale per 32 inputs; dequantization at load and
  quantization (used to write test checkpoints in the official formats);
- the quantization-aware-training (QAT) round trips the V4 graph applies to
  activations: FP8 KV rows (non-RoPE dims, 64-wide blocks), the indexer's
  Hadamard rotation + FP4 blocks, and f16 cache storage.

Rounding is round-to-nearest with ties to the even mantissa, saturating at the
format's largest finite value, exactly like ds4's CPU reference. It is computed
with frexp/ldexp/round (exact power-of-two arithmetic), so the result does not
depend on the compute dtype's rounding of intermediate steps.
"""

from __future__ import annotations

import math

import torch

FP8_MAX = 448.0  # largest finite E4M3FN value
FP4_MAX = 6.0  # largest E2M1 value
FP8_WEIGHT_BLOCK = 128  # official checkpoints: one scale per 128x128 block
FP4_WEIGHT_BLOCK = 32  # official routed experts: one scale per 32 inputs
KV_FP8_BLOCK = 64  # QAT: KV non-RoPE dims are scaled in blocks of 64
FP4_ACT_BLOCK = 32  # QAT: indexer activations are scaled in blocks of 32
KV_AMAX_FLOOR = 1.0e-4  # ds4: a block whose |max| is below this uses this amax
FP4_AMAX_FLOOR = 7.052966104933725e-38  # ds4: keeps log2 finite for all-zero blocks

# E2M1 magnitudes by 3-bit code; code | 8 is the negative value.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def round_minifloat(x: torch.Tensor, mant_bits: int, min_exp: int, max_val: float) -> torch.Tensor:
    """Round to the nearest value of a sign-magnitude float with `mant_bits` stored mantissa
    bits and smallest normal exponent `min_exp` (subnormals below), saturating at max_val."""
    ax = x.abs().clamp(max=max_val)
    _, e = torch.frexp(ax)  # ax = m * 2**e with m in [0.5, 1), so floor(log2 ax) = e - 1
    e = (e - 1).clamp(min=min_exp)
    step = torch.ldexp(torch.ones_like(ax), (e - mant_bits).to(ax.dtype))
    # ax/step is exact (power-of-two divisor); torch.round breaks ties to even, and the
    # parity of that integer is the parity of the mantissa: ties go to the even mantissa.
    q = torch.round(ax / step) * step
    return torch.copysign(q, x)


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    return round_minifloat(x, 3, -6, FP8_MAX)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    return round_minifloat(x, 1, 0, FP4_MAX)


def pow2_scale(amax: torch.Tensor, fmt_max: float) -> torch.Tensor:
    """The E8M0 scale 2**ceil(log2(amax / fmt_max)): the smallest power of two that brings
    the block's largest magnitude inside the format."""
    exp = torch.ceil(torch.log2(amax / fmt_max))
    return torch.ldexp(torch.ones_like(amax), exp)


# -- QAT round trips (activations) ---------------------------------------------------------


def fp8_kv_qat(x: torch.Tensor, n_rot: int, block: int = KV_FP8_BLOCK) -> torch.Tensor:
    """FP8 round trip of the non-RoPE dims of KV rows x[..., head_dim]; the last n_rot
    (RoPE) dims are left alone."""
    head_dim = x.shape[-1]
    n_nope = head_dim - n_rot
    if n_nope % block:
        raise ValueError(f"KV non-RoPE width {n_nope} is not a multiple of the FP8 block {block}")
    nope = x[..., :n_nope].reshape(*x.shape[:-1], n_nope // block, block)  # [..., blocks, block]
    amax = nope.abs().amax(dim=-1, keepdim=True).clamp(min=KV_AMAX_FLOOR)
    scale = pow2_scale(amax, FP8_MAX)
    q = round_e4m3((nope / scale).clamp(-FP8_MAX, FP8_MAX)) * scale
    return torch.cat([q.reshape(*x.shape[:-1], n_nope), x[..., n_nope:]], dim=-1)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform over the last dim (a power of two), scaled by 1/sqrt(n)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"Hadamard size {n} is not a power of two")
    lead = x.shape[:-1]
    y = x.reshape(-1, n)
    stride = 1
    while stride < n:
        v = y.reshape(-1, n // (2 * stride), 2, stride)  # [rows, pairs of blocks, a|b, stride]
        a, b = v[:, :, 0], v[:, :, 1]
        y = torch.stack([a + b, a - b], dim=2).reshape(-1, n)
        stride *= 2
    return (y * (1.0 / math.sqrt(n))).reshape(*lead, n)


def fp4_act_qat(x: torch.Tensor, block: int = FP4_ACT_BLOCK) -> torch.Tensor:
    """FP4 (E2M1) round trip in blocks of `block` along the last dim."""
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"FP4 activation width {n} is not a multiple of {block}")
    v = x.reshape(*x.shape[:-1], n // block, block)  # [..., blocks, block]
    amax = v.abs().amax(dim=-1, keepdim=True).clamp(min=FP4_AMAX_FLOOR)
    scale = pow2_scale(amax, FP4_MAX)
    q = round_e2m1((v / scale).clamp(-FP4_MAX, FP4_MAX)) * scale
    return q.reshape(x.shape)


def indexer_qat(x: torch.Tensor) -> torch.Tensor:
    """The indexer's activation simulation: Hadamard rotation, then the FP4 round trip."""
    return fp4_act_qat(hadamard(x))


def f16_round(x: torch.Tensor) -> torch.Tensor:
    """Round through IEEE half precision (how ds4 stores every cached KV row)."""
    return x.to(torch.float16).to(x.dtype)


# -- checkpoint formats (weights) -----------------------------------------------------------


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (float8_e8m0fnu or uint8) to float32 powers of two: 2**(e - 127)."""
    if scale.dtype != torch.uint8:
        scale = scale.view(torch.uint8)
    e = scale.to(torch.int32) - 127
    out = torch.ldexp(torch.ones(scale.shape, dtype=torch.float32), e.to(torch.float32))
    return torch.where(scale == 255, torch.full_like(out, float("nan")), out)


def scale_to_float(scale: torch.Tensor) -> torch.Tensor:
    """Block scales as float32: E8M0 bytes (official checkpoints) or plain floats (HF's
    `weight_scale_inv`, which despite its name multiplies the weight)."""
    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        return e8m0_to_float(scale)
    if scale.is_floating_point():
        return scale.to(torch.float32)
    raise ValueError(f"block scales of dtype {scale.dtype} are not supported")


def float_to_e8m0(scale: torch.Tensor) -> torch.Tensor:
    """Powers of two (float) to E8M0 bytes, as a float8_e8m0fnu tensor."""
    _, e = torch.frexp(scale.to(torch.float64))  # scale = 0.5 * 2**e exactly
    return (e - 1 + 127).clamp(0, 254).to(torch.uint8).view(torch.float8_e8m0fnu)


def _blocked(t: torch.Tensor, block_out: int, block_in: int) -> tuple[torch.Tensor, int, int]:
    """Zero-pad a 2-D tensor to whole blocks; returns (padded [R/bo, bo, C/bi, bi], R, C)."""
    rows, cols = t.shape
    pr, pc = -rows % block_out, -cols % block_in
    if pr or pc:
        t = torch.nn.functional.pad(t, (0, pc, 0, pr))
    r, c = t.shape
    return t.reshape(r // block_out, block_out, c // block_in, block_in), rows, cols


def dequant_fp8_weight(
    weight: torch.Tensor, scale: torch.Tensor, block: int = FP8_WEIGHT_BLOCK
) -> torch.Tensor:
    """FP8 E4M3 weight [out, in] with E8M0 scales [ceil(out/b), ceil(in/b)] -> float32."""
    w = weight.view(torch.float8_e4m3fn).to(torch.float32)
    rows, cols = w.shape
    want = (-(-rows // block), -(-cols // block))
    if tuple(scale.shape) != want:
        raise ValueError(f"FP8 scale shape {tuple(scale.shape)} does not match {want} for weight {tuple(w.shape)}")
    s = scale_to_float(scale)
    blocks, _, _ = _blocked(w, block, block)  # [R/b, b, C/b, b]
    out = blocks * s[:, None, :, None]
    return out.reshape(want[0] * block, want[1] * block)[:rows, :cols].contiguous()


def quant_fp8_weight(w: torch.Tensor, block: int = FP8_WEIGHT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """float [out, in] -> (float8_e4m3fn weight, float8_e8m0fnu block scales)."""
    w = w.to(torch.float32)
    blocks, rows, cols = _blocked(w, block, block)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=2.0**-120)  # [R/b, C/b]
    scale = pow2_scale(amax, FP8_MAX)
    q = round_e4m3((blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX))
    q = q.reshape(blocks.shape[0] * block, blocks.shape[2] * block)[:rows, :cols].contiguous()
    return q.to(torch.float8_e4m3fn), float_to_e8m0(scale)


def dequant_fp4_weight(packed: torch.Tensor, scale: torch.Tensor, block: int = FP4_WEIGHT_BLOCK) -> torch.Tensor:
    """Packed FP4 E2M1 weight int8 [out, in/2] (low nibble = even input) with E8M0 scales
    [out, in/block] -> float32 [out, in]."""
    p = packed.view(torch.uint8)
    rows, half = p.shape
    cols = 2 * half
    if cols % block or tuple(scale.shape) != (rows, cols // block):
        raise ValueError(f"FP4 scale shape {tuple(scale.shape)} does not match weight [{rows}, {cols}]")
    table = torch.tensor(FP4_VALUES + tuple(-v for v in FP4_VALUES), dtype=torch.float32)
    codes = torch.stack([p & 0x0F, p >> 4], dim=-1).reshape(rows, cols)  # [out, in], nibble order
    vals = table[codes.long()].reshape(rows, cols // block, block)  # [out, blocks, block]
    return (vals * scale_to_float(scale)[:, :, None]).reshape(rows, cols)


def quant_fp4_weight(w: torch.Tensor, block: int = FP4_WEIGHT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """float [out, in] -> (int8 packed [out, in/2], float8_e8m0fnu scales [out, in/block])."""
    rows, cols = w.shape
    if cols % block:
        raise ValueError(f"FP4 input width {cols} is not a multiple of {block}")
    v = w.to(torch.float32).reshape(rows, cols // block, block)  # [out, blocks, block]
    amax = v.abs().amax(dim=-1).clamp(min=2.0**-120)
    scale = pow2_scale(amax, FP4_MAX)
    q = round_e2m1((v / scale[:, :, None]).clamp(-FP4_MAX, FP4_MAX)).reshape(rows, cols)
    mags = torch.tensor(FP4_VALUES, dtype=torch.float32)
    code = torch.searchsorted(mags, q.abs()).to(torch.uint8) | ((q < 0).to(torch.uint8) << 3)
    pairs = code.reshape(rows, cols // 2, 2)  # [out, in/2, (even, odd)]
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)
    return packed.view(torch.int8), float_to_e8m0(scale)
