"""Integer-dot kernels (qdot.c): the activation rounded to Q8_K / Q8A exactly as llama.cpp's
quantize_row_q8_K_ref and ds4's quantize_q8_0_activation do (written out in numpy here), and
every product equal to gguf.quants' dequantized weights times that rounded activation, up to
the float rounding of one term per block; the same bits on every ISA and for any batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ds4tui.engine.dsv4.slice_blocks import random_rows
from ds4tui.engine.kernels import qdot, qgemv
from ds4tui.engine.kernels.qgemv import QuantMatrix

pytestmark = pytest.mark.skipif(qgemv.library() is None, reason="no C kernels (no compiler)")


def q8k_reference(x: np.ndarray) -> list[tuple[np.float32, np.ndarray, np.ndarray]]:
    """llama.cpp's quantize_row_q8_K_ref: per 256, d = max / -127 (max: the value of largest
    magnitude, first one on ties), q = nearest(x * -127 / max) capped at 127, sums of 16."""
    out = []
    for blk in x.astype(np.float32).reshape(-1, 256):
        i = int(np.argmax(np.abs(blk)))  # first index of the largest magnitude, as the strict `>` scan
        if blk[i] == 0:
            out.append((np.float32(0), np.zeros(256, np.int8), np.zeros(16, np.int16)))
            continue
        iscale = np.float32(-127.0) / blk[i]
        q = np.minimum(np.rint(iscale * blk), 127).astype(np.int8)  # rint: half to even, as lrintf
        out.append((np.float32(1.0) / iscale, q, q.reshape(16, 16).astype(np.int32).sum(1).astype(np.int16)))
    return out


def q8a_reference(x: np.ndarray) -> list[tuple[np.float32, np.ndarray]]:
    """ds4's quantize_q8_0_activation: per 32, d = max|x| / 127 (float), q = rint(x / d)."""
    out = []
    for blk in x.astype(np.float32).reshape(-1, 32):
        d = np.float32(np.abs(blk).max()) / np.float32(127.0)
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        out.append((d, np.clip(np.rint(blk * inv), -128, 127).astype(np.int8)))
    return out


def _parse_q8k(raw: bytes, n: int):
    rec = np.frombuffer(raw, dtype=np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)]), count=n // 256)
    return rec


def _activation(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    x[5] = 0.0
    x[256:512] = 0.0  # an all-zero block
    x[600 % n] = -7.5  # a negative maximum: the scale's sign follows it
    return x


def test_q8k_blocks_are_llama_cpps():
    x = _activation(1024)
    got = _parse_q8k(qdot.quantize(torch.from_numpy(x), qdot.Q8K), 1024)
    for b, (d, q, s) in enumerate(q8k_reference(x)):
        assert got["d"][b] == d and (got["qs"][b] == q).all() and (got["bsums"][b] == s).all(), b


def test_q8a_blocks_are_ds4s():
    x = _activation(1024)
    x[640:672] = 0.0  # an all-zero block of 32
    rec = np.frombuffer(qdot.quantize(torch.from_numpy(x), qdot.Q8A), dtype=np.dtype([("d", "<f4"), ("qs", "i1", 32)]))
    for b, (d, q) in enumerate(q8a_reference(x)):
        assert rec["d"][b] == d and (rec["qs"][b] == q).all(), b


def _weights(qtype: str, rows: int, cols: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype in ("q2_k", "iq2_xxs"):
        return random_rows(rng, qtype.upper(), rows, cols, ("rms", cols ** -0.5))
    if qtype == "q8_0":
        blocks = rng.integers(0, 256, size=(rows, cols // 32, 34), dtype=np.uint8)
        blocks[..., :2] = np.float16(0.01 + rng.random((rows, cols // 32)) * 0.02)[..., None].view(np.uint8)
        blocks[0, 0, 2] = 0x80  # a -128 weight (llama.cpp never writes one; a file may hold it)
        return blocks.reshape(rows, -1)
    blocks = rng.integers(0, 256, size=(rows, cols // 256, 144), dtype=np.uint8)  # Q4_K: any scale bytes
    blocks[..., 0:2] = np.float16(0.01 + rng.random((rows, cols // 256)) * 0.01)[..., None].view(np.uint8)
    blocks[..., 2:4] = np.float16(0.005 + rng.random((rows, cols // 256)) * 0.01)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def _dequant(blocks: np.ndarray, qtype: str) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    return quants.dequantize(blocks, GGMLQuantizationType[qtype.upper()]).astype(np.float64)


def _rounded_x(x: np.ndarray, qtype: str) -> np.ndarray:
    if qtype == "q8_0":
        return np.concatenate([np.float64(d) * q for d, q in q8a_reference(x)])
    return np.concatenate([np.float64(d) * q for d, q, _ in q8k_reference(x)])


@pytest.mark.parametrize("qtype", qdot.TYPES)
def test_products_are_gguf_weights_times_the_rounded_activation(qtype):
    rows, cols, n = 24, 1024, 3
    blocks = _weights(qtype, rows, cols)
    m = QuantMatrix(torch.from_numpy(blocks), qtype, cols)
    xs = np.stack([_activation(cols, seed) for seed in range(n)])
    y = qdot.matmul_q8(m, torch.from_numpy(xs)).double().numpy()
    w = _dequant(blocks, qtype)
    for t in range(n):
        xr = _rounded_x(xs[t], qtype)
        ref = w @ xr
        # the integer sums are exact; each block adds one float32 term, so the error is a few
        # float32 roundings of the largest partial sums
        blocks_per_row = cols // (32 if qtype == "q8_0" else 256)
        tol = (blocks_per_row + 4) * 2.0**-23 * (np.abs(w) @ np.abs(xr))
        assert (np.abs(y[t] - ref) <= tol).all(), (qtype, t, float(np.max(np.abs(y[t] - ref) / tol)))


@pytest.mark.parametrize("qtype", qdot.TYPES)
def test_every_isa_gives_the_same_bits_and_a_batch_equals_its_rows(qtype):
    rows, cols = 40, 2048
    m = QuantMatrix(torch.from_numpy(_weights(qtype, rows, cols, seed=3)), qtype, cols)
    x = torch.from_numpy(np.stack([_activation(cols, s) for s in (4, 5, 6, 7, 8)]))
    results = {}
    for name in qgemv.variants():
        if name == "torch":
            continue
        with qgemv.use_variant(name):
            results[name] = qdot.matmul_q8(m, x)
            singles = torch.stack([qdot.matmul_q8(m, x[t]) for t in range(x.shape[0])])
            assert torch.equal(results[name], singles), name
    assert "scalar" in results and len(results) >= 2  # scalar and this CPU's vector variant
    for name, y in results.items():
        assert torch.equal(y, results["scalar"]), name


def test_parts_of_two_types_stack_by_rows():
    cols = 512
    a, b = _weights("q2_k", 16, cols, seed=9), _weights("iq2_xxs", 20, cols, seed=10)
    fused = QuantMatrix.from_parts([("q2_k", torch.from_numpy(a)), ("iq2_xxs", torch.from_numpy(b))], cols)
    x = torch.from_numpy(_activation(cols, 11))
    y = qdot.matmul_q8(fused, x)
    ya = qdot.matmul_q8(QuantMatrix(torch.from_numpy(a), "q2_k", cols), x)
    yb = qdot.matmul_q8(QuantMatrix(torch.from_numpy(b), "iq2_xxs", cols), x)
    assert torch.equal(y, torch.cat([ya, yb]))


def test_a_type_without_an_integer_path_is_refused():
    m = QuantMatrix(torch.zeros((4, 256), dtype=torch.float16).view(torch.uint8), "f16", 256)
    assert not qdot.supports(m)
    with pytest.raises(RuntimeError, match="rejected"):
        qdot.matmul_q8(m, torch.zeros(256))
