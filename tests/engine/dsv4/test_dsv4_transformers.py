"""The DSV4 engine against transformers' DeepseekV4ForCausalLM, logit for logit (docs/fidelity.md).

Each reference model (tests/engine/dsv4_reference.py) is saved by
transformers and loaded through `load_model`, with QAT and the f16 cache off.
Then, in float32, at every position:
- full-prompt logits for 1, W-1, W, W+1, 300 and 1000 tokens, ours in one
  chunk and in 64-token chunks;
- a prefill followed by single-token decodes against transformers' cache;
- 32-token greedy continuations, token for token;
- the indexer's top-k choice per CSA layer and position, the compressed rows
  (attention and indexer) and the sliding-window rows held in the caches.
Tolerance: max |ours - theirs| over the vocab <= 1e-4 of the reference logit
std; measured differences are ~1e-5 (float32 summation order and float32 vs
our float64 RoPE angles).
"""

from __future__ import annotations

import json

import pytest
import torch

from ds4tui.engine import quant
from ds4tui.engine.dsv4.net import Dsv4Trace
from ds4tui.engine.loader import load_model
from ds4tui.engine.errors import WeightsError
from tests.engine.dsv4.dsv4_helpers import single_thread  # noqa: F401 (fixture)
from tests.engine.dsv4.dsv4_reference import (
    SPECS,
    Recorder,
    boundary_ties,
    build_reference,
    hf_decode,
    hf_logits,
    prompt,
    rel_diff,
    save_reference,
)

TOL = 1e-4
CHUNK = 64  # a multiple of every ratio in SPECS


@pytest.fixture(scope="module", params=SPECS, ids=lambda s: s.name)
def pair(request, tmp_path_factory):
    spec = request.param
    ref = build_reference(spec)
    path = save_reference(ref, tmp_path_factory.mktemp(f"dsv4-ref-{spec.name}"))
    return spec, ref, load_model(str(path))


def ours_all_logits(model, toks: list[int], chunk: int | None = None):
    s = model.new_session(ctx_size=2048, chunk_size=chunk)
    s.trace = Dsv4Trace(all_logits=True)
    s.prefill(toks)
    return torch.stack([s.trace.logits[p] for p in range(len(toks))]), s


def test_loaded_config_matches_the_reference(pair):
    spec, ref, ours = pair
    c, r = ours.cfg, ref.config
    assert not (c.qat_kv_fp8 or c.qat_indexer_fp4 or c.cache_f16)
    assert c.rope_head_dim == int(r.head_dim * r.partial_rotary_factor)
    ratios = [r.compress_rates.get(t, 0) for t in r.layer_types]
    assert c.compress_ratios == ratios
    assert c.hash_layers == [t == "hash_moe" for t in r.mlp_layer_types]
    yarn = r.rope_parameters["compress"]
    assert (c.yarn_factor, c.yarn_original_max_position) == (yarn["factor"], yarn["original_max_position_embeddings"])
    assert (c.rope_theta, c.compress_rope_theta) == (r.rope_theta, r.compress_rope_theta)
    assert (c.hc_mult, c.hc_sinkhorn_iters, c.swiglu_limit) == (r.hc_mult, r.hc_sinkhorn_iters, r.swiglu_limit)


LENGTHS = {"1": lambda w: 1, "W-1": lambda w: w - 1, "W": lambda w: w, "W+1": lambda w: w + 1,
           "300": lambda w: 300, "1000": lambda w: 1000}  # W: the sliding window


@pytest.mark.parametrize("length", LENGTHS)
def test_prompt_logits_equal_at_every_position(pair, length):
    spec, ref, ours = pair
    n = LENGTHS[length](spec.window)
    toks = prompt(n, seed=n)
    rec = Recorder(ref)
    theirs, cache = hf_logits(ref, toks)
    rec.close()
    mine, session = ours_all_logits(ours, toks)
    chunked, _ = ours_all_logits(ours, toks, CHUNK)
    # Equal logits only mean something if the top-k was unique everywhere (module docstring).
    for li, scores in rec.scores.items():
        assert boundary_ties(scores[0], ours.cfg.index_topk, 4) == [], f"layer {li}: tied index scores"
    assert rel_diff(mine, theirs).max() <= TOL
    assert rel_diff(chunked, theirs).max() <= TOL
    check_indexer_choices(ours, session.trace, rec, n)
    check_cache_rows(ours, session, cache, n)


def check_indexer_choices(ours, trace: Dsv4Trace, rec: Recorder, n: int) -> None:
    """Per CSA layer and position: our chosen rows == transformers' top-k (its -1 = none)."""
    k = ours.cfg.index_topk
    for li, calls in rec.selected.items():
        theirs = calls[0]  # [n, min(k, rows)]
        for pos in range(n):
            visible = (pos + 1) // 4
            if visible == 0:
                continue
            want = sorted(i for i in theirs[pos].tolist() if i >= 0)
            assert len(want) == min(k, visible)
            assert list(trace.indexer[(li, pos)]) == want, f"layer {li} position {pos}"


def check_cache_rows(ours, session, cache, n: int) -> None:
    """Compressed rows (attention and indexer) and the live sliding-window rows."""
    w = ours.cfg.sliding_window
    for li, lc in enumerate(session.layers):
        hf_layer = cache.layers[li]
        keys = hf_layer.keys[0, 0]  # transformers keeps the last W-1 rows (the next token adds one)
        live = lc.raw_logical(n, w)[-keys.shape[0]:]
        assert torch.allclose(live, keys, rtol=0, atol=TOL * keys.abs().max().clamp(min=1))
        for st, name in ((lc.attn, "compressor"), (lc.index, "indexer")):
            if st is None:
                continue
            theirs = hf_layer.compressed_kv[name]
            mine = st.rows[: st.n_rows]
            theirs = mine[:0] if theirs is None else theirs[0]
            assert mine.shape == theirs.shape, f"layer {li} {name}"
            if st.n_rows:
                assert (mine - theirs).abs().max() <= TOL * theirs.abs().max(), f"layer {li} {name}"


def test_decode_after_prefill_equals_cached_generation(pair):
    spec, ref, ours = pair
    toks = prompt(260, seed=5)
    head, tail = toks[:200], toks[200:]  # 60 decodes: window turnover, CSA/HCA closes, top-k
    _, cache = hf_logits(ref, head)
    theirs = hf_decode(ref, cache, tail)
    s = ours.new_session(ctx_size=512)
    s.prefill(head)
    mine = torch.stack([s.decode(t) for t in tail])
    assert rel_diff(mine, theirs).max() <= TOL


def test_decode_from_the_first_token_equals_cached_generation(pair):
    spec, ref, ours = pair
    toks = prompt(3 * spec.window + 5, seed=9)
    _, cache = hf_logits(ref, toks[:1])
    theirs = hf_decode(ref, cache, toks[1:])
    s = ours.new_session(ctx_size=512)
    s.prefill(toks[:1])
    mine = torch.stack([s.decode(t) for t in toks[1:]])
    assert rel_diff(mine, theirs).max() <= TOL


def test_greedy_continuations_are_identical(pair):
    spec, ref, ours = pair
    toks = prompt(150, seed=3)
    with torch.no_grad():
        out = ref.generate(torch.tensor([toks]), max_new_tokens=32, do_sample=False,
                           pad_token_id=0, eos_token_id=None)
    theirs = out[0, len(toks):].tolist()
    s = ours.new_session(ctx_size=512)
    s.prefill(toks)
    mine = []
    for _ in range(32):
        mine.append(int(torch.argmax(s.logits)))
        s.decode(mine[-1])
    assert mine == theirs
    assert len(set(mine)) > 4  # a real continuation, not one repeated token


def test_qat_shape_rules_apply_only_with_qat(pair, tmp_path):
    """The reference heads (n_nope 16 or 12, index dim 16 or 8) fit only the QAT-off rules."""
    spec, ref, _ = pair
    path = save_reference(ref, tmp_path / "qat-on")
    config = path / "config.json"
    raw = json.loads(config.read_text())
    raw["ds4tui_qat"] = True
    config.write_text(json.dumps(raw))
    with pytest.raises(WeightsError, match="FP8 KV block|Hadamard"):
        load_model(str(path))


def test_swiglu_limit_zero_with_transformers_clamp_excluded(tmp_path):
    """swiglu_limit 0 means "no clamp" in the official code (inference/model.py, Expert.forward:
    `if self.swiglu_limit > 0:` before both clamps; ModelArgs defaults it to 0). transformers
    clamps unconditionally (DeepseekV4MLP.forward and DeepseekV4Experts._apply_gate), which at
    0 zeroes every expert. Excluded here: their limit is lifted to +inf, the official meaning;
    everything else is compared as above."""
    spec = SPECS[0]
    spec = type(spec)(spec.name + "-nolimit", spec.seed, dict(spec.kwargs, swiglu_limit=0.0))
    ref = build_reference(spec)
    ours = load_model(str(save_reference(ref, tmp_path / "ref")))
    assert ours.cfg.swiglu_limit == 0.0
    for module in ref.modules():
        if hasattr(module, "limit"):
            module.limit = float("inf")
    toks = prompt(300, seed=4)
    theirs, _ = hf_logits(ref, toks)
    mine, _ = ours_all_logits(ours, toks)
    assert rel_diff(mine, theirs).max() <= TOL


# -- FP8 / FP4 weights: our dequantization at load is transformers' bit for bit ---------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)  # -0.0 and 0.0 differ here


def _fp8_dequant_theirs():
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    return Fp8Dequantize(None)._dequantize_one  # a pure function of (weight, scales, dtype)


@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.float8_e8m0fnu])
def test_fp8_block_dequantization_is_bit_exact(scale_dtype):
    """Every E4M3 byte but NaN, every E8M0 exponent but NaN, 128x128 blocks (official layout)."""
    g = torch.Generator().manual_seed(8)
    raw = torch.randint(0, 256, (256, 384), generator=g, dtype=torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0  # E4M3FN's NaNs
    raw[0, :256] = torch.arange(256, dtype=torch.uint8)
    raw[0, :256][(raw[0, :256] & 0x7F) == 0x7F] = 1
    weight = raw.view(torch.float8_e4m3fn)
    exps = torch.randint(0, 255, (2, 3), generator=g, dtype=torch.uint8)
    exps[0, 0], exps[1, 2] = 0, 254  # the smallest and largest scales
    scale = exps if scale_dtype == torch.uint8 else exps.view(torch.float8_e8m0fnu)
    mine = quant.dequant_fp8_weight(weight, scale)
    theirs = _fp8_dequant_theirs()(weight, scale, torch.float32)
    assert torch.equal(_bits(mine), _bits(theirs))


def test_fp4_expert_dequantization_is_bit_exact():
    """Packed E2M1 (low nibble first, both signs of zero), one E8M0 scale per 32 inputs."""
    g = torch.Generator().manual_seed(4)
    packed = torch.randint(0, 256, (64, 128), generator=g, dtype=torch.uint8)
    packed[0] = torch.arange(128, dtype=torch.uint8) * 2 + 1  # every nibble in both halves
    scale = torch.randint(100, 150, (64, 8), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    mine = quant.dequant_fp4_weight(packed.view(torch.int8), scale)
    theirs = _fp8_dequant_theirs()(packed.view(torch.int8), scale, torch.float32)
    assert torch.equal(_bits(mine), _bits(theirs))


def test_our_quantizers_round_trip_through_their_dequantization():
    """Weights written by our FP8 / FP4 quantizers (tiny-dsv4's official-format writer) mean
    the same numbers to transformers as to our loader."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(256, 128, generator=g) * 0.05
    q8, s8 = quant.quant_fp8_weight(w)
    assert torch.equal(_bits(quant.dequant_fp8_weight(q8, s8)), _bits(_fp8_dequant_theirs()(q8, s8, torch.float32)))
    q4, s4 = quant.quant_fp4_weight(w)
    assert torch.equal(_bits(quant.dequant_fp4_weight(q4, s4)), _bits(_fp8_dequant_theirs()(q4, s4, torch.float32)))
