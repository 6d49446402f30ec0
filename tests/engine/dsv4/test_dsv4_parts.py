"""DSV4 building blocks against their definitions: sink attention, compressor pooling, RoPE/YaRN,
hyper-connections, MoE routing, QAT rounding, checkpoint number formats, the chat format."""

from __future__ import annotations

import math

import pytest
import torch

from ds4tui.engine import quant
from ds4tui.engine.dsv4.attention import attend
from ds4tui.engine.dsv4.cache import EMPTY_SCORE, CompressorState
from ds4tui.engine.text.dsv4_chat import ASSISTANT, BOS, EOS, SPECIAL_TOKENS, THINK_END, USER, Dsv4ChatTemplate
from ds4tui.engine.dsv4.compressor import CompressorWeights, compress
from ds4tui.engine.dsv4.hc import HcWeights, hc_post, hc_pre, sinkhorn
from ds4tui.engine.dsv4.moe import MoeWeights, moe_forward, route, swiglu
from ds4tui.engine.dsv4.rope import Rope, apply_rope, yarn_ramp
from tests.engine.dsv4.dsv4_helpers import single_thread, tiny  # noqa: F401 (fixture)

G = torch.Generator().manual_seed(0)
D64 = torch.float64


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G, dtype=D64)


# -- attention sink ------------------------------------------------------------------------


def test_sink_limits():
    q, keys = randn(5, 3, 16), randn(20, 16)
    p0, window = 15, 8  # queries 15..19, keys 0..19
    big = attend(q, keys, 0, p0, window, torch.full((3,), 1e4, dtype=D64))
    assert big.abs().max() < 1e-300  # the sink takes all the mass, contributes no value
    plain = attend(q, keys, 0, p0, window, torch.full((3,), -1e4, dtype=D64))
    for i in range(5):
        t = p0 + i
        kv = keys[t - window + 1 : t + 1]
        ref = torch.softmax(q[i] @ kv.T / 4.0, dim=-1) @ kv
        assert torch.allclose(plain[i], ref, atol=1e-12)
    mid = attend(q, keys, 0, p0, window, torch.zeros(3, dtype=D64))
    s = q[0] @ keys[p0 - window + 1 : p0 + 1].T / 4.0
    ref = torch.exp(s) @ keys[p0 - window + 1 : p0 + 1] / (torch.exp(s).sum(-1, keepdim=True) + 1.0)
    assert torch.allclose(mid[0], ref, atol=1e-12)


# -- compressor ----------------------------------------------------------------------------


def _identity_compress(ratio: int, dim: int, a: torch.Tensor, chunks: list[int]):
    """Compressor with wkv = wgate = identity-like picks, no norm weight effect, no rope."""
    width = (2 if ratio == 4 else 1) * dim
    w = CompressorWeights(randn(width, a.shape[1]), randn(width, a.shape[1]), randn(ratio, width), torch.ones(dim, dtype=D64))
    st = CompressorState(ratio, dim, 64)
    rope = Rope(2, 1.0, None)  # base 1: f = 1, but every row is checked after undoing it below
    pos = 0
    for n in chunks:
        compress(st, w, a[pos : pos + n], pos, rope, lambda x: x, 1e-6)
        pos += n
    return st, w, rope


@pytest.mark.parametrize("ratio", [4, 8])
def test_compressor_rows_are_softmax_pools_of_their_token_slice(ratio):
    dim, n = 6, 5 * ratio + 3
    a = randn(n, 10)
    st, w, rope = _identity_compress(ratio, dim, a, [1, 2, ratio + 1, n - ratio - 4])
    kv = (a @ w.wkv.T).float().double()
    sc = (a @ w.wgate.T + w.ape[torch.arange(n) % ratio]).float().double()
    assert st.n_rows == n // ratio
    for c in range(st.n_rows):
        cur = slice(c * ratio, (c + 1) * ratio)
        if ratio == 4:  # lane A of the previous window, lane B of this one
            prev = slice(max(0, (c - 1) * 4), c * 4)
            cand_kv = torch.cat([kv[prev, :dim], kv[cur, dim:]])
            cand_sc = torch.cat([sc[prev, :dim], sc[cur, dim:]])
        else:
            cand_kv, cand_sc = kv[cur], sc[cur]
        pooled = (torch.softmax(cand_sc, dim=0) * cand_kv).sum(0)
        ref = pooled / torch.sqrt(pooled.square().mean() + 1e-6)
        cos, sin = rope.cos_sin(torch.tensor([c * ratio]), D64)  # at the window's first token
        ref = apply_rope(ref[None], cos, sin)[0]
        assert torch.allclose(st.rows[c].double(), ref, atol=1e-5), c
    # frontier canonical form: the partial window is the last n % ratio projections
    off = ratio if ratio == 4 else 0
    rem = n % ratio
    assert torch.equal(st.state_kv[off : off + rem].double(), kv[n - rem :])
    assert (st.state_score[off + rem :] == EMPTY_SCORE).all() and not st.state_kv[off + rem :].any()
    if ratio == 4:  # the previous complete window kept whole in rows 0..3
        assert torch.equal(st.state_kv[:4].double(), kv[n - rem - 4 : n - rem])


# -- RoPE ----------------------------------------------------------------------------------


def test_yarn_ramp_and_relative_positions():
    ramp = yarn_ramp(16, 160000.0, 65536, 32.0, 1.0)  # tiny-dsv4: lo = 3, hi = 7
    assert ramp[:4].tolist() == [0, 0, 0, 0] and ramp[7:].tolist() == [1] * 1
    assert 0 < ramp[4] < ramp[5] < ramp[6] < 1
    flash = yarn_ramp(64, 160000.0, 65536, 32.0, 1.0)  # the reference: pairs 0-14 plain, 25-31 scaled
    assert (flash[:16] == 0).all() and (flash[25:] == 1).all()
    cfg = tiny().cfg
    for rope in (Rope(16, cfg.rope_theta, None), Rope(16, cfg.compress_rope_theta, (16.0, 65536, 32.0, 1.0))):
        q, k = randn(1, 24), randn(1, 24)
        dots = []
        for tq, tk in ((10, 3), (1007, 1000), (7, 0)):
            cq, sq = rope.cos_sin(torch.tensor([tq]), D64)
            ck, sk = rope.cos_sin(torch.tensor([tk]), D64)
            dots.append((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum().item())
        assert dots[0] == pytest.approx(dots[1], abs=1e-9) and dots[0] == pytest.approx(dots[2], abs=1e-9)
        c, s = rope.cos_sin(torch.tensor([123]), D64)
        assert torch.allclose(apply_rope(apply_rope(q, c, s), c, s, inverse=True), q, atol=1e-12)
        assert torch.equal(apply_rope(q, c, s)[:, :8], q[:, :8])  # only the last dims rotate


# -- hyper-connections ---------------------------------------------------------------------


def test_sinkhorn_and_hc_mixing_direction():
    m = sinkhorn(randn(3, 4, 4), 20, 1e-6)
    assert torch.allclose(m.sum(-1), torch.ones(3, 4, dtype=D64), atol=1e-3)
    assert torch.allclose(m.sum(-2), torch.ones(3, 4, dtype=D64), atol=1e-3)
    x = randn(2, 4, 8)
    w = HcWeights(randn(24, 32) * 0.3, randn(24) * 0.1, torch.ones(3, dtype=D64))
    collapsed, post, comb = hc_pre(x, w, 20, 1e-6, 1e-6)
    assert (post > 0).all() and (post < 2).all()
    y = randn(2, 8)
    out = hc_post(y, x, post, comb)
    j = 2
    ref = post[0, j] * y[0] + sum(comb[0, i, j] * x[0, i] for i in range(4))  # M[i, j]: not M[j, i]
    assert torch.allclose(out[0, j], ref, atol=1e-12)
    assert not torch.allclose(comb[0], comb[0].T)


# -- MoE -----------------------------------------------------------------------------------


def _moe(hashed: bool, limit: float = 10.0):
    e, d, f = 6, 8, 5
    w = MoeWeights(randn(e, d), None if hashed else randn(e) * 5, torch.tensor([[4, 1], [0, 5], [2, 3]]) if hashed else None,
                   randn(e, f, d), randn(e, f, d), randn(e, d, f), (randn(f, d), randn(f, d), randn(d, f)))
    return w


def test_moe_routing():
    x, toks = randn(3, 8), torch.tensor([0, 1, 2])
    hashed = _moe(True)
    ids, weights = route(x, toks, hashed, 2, 1.5)
    assert ids.tolist() == [[4, 1], [0, 5], [2, 3]]
    assert torch.allclose(weights.sum(-1), torch.full((3,), 1.5, dtype=D64))
    biased = _moe(False)
    ids, weights = route(x, toks, biased, 2, 1.5)
    scores = torch.sqrt(torch.nn.functional.softplus(x @ biased.gate.T))
    assert ids.tolist() == torch.topk(scores + biased.bias, 2).indices.tolist()  # the bias picks
    sel = scores.gather(1, ids)
    assert torch.allclose(weights, sel / sel.sum(-1, keepdim=True) * 1.5)  # ...the scores weigh


def test_swiglu_clamp_happens_with_a_low_limit():
    w, x, toks = _moe(True), randn(3, 8) * 3, torch.tensor([0, 1, 2])
    low, high = moe_forward(x, toks, w, 2, 1.5, 0.05), moe_forward(x, toks, w, 2, 1.5, 1e9)
    assert not torch.allclose(low, high)
    g, u = randn(50), randn(50)
    assert torch.equal(swiglu(g, u, 0.05), torch.nn.functional.silu(g.clamp(max=0.05)) * u.clamp(-0.05, 0.05))


def test_swiglu_limit_zero_means_no_clamp():
    """The official Expert clamps only `if self.swiglu_limit > 0` (its ModelArgs default is 0);
    clamping at 0 would zero every expert's output (transformers does, docs/fidelity.md)."""
    g, u = randn(50) * 3, randn(50) * 3
    assert torch.equal(swiglu(g, u, 0.0), torch.nn.functional.silu(g) * u)
    w, x, toks = _moe(True), randn(3, 8), torch.tensor([0, 1, 2])
    assert torch.equal(moe_forward(x, toks, w, 2, 1.5, 0.0), moe_forward(x, toks, w, 2, 1.5, float("inf")))


# -- number formats ------------------------------------------------------------------------


def test_minifloat_rounding_matches_the_formats():
    x = randn(20000) * 50
    x = x.clamp(-448, 448)
    assert torch.equal(quant.round_e4m3(x), x.float().to(torch.float8_e4m3fn).double())
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0])
    assert quant.round_e2m1(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 6.0]


def test_kv_and_indexer_qat():
    row = randn(3, 80)
    out = quant.fp8_kv_qat(row, 16)
    assert torch.equal(out[:, 64:], row[:, 64:])  # rope dims untouched
    scale = 2.0 ** math.ceil(math.log2(row[0, :64].abs().max().item() / 448))
    assert torch.equal(quant.round_e4m3(out[0, :64] / scale), out[0, :64] / scale)  # on the E4M3 grid
    h = quant.hadamard(torch.eye(32, dtype=D64))
    assert torch.allclose(h @ h.T, torch.eye(32, dtype=D64), atol=1e-12)
    v = quant.indexer_qat(randn(4, 32))
    assert len(torch.unique(v[0].abs())) <= 8  # one block: 8 magnitudes of E2M1 times one scale


def test_checkpoint_formats_round_trip_and_bit_layout():
    w = randn(70, 96).float()
    q, s = quant.quant_fp8_weight(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (1, 1)
    d = quant.dequant_fp8_weight(q, s)
    assert torch.equal(quant.dequant_fp8_weight(*quant.quant_fp8_weight(d)), d)
    packed, s4 = quant.quant_fp4_weight(torch.tensor([[0.5, -6.0] + [0.0] * 30]))
    assert packed.view(torch.uint8)[0, 0].item() == 0xF1  # low nibble: 0.5 (code 1), high: -6 (code 15)
    assert quant.e8m0_to_float(s4).item() == 1.0
    assert quant.dequant_fp4_weight(packed, s4)[0, :2].tolist() == [0.5, -6.0]


# -- chat format ---------------------------------------------------------------------------


def test_chat_render_parse_round_trip():
    chat = Dsv4ChatTemplate()
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning": "greet back"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    text = chat.render(msgs, add_generation_prompt=False)
    # thinking off: as ds4 renders it, no turn's reasoning is in the prompt
    assert text == (f"{BOS}Be brief.{USER}Hi{ASSISTANT}{THINK_END}Hello!{EOS}"
                    f"{USER}2+2?{ASSISTANT}{THINK_END}4{EOS}")
    assert chat.parse(text) == [{k: v for k, v in m.items() if k != "reasoning"} for m in msgs]
    # thinking on: the turn after the last user message keeps it (test_dsv4_chat.py has the rest)
    thinking = Dsv4ChatTemplate(thinking=True)
    tail = thinking.render(msgs[:3], add_generation_prompt=False)
    assert tail.endswith(f"{ASSISTANT}<think>greet back{THINK_END}Hello!{EOS}")
    assert thinking.parse(tail) == msgs[:3]
    prompt = chat.render(msgs[:4])
    assert prompt.endswith(f"{USER}2+2?{ASSISTANT}{THINK_END}")
    plain = [{k: v for k, v in m.items() if k != "reasoning"} for m in msgs]
    assert chat.parse(prompt) == plain[:4]
    assert chat.parse(prompt + "partial") == plain[:4] + [{"role": "assistant", "content": "partial"}]
    assert Dsv4ChatTemplate(thinking=True).render(msgs[:2]).endswith(f"{ASSISTANT}<think>")


def test_tokenizer_maps_chat_tokens_to_single_ids():
    model = tiny()
    tok = model.tokenizer
    ids = tok.encode(model.chat.render([{"role": "user", "content": "hello world"}]))
    assert ids[0] == 0 and ids[1] == SPECIAL_TOKENS.index(USER) and ids[-2:] == [4, 6]
    assert tok.eos_ids == frozenset({1}) and tok.decode(ids).startswith(BOS)
    assert b"".join(tok.token_bytes(i) for i in ids[2:-2]) == b"hello world"
