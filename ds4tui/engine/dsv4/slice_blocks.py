"""Seeded random rows of a GGML type, made directly as valid blocks at a chosen RMS.

Owns `random_rows(rng, kind, rows, cols, init)`: the bytes of `rows` rows of `cols` weights
in F32, F16, Q8_0, Q2_K or IQ2_XXS, drawn from a numpy Generator. A true-shape slice holds
~2 GB of routed experts per layer; quantizing float weights to IQ2_XXS (a grid search per
8 weights) would take hours, so the 2-bit types are drawn as blocks instead:
- IQ2_XXS: random grid indices, sign bytes and 4-bit scales (every byte pattern is a valid
  block), one f16 scale per block;
- Q2_K: random 2-bit codes and 4-bit sub-block scales, with each sub-block's min tied to
  its scale (min = 1.5 x scale, dmin = 1.5 x d) so the values d*sc*(q - 1.5) are centred;
- Q8_0: normal values quantized as GGML does (d = max|x| / 127).
Each type's block scale is calibrated once against `gguf.quants` dequantization so the
weights have the requested RMS. Inits: ("normal", mean, std) for floats and Q8_0, ("rms", std)
for the 2-bit types.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

QK_K = 256


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def _iq2_xxs(rng: np.random.Generator, n_blocks: int, d: np.ndarray) -> np.ndarray:
    out = np.empty((n_blocks, 66), np.uint8)
    out[:, :2] = _f16_bytes(d)
    out[:, 2:] = rng.integers(0, 256, size=(n_blocks, 64), dtype=np.uint8)
    return out


def _q2_k(rng: np.random.Generator, n_blocks: int, d: np.ndarray) -> np.ndarray:
    out = np.empty((n_blocks, 84), np.uint8)
    sc = rng.integers(1, 16, size=(n_blocks, 16), dtype=np.uint8)
    out[:, :16] = sc | (sc << 4)  # low nibble: scale, high nibble: min (= the scale)
    out[:, 16:80] = rng.integers(0, 256, size=(n_blocks, 64), dtype=np.uint8)
    out[:, 80:82] = _f16_bytes(d)
    out[:, 82:84] = _f16_bytes(d * 1.5)
    return out


_TWO_BIT = {"IQ2_XXS": _iq2_xxs, "Q2_K": _q2_k}


@lru_cache(maxsize=None)
def unit_rms(kind: str) -> float:
    """RMS of a `kind` block drawn with d = 1 (measured through gguf.quants on 4096 blocks)."""
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(0)
    blocks = _TWO_BIT[kind](rng, 4096, np.ones(4096, np.float32))
    values = quants.dequantize(blocks, GGMLQuantizationType[kind])
    return float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))


def _q8_0(values: np.ndarray) -> np.ndarray:
    rows, cols = values.shape
    blocks = values.reshape(rows, cols // 32, 32)
    d = np.abs(blocks).max(axis=-1) / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint(blocks * inv[..., None]), -127, 127).astype(np.int8)
    out = np.empty((rows, cols // 32, 34), np.uint8)
    out[..., :2] = _f16_bytes(d)
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(rows, -1)


def random_rows(rng: np.random.Generator, kind: str, rows: int, cols: int, init: tuple) -> np.ndarray:
    """`rows` rows of `kind` as a contiguous array (uint8 blocks, or f16/f32/i32 values)."""
    if kind in _TWO_BIT:
        (_, std) = init
        if cols % QK_K:
            raise ValueError(f"{kind} rows hold whole {QK_K}-weight blocks, not {cols}")
        n = rows * cols // QK_K
        # a little spread between blocks, as real scales have
        d = (std / unit_rms(kind)) * rng.uniform(0.75, 1.25, size=n).astype(np.float32)
        return _TWO_BIT[kind](rng, n, d).reshape(rows, -1)
    _, mean, std = init
    values = rng.standard_normal((rows, cols), dtype=np.float32)
    values *= np.float32(std)
    values += np.float32(mean)
    if kind == "F32":
        return values
    if kind == "F16":
        return values.astype(np.float16)
    if kind == "Q8_0":
        return _q8_0(values)
    raise ValueError(f"no random rows for type {kind}")
