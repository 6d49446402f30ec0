"""Plain quantizers for the block types gguf-py cannot quantize: Q2_K and IQ2_XXS.

Owns `quantize_q2_k` and `quantize_iq2_xxs` (fp32 [rows, cols] numpy -> uint8 blocks in GGML's
layouts, described in dequant.c). They write synthetic files (tests, the tiny and sliced
DeepSeek V4 GGUFs): valid blocks that round each weight to a nearby representable value, with
no importance weighting and no search over scales, so they are much worse than llama.cpp's
or ds4's quantizers. Real weights keep the file's own blocks. Pure numpy.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def quantize_q2_k(w: np.ndarray) -> np.ndarray:
    """Q2_K: per 16 weights a 4-bit scale and a 4-bit min (offset) of the superblock's d and
    dmin; q = round((w + min) / scale) in 0..3."""
    rows, cols = w.shape
    nb = cols // QK_K
    x = w.astype(np.float32).reshape(rows, nb, 16, 16)
    lo = np.minimum(x.min(-1), 0.0)  # [r, nb, 16]
    scale = (x.max(-1) - lo) / 3.0
    mins = -lo
    d = _f16(scale.max(-1) / 15.0)  # [r, nb]
    dmin = _f16(mins.max(-1) / 15.0)
    df, dmf = d.astype(np.float32)[..., None], dmin.astype(np.float32)[..., None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 15).astype(np.uint8)
    mn = np.clip(np.rint(np.divide(mins, dmf, out=np.zeros_like(mins), where=dmf > 0)), 0, 15).astype(np.uint8)
    step = (df * sc)[..., None]
    off = (dmf * mn)[..., None]
    q = np.clip(np.rint(np.divide(x + off, step, out=np.zeros_like(x), where=step > 0)), 0, 3).astype(np.uint8)
    q = q.reshape(rows, nb, 2, 4, 32)  # element 128h + 32s + l -> bits 2s of byte 32h + l
    qs = (q[:, :, :, 0] | (q[:, :, :, 1] << 2) | (q[:, :, :, 2] << 4) | (q[:, :, :, 3] << 6)).reshape(rows, nb, 64)
    out = np.empty((rows, nb, 84), dtype=np.uint8)
    out[..., :16] = sc | (mn << 4)
    out[..., 16:80] = qs
    out[..., 80:82] = d.view(np.uint8).reshape(rows, nb, 2)
    out[..., 82:84] = dmin.view(np.uint8).reshape(rows, nb, 2)
    return out.reshape(rows, nb * 84)


def _iq2_grid() -> np.ndarray:
    from gguf.quants import IQ2_XXS

    IQ2_XXS.init_grid()
    return np.asarray(IQ2_XXS.grid, dtype=np.float32).reshape(256, 8)


def quantize_iq2_xxs(w: np.ndarray) -> np.ndarray:
    """IQ2_XXS: per 32 weights a scale db = d (0.5 + s) / 4 (s in 0..15); per 8 the codebook
    entry nearest to |w| / db and the signs of w, the smallest weight's sign flipped when
    needed to make the count of negatives even (the format stores 7 signs, the 8th is their
    parity)."""
    grid = _iq2_grid()  # [256, 8], values 8, 25, 43
    rows, cols = w.shape
    nb = cols // QK_K
    x = w.astype(np.float32).reshape(rows, nb, 8, 4, 8)  # [r, block, sub-block, group, weight]
    neg = x < 0
    odd = neg.sum(-1) % 2 == 1
    smallest = np.abs(x).argmin(-1)
    flip = np.zeros_like(neg)
    np.put_along_axis(flip, smallest[..., None], odd[..., None], axis=-1)
    neg ^= flip
    a = np.abs(x)
    db = a.max((-1, -2)) / 43.0  # [r, nb, 8]: the largest weight of a sub-block at the top entry
    d = _f16(db.max(-1) / (15.5 * 0.25))  # [r, nb]
    dfl = d.astype(np.float32)[..., None]
    s = np.clip(np.rint(np.divide(db, dfl * 0.25, out=np.zeros_like(db), where=dfl > 0) - 0.5), 0, 15)
    dbq = (dfl * (0.5 + s) * 0.25)[..., None, None]  # what the format decodes
    t = np.divide(a, dbq, out=np.zeros_like(a), where=dbq > 0).reshape(-1, 8)  # one row per group of 8
    # nearest entry: argmin |t - g|^2 = argmin (|g|^2 - 2 t.g), as a product, in slices
    gg, idx = (grid * grid).sum(1), np.empty(t.shape[0], dtype=np.uint32)
    for i in range(0, t.shape[0], 1 << 16):
        idx[i:i + (1 << 16)] = (gg - 2.0 * (t[i:i + (1 << 16)] @ grid.T)).argmin(1)
    idx = idx.reshape(rows, nb, 8, 4)
    bits = (neg[..., :7].astype(np.uint32) << np.arange(7, dtype=np.uint32)).sum(-1, dtype=np.uint32)
    a0 = (idx << (8 * np.arange(4, dtype=np.uint32))).sum(-1, dtype=np.uint32)
    a1 = (bits << (7 * np.arange(4, dtype=np.uint32))).sum(-1, dtype=np.uint32) | (s.astype(np.uint32) << 28)
    words = np.stack([a0, a1], -1).astype("<u4")  # [r, nb, 8, 2]
    out = np.empty((rows, nb, 66), dtype=np.uint8)
    out[..., :2] = d.view(np.uint8).reshape(rows, nb, 2)
    out[..., 2:] = words.view(np.uint8).reshape(rows, nb, 64)
    return out.reshape(rows, nb * 66)
