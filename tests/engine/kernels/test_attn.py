"""attn.c: causal grouped attention of a chunk over KV rows in place, against torch's SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ds4tui.engine.kernels import attn, qgemv

pytestmark = pytest.mark.skipif(qgemv.library() is None, reason="needs the compiled kernels (torch backend here)")

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


def run(case, dtype, seed=0):
    """(C output, reference): a global layer reads every key from the buffer; a windowed one
    reads earlier keys from a ring (slot p % window) and the chunk's own from separate rows."""
    s, hq, hkv, d, pos, window = case
    g = torch.Generator().manual_seed(seed)
    end = pos + s
    k, v = (torch.randn(hkv, end, d, generator=g).to(dtype) for _ in range(2))
    qk = torch.randn(s, hq + hkv, d, generator=g)
    q = qk[:, :hq]  # a view with the key heads' gap, as in the forward
    scale = d ** -0.5
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
    outs = {}
    for name in qgemv.variants():
        with qgemv.use_variant(name):
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

