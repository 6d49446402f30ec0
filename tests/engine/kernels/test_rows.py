"""rows.c: the forward's per-row steps (gated activation, RMSNorm, q/k RoPE) against torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ds4tui.engine.kernels import qgemv
from ds4tui.engine.kernels.rows import glu, qk_rope, rms_norm

pytestmark = pytest.mark.usefixtures("kernels")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows,f", [(1, 24), (23, 1536), (37, 101)])
def test_glu_equals_torchs_activation_times_up_in_every_variant(act, rows, f):
    """act(gate) * up, wide values included (saturating tanh and exp), rows as a strided view."""
    gu = torch.randn(rows, 2 * f + 3, generator=gen(f)) * 4
    gu[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -1e-8])
    gu = gu[:, : 2 * f]
    gate, up = gu[:, :f], gu[:, f:]
    want = (F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")) * up
    for name in qgemv.variants():
        with qgemv.use_variant(name):
            got = glu(gu, act)
        # atol: near x = -5 torch's tanh saturates and its GELU is exactly 0 where the true
        # value (and rows.c's) is ~1e-6.
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), name


@pytest.mark.parametrize("rows,n", [(1, 576), (23, 640), (9, 100)])
def test_rms_norm_equals_torchs_in_every_variant(rows, n):
    x = torch.randn(rows, n + 7, generator=gen(n))[:, :n] * 3  # strided rows
    w = torch.randn(n, generator=gen(1))
    want = F.rms_norm(x, (n,), w, 1e-6)
    for name in qgemv.variants():
        with qgemv.use_variant(name):
            got = rms_norm(x, w, 1e-6)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("heads,d", [(12, 64), (6, 256), (3, 24)])
def test_qk_rope_equals_the_torch_forwards_steps(with_norm, heads, d):
    """RoPE alone is the same operations as the torch code, so the same bits; with the
    per-head norm first (Qwen 3, Gemma 3), equal up to the norm's summation order."""
    s = 19
    x = torch.randn(s, heads * d + 2 * d, generator=gen(d))  # q and k heads, then v columns
    cos, sin = (torch.randn(s, d // 2, generator=gen(k)) for k in (2, 3))
    norm = torch.randn(heads, d, generator=gen(4)) if with_norm else None
    qk = x[:, : heads * d].view(s, heads, d)
    if norm is not None:
        qk = F.rms_norm(qk, (d,), None, 1e-6) * norm
    half = d // 2
    x1, x2 = qk[..., :half], qk[..., half:]
    c, sn = cos.unsqueeze(1), sin.unsqueeze(1)
    want = torch.cat((x1 * c - x2 * sn, x2 * c + x1 * sn), dim=-1)
    for name in qgemv.variants():
        with qgemv.use_variant(name):
            got = qk_rope(x, heads, d, cos, sin, norm, 1e-6)
        assert got.shape == (s, heads, d)
        if norm is None:
            assert torch.equal(got, want), name
        else:
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), name


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError):
        glu(torch.zeros(3, 7), "silu")  # odd width
    with pytest.raises(ValueError):
        glu(torch.zeros(3, 8), "relu")
    with pytest.raises(ValueError):
        rms_norm(torch.zeros(3, 8), torch.ones(7), 1e-6)
    with pytest.raises(ValueError):
        qk_rope(torch.zeros(3, 8), 2, 8, torch.zeros(3, 4), torch.zeros(3, 4))  # 2 heads of 8 need 16 columns
