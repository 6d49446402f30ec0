"""attn.c: causal grouped attention of a chunk over KV rows in place, against torch's SDPA.

In fp32 (every variant), and on bf16 pairs where the CPU has AVX512_BF16 (calls whose queries
see 512 keys or more: attn.c's "bf16 at depth")."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ds4tui.engine.kernels import attn, qgemv

pytestmark = pytest.mark.usefixtures("kernels")

# (S, Hq, Hkv, D, first query position, window): a short message after 4K restored tokens
# (several key spans merged), a 512-token chunk from 0 (causal block skipping), a single
# query, Gemma-like heads with a window, a chunk longer than its ring, odd sizes, query blocks
# (of at most 192 rows) that split a position's heads, and windowed blocks of over 64
# positions (some rows see only one key of a key block).
CASES = [
    (23, 9, 3, 64, 4164, 0),
    (96, 9, 3, 64, 0, 0),
    (1, 9, 3, 64, 300, 0),
    (37, 4, 1, 256, 700, 512),
    (130, 6, 2, 64, 1000, 64),
    (5, 8, 2, 32, 3, 0),
    (7, 2, 2, 8, 0, 3),
    (301, 6, 2, 64, 2000, 100),
    (250, 4, 4, 32, 2000, 100),
]


def reference(q, k, v, qpos, window, scale):
    """SDPA with an explicit additive mask over keys 0..T-1 (K/V in float32)."""
    s, hq, d = q.shape
    hkv, t, _ = k.shape
    kk, vv = (x.float().repeat_interleave(hq // hkv, 0) for x in (k, v))
    qp, kp = torch.arange(qpos, qpos + s)[:, None], torch.arange(t)[None]
    ok = (kp <= qp) & ((kp > qp - window) if window else True)
    mask = torch.zeros(s, t).masked_fill(~ok, float("-inf"))
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None].double(), kk[None].double(), vv[None].double(),
                                       attn_mask=mask.double(), scale=scale)[0]
    return o.transpose(0, 1).reshape(s, hq * d).float()


def run(case, dtype, seed=0, make=None, scale=None):
    """(C output, reference): a global layer reads every key from the buffer; a windowed one
    reads earlier keys from a ring (slot p % window) and the chunk's own from separate rows.
    make(shape, generator): the inputs' values (default: standard normal)."""
    s, hq, hkv, d, pos, window = case
    g = torch.Generator().manual_seed(seed)
    make = make or (lambda shape, gen: torch.randn(shape, generator=gen))
    end = pos + s
    k, v = (make((hkv, end, d), g).to(dtype) for _ in range(2))
    qk = make((s, hq + hkv, d), g)
    q = qk[:, :hq]  # a view with the key heads' gap, as in the forward
    scale = d ** -0.5 if scale is None else scale
    if window:
        ring_k, ring_v = (torch.full((hkv, window, d), float("nan"), dtype=dtype) for _ in range(2))
        for p in range(max(0, pos - window + 1), pos):
            ring_k[:, p % window], ring_v[:, p % window] = k[:, p], v[:, p]
        # The new rows as strided views, as the forward passes them.
        k_new = k[:, pos:].transpose(0, 1).contiguous().transpose(0, 1)
        out = attn.attend(q, ring_k, ring_v, qpos=pos, kbase=pos, k_new=k_new, v_new=v[:, pos:], window=window,
                          scale=scale)
    else:
        buf_k, buf_v = (torch.full((hkv, end + 10, d), float("nan"), dtype=dtype) for _ in range(2))
        buf_k[:, :end], buf_v[:, :end] = k, v
        out = attn.attend(q, buf_k, buf_v, qpos=pos, kbase=end, scale=scale)
    return out, reference(q, k, v, pos, window, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_attention_equals_sdpa_in_every_variant(case, dtype):
    """fp32 attention (bf16 off: the deep cases would take bf16 pairs, tested below)."""
    outs = {}
    for name in qgemv.variants():
        with qgemv.use_variant(name), qgemv.use_bf16(False):
            got, want = run(case, dtype)
        assert got.shape == want.shape
        assert torch.isfinite(got).all()
        assert (got - want).abs().max().item() < 2e-6, name
        outs[name] = got
    for name, got in outs.items():  # vector variants against the portable one
        assert (got - outs["scalar"]).abs().max().item() < 1e-6, name


def test_last_query_alone_matches_its_row_of_the_chunk():
    """The forward's last layer asks for the chunk's last query only (qpos = end - 1)."""
    s, hq, hkv, d, pos = 40, 6, 2, 64, 500
    g = torch.Generator().manual_seed(5)
    k, v = (torch.randn(hkv, pos + s, d, generator=g) for _ in range(2))
    q = torch.randn(s, hq, d, generator=g)
    whole = attn.attend(q, k, v, qpos=pos, kbase=pos + s, scale=0.125)
    last = attn.attend(q[-1:], k, v, qpos=pos + s - 1, kbase=pos + s, scale=0.125)
    assert torch.allclose(last[0], whole[-1], atol=1e-6, rtol=0)


# One query with every key in the buffer (a decode step's call; the chunk's last row): (Hq,
# Hkv, D, position, window = the ring's rows, 0: a global layer). Past 1,024 keys (blocks
# double), a ring whose slots have wrapped, a ring not yet full, 16 heads per KV head, and a
# head size that is not a multiple of 8 (the chunk kernel refuses it; the decode kernel,
# which the step runs for every architecture, takes it).
DECODE_CASES = [
    (9, 3, 64, 5000, 0),
    (4, 1, 256, 777, 100),
    (4, 1, 256, 50, 100),
    (16, 1, 64, 300, 0),
    (4, 2, 12, 400, 0),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", DECODE_CASES)
def test_one_query_over_the_buffer_equals_sdpa_in_every_variant(case, dtype):
    hq, hkv, d, pos, window = case
    g = torch.Generator().manual_seed(7)
    k, v = (torch.randn(hkv, pos + 1, d, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(1, hq, d, generator=g)
    if window:  # the ring: position p at slot p % window, the query's own row included
        buf_k, buf_v = (torch.full((hkv, window, d), float("nan"), dtype=dtype) for _ in range(2))
        for p in range(max(0, pos - window + 1), pos + 1):
            buf_k[:, p % window], buf_v[:, p % window] = k[:, p], v[:, p]
    else:
        buf_k, buf_v = k, v
    want = reference(q, k, v, pos, window, d ** -0.5)
    for name in qgemv.variants():
        with qgemv.use_variant(name):
            got = attn.attend(q, buf_k, buf_v, qpos=pos, kbase=pos + 1, window=window, scale=d ** -0.5)
        assert (got - want).abs().max().item() < 2e-6, name


def test_results_do_not_depend_on_the_thread_count():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [run(case, torch.float16, seed=2)[0] for case in CASES[:2]]
        torch.set_num_threads(2)
        two = [run(case, torch.float16, seed=2)[0] for case in CASES[:2]]
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


def test_bad_arguments_are_rejected():
    k = torch.zeros(2, 16, 64)
    q = torch.zeros(3, 4, 64)
    assert attn.attend(q, k, k, qpos=0, kbase=3, scale=1.0).shape == (3, 4 * 64)
    with pytest.raises(ValueError):
        attn.attend(q.double(), k, k, qpos=0, kbase=3, scale=1.0)
    with pytest.raises(ValueError):
        attn.attend(q, k, k, qpos=0, kbase=0, scale=1.0)  # new rows needed but not given
    with pytest.raises(ValueError):
        attn.attend(q, k, k.half(), qpos=0, kbase=3, scale=1.0)  # K and V of different types
    with pytest.raises(ValueError):
        attn.attend(q, k, k, qpos=20, kbase=23, scale=1.0)  # keys beyond the buffer's rows
    with pytest.raises(RuntimeError):
        attn.attend(torch.zeros(3, 4, 12), torch.zeros(2, 16, 12), torch.zeros(2, 16, 12), qpos=0, kbase=3,
                    scale=1.0)  # D not a multiple of 8



# Calls whose query blocks see 512 keys or more (with and without a window), a head size
# whose output tiles have unused dims (96 of 128), an odd key count, several query blocks.
DEEP_CASES = [
    (23, 9, 3, 64, 4164, 0),
    (37, 4, 1, 256, 1700, 1100),
    (7, 4, 2, 96, 1500, 0),
    (300, 9, 3, 64, 1200, 0),
]
needs_bf16 = pytest.mark.usefixtures("bf16_cpu")


def bf16_exact(shape, g):
    """Entries in {-1, 0, 1}, most of them 0: exact in bf16 and f16, and under scale ln 2 (1 in
    base 2) every score is a small integer, so every softmax weight is a power of two, exact
    in bf16 too."""
    signs = torch.randint(-1, 2, shape, generator=g).float()
    keep = torch.rand(shape, generator=g) < 0.3
    return torch.where(keep, signs, torch.zeros(shape))


@needs_bf16
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", DEEP_CASES)
def test_bf16_attention_is_exact_where_bf16_rounds_nothing(case, dtype):
    """On inputs bf16 represents exactly (and weights that are powers of two), the bf16 pairs
    give the fp32 result: the pair layouts, masks, windows and spans are right; only rounding
    can separate the two paths."""
    with qgemv.use_variant("avx512"), qgemv.use_bf16(True):
        got, want = run(case, dtype, seed=4, make=bf16_exact, scale=math.log(2))
    assert torch.isfinite(got).all()
    assert (got - want).abs().max().item() < 2e-6


@needs_bf16
@pytest.mark.parametrize("case", DEEP_CASES)
def test_bf16_attention_stays_within_bf16_rounding(case):
    """On normal inputs the bf16 path differs from fp32 (so it ran) by bf16 rounding only:
    q, k, v and the weights rounded to 8 bits of mantissa, summed in fp32."""
    with qgemv.use_variant("avx512"):
        with qgemv.use_bf16(False):
            fp32, want = run(case, torch.float16, seed=6)
        with qgemv.use_bf16(True):
            bf, _ = run(case, torch.float16, seed=6)
    err = (bf - want).abs().max().item()
    assert err > 1e-5  # the pairs ran
    assert err < 4e-3 * want.abs().max().item() + 1e-3, err
    assert (fp32 - want).abs().max().item() < 2e-6


@needs_bf16
@pytest.mark.parametrize("case,pairs", [
    ((40, 9, 3, 64, 471, 0), False),   # keys 0..510
    ((40, 9, 3, 64, 472, 0), True),    # keys 0..511: 512
    # a window: two query blocks of 32 positions, each seeing 31 + window keys
    ((64, 4, 1, 256, 900, 480), False),
    ((64, 4, 1, 256, 900, 481), True),
])
def test_bf16_attention_starts_at_512_keys(case, pairs):
    """Calls whose query blocks see fewer keys keep their fp32 results bit for bit."""
    with qgemv.use_variant("avx512"):
        with qgemv.use_bf16(False):
            fp32, _ = run(case, torch.float16, seed=8)
        with qgemv.use_bf16(True):
            bf, _ = run(case, torch.float16, seed=8)
    assert torch.equal(fp32, bf) != pairs


@needs_bf16
def test_bf16_attention_does_not_depend_on_the_thread_count():
    before = torch.get_num_threads()
    outs = []
    try:
        with qgemv.use_variant("avx512"), qgemv.use_bf16(True):
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                outs.append([run(case, torch.float16, seed=9)[0] for case in DEEP_CASES[:2]])
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for other in outs[1:] for a, b in zip(outs[0], other))
