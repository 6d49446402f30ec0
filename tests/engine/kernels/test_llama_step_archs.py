"""The fused C decode step against the torch forward for every llama-family architecture:
Llama 3 RoPE scaling, Qwen 2 q/k/v biases, Qwen 3 q/k norms, and Gemma 3 (embedding scale,
q/k norms, post norms, GeGLU, query_pre_attn_scalar, logit soft-capping, sliding-window
layers with their own RoPE base and a ring of K/V rows), on fp32 weights and on a GGUF-like
mix of block types, f32 and f16 K/V, every kernel variant this CPU runs."""

from __future__ import annotations

import math

import pytest
import torch

from ds4tui.engine.kernels import qgemv, quants
from ds4tui.engine.kernels.llama_step import FastDecoder
from ds4tui.engine.llama.config import FULL, SLIDING, LlamaConfig, expected_shapes
from ds4tui.engine.llama.rope import llama3_divisors
from ds4tui.engine.llama.model import LlamaModel
from ds4tui.engine.llama.weights import make_info
from ds4tui.engine.loader import load_model
from tests.engine.kernels.test_kernels import random_blocks

# Hidden, FFN and q widths are multiples of 256 so that K-quant blocks fit every matrix.
BASE = dict(vocab_size=384, hidden_size=256, intermediate_size=512, num_layers=3, num_heads=4, num_kv_heads=1,
            head_dim=64, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=False)
# The window is over one attention block (256 rows) and not a multiple of it; the decoded
# positions START..END-1 run up to it, wrap the ring and cross the global layers' block edge.
WINDOW, CTX, START, END = 264, 320, 250, 270
CONFIGS = {
    "llama3": dict(BASE, rope_freq_factors=True),
    "qwen2": dict(BASE, arch="qwen2", attn_bias=True, num_kv_heads=2, tie_word_embeddings=True),
    "qwen3": dict(BASE, arch="qwen3", qk_norm=True),
    "gemma3": dict(BASE, arch="gemma3", num_layers=4, qk_norm=True, post_norms=True, act="gelu_tanh",
                   embed_scale=math.sqrt(256), query_pre_attn_scalar=48.0, sliding_window=WINDOW,
                   layer_types=(SLIDING, SLIDING, FULL, SLIDING), rope_local_theta=1e4, final_logit_softcapping=30.0,
                   tie_word_embeddings=True),
}
# Block types like gemma-3-270m's Q4_K_M file: fused matrices in parts of different types.
MIX = {"wqkv": ("q5_0", "q8_0"), "wo": ("q4_k",), "w13": ("q4_k", "q6_k"), "w2": ("q6_k",),
       "embed": ("q8_0",), "lm_head": ("q6_k",)}


def _tensors(cfg: LlamaConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random fp32 weights at scales that keep activations O(1)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        key = name.rsplit(".", 1)[-1]
        if key == "rope_freqs":
            t = torch.tensor(llama3_divisors(cfg.head_dim, cfg.rope_theta, 8.0, 1.0, 4.0, 64))
        elif len(shape) == 1 and key != "bqkv":
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)  # norms
        elif key == "bqkv":
            t = 0.3 * torch.randn(shape, generator=gen)
        elif key == "embed":
            t = torch.randn(shape, generator=gen) / cfg.embed_scale
        else:
            t = torch.randn(shape, generator=gen) * ((3.0 if key == "lm_head" else 1.5) / shape[1] ** 0.5)
        out[name] = t.float().contiguous()
    return out


def _blocks(tensors: dict[str, torch.Tensor], seed: int) -> dict:
    """Replace every matrix by random blocks of MIX's types (rows split evenly over a fused
    matrix's parts); the fp32 tensors become the blocks' values. Returns the raw entries."""
    raw = {}
    for k, (name, t) in enumerate(sorted(tensors.items())):
        types = MIX.get(name.rsplit(".", 1)[-1])
        if t.dim() != 2 or types is None:
            continue
        rows, cols = t.shape
        cut = [rows * i // len(types) for i in range(len(types) + 1)]
        # random_blocks' Q8_0 quants span -128..127, 8x the 4-bit types' range: scaled down to match
        parts = [(q, random_blocks(q, cut[i + 1] - cut[i], cols, seed + 31 * k + i, scale=0.05 / (8 if q == "q8_0" else 1)))
                 for i, q in enumerate(types)]
        raw[name] = parts
        tensors[name] = torch.cat([quants.dequantize(b, q, cols) for q, b in parts]).contiguous()
    return raw


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")  # a tokenizer and chat template for the models below


_MODELS: dict = {}
_REFS: dict = {}


def arch_model(tiny, arch: str, weights: str) -> LlamaModel:
    key = (arch, weights)
    if key not in _MODELS:
        cfg = LlamaConfig(**CONFIGS[arch])
        tensors = _tensors(cfg, seed=len(arch))
        raw = _blocks(tensors, seed=3) if weights == "mix" else None
        info = make_info(f"step-{arch}-{weights}", cfg, f"test-{arch}-{weights}", 32)
        _MODELS[key] = LlamaModel(cfg, tensors, info, tiny.tokenizer, tiny.chat, "test", raw=raw)
    return _MODELS[key]


def _tokens(cfg: LlamaConfig) -> list[int]:
    return torch.randint(0, cfg.vocab_size, (END,), generator=torch.Generator().manual_seed(9)).tolist()


def torch_reference(model: LlamaModel, kv_dtype: str):
    """(K/V after a torch prefill of START tokens, logits and K/V after the torch forward
    decoded START..END-1 from there), computed once per model and K/V type, its block products
    pinned to the portable C variant in fp32: the reference is the same on every CPU, whatever
    the default variant and bf16 choice."""
    key = (model.info.name, kv_dtype)
    if key not in _REFS:
        tokens = _tokens(model.cfg)
        s = model.new_session(CTX, kv_dtype=kv_dtype)
        fast, model.fast = model.fast, None  # the all-torch fp32 forward, same weight values
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small ops: a second thread only waits (a shared machine)
        try:
            with qgemv.use_variant("scalar"), qgemv.use_bf16(False):
                s.prefill(tokens[:START])
                start = [t.clone() for t in s.kv]
                logits = [s.decode(t).clone() for t in tokens[START:]]
        finally:
            model.fast = fast
            torch.set_num_threads(threads)
        _REFS[key] = (start, logits, s.kv)
    return _REFS[key]


def _worst(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, want))


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
@pytest.mark.parametrize("weights", ["f32", "mix"])
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_step_matches_the_torch_forward(tiny, arch, weights, kv_dtype, variant):
    model = arch_model(tiny, arch, weights)
    assert isinstance(model.fast, FastDecoder)
    if weights == "mix":
        assert model.fast.types["layers.0.wqkv"] == "q5_0+q8_0" and model.fast.types["layers.0.w13"] == "q4_k+q6_k"
    start, want, kv_want = torch_reference(model, kv_dtype)
    kv = [t.clone() for t in start]
    tokens = _tokens(model.cfg)
    with torch.inference_mode(), qgemv.use_variant(variant), qgemv.use_bf16(False):
        got = [model.fast.step(kv, tokens[pos], pos, want_logits=True) for pos in range(START, END)]
    # f32: the same values in another summation order. f16: a K/V row the two orders put either
    # side of an f16 rounding boundary differs by one f16 step, and later tokens read it.
    assert _worst(got, want) < (2e-5 if kv_dtype == "f32" else 2e-4)
    tol = 1e-4 if kv_dtype == "f32" else 2e-3
    for i, (a, b) in enumerate(zip(kv, kv_want)):
        rows = slice(None) if model.cfg.is_sliding(i) else slice(START, END)  # a ring: every slot
        assert torch.allclose(a[:, :, rows].float(), b[:, :, rows].float(), atol=tol, rtol=tol), f"layer {i}"
    if model.cfg.sliding_layers:
        assert kv[0].shape[2] == WINDOW and kv[2].shape[2] == CTX


def test_a_frozen_step_writes_only_the_sliding_rings(tiny):
    """A restore's replay (frozen_global): global layers read their stored rows and write none."""
    model = arch_model(tiny, "gemma3", "mix")
    start, _, _ = torch_reference(model, "f32")
    tokens = _tokens(model.cfg)
    kv = [t.clone() for t in start]
    model.fast.step(kv, tokens[START], START, want_logits=False)  # the live step writes every layer
    stored = [t.clone() for t in kv]
    for i in model.cfg.sliding_layers:  # the rings as they were before the token, the global rows as stored
        kv[i].copy_(start[i])
    with torch.inference_mode():
        got = model.fast.step(kv, tokens[START], START, want_logits=True, frozen_global=True)
        fast, model.fast = model.fast, None
        ref = [t.clone() for t in stored]
        want = model.forward(ref, [tokens[START]], START, True, frozen_global=True)
        model.fast = fast
    global_layer = model.cfg.layer_types.index(FULL)
    assert torch.equal(kv[global_layer], stored[global_layer])  # untouched, not rewritten
    assert torch.equal(kv[0], stored[0])  # the ring row is the live step's, bit for bit
    assert float((got - want).abs().max() / want.abs().max()) < 2e-5


def test_the_step_is_deterministic_and_thread_count_independent(tiny):
    """A restored session decodes exactly like the live one only if the step is a function of
    its inputs: the same logits and rings for 1 and 2 threads, and on a second run."""
    model = arch_model(tiny, "gemma3", "mix")
    start, _, _ = torch_reference(model, "f16")
    tokens = _tokens(model.cfg)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 2):
            torch.set_num_threads(threads)
            kv = [t.clone() for t in start]
            logits = [model.fast.step(kv, tokens[p], p, want_logits=True) for p in range(START, START + 16)]
            runs.append((torch.stack(logits), kv))
    finally:
        torch.set_num_threads(before)
    for logits, kv in runs[1:]:
        assert torch.equal(logits, runs[0][0]) and all(torch.equal(a, b) for a, b in zip(kv, runs[0][1]))


def test_step_rejects_kv_of_other_shapes(tiny):
    model = arch_model(tiny, "gemma3", "f32")
    kv = model.new_session(CTX).kv
    with pytest.raises(ValueError, match="kv layer 1 .sliding. holds"):
        model.fast.step(kv[:1] + [kv[1][:, :, :100].contiguous()] + kv[2:], 1, 0, True)
    with pytest.raises(ValueError, match="one buffer per layer"):
        model.fast.step(kv[:-1], 1, 0, True)
    with pytest.raises(ValueError, match="like layer 0"):
        model.fast.step(kv[:1] + [kv[1].float()] + kv[2:], 1, 0, True)
    with pytest.raises(ValueError, match="position"):
        model.fast.step(kv, 1, CTX, True)
    small = model.new_session(100).kv  # a context under the window: rings of 100 rows
    assert small[0].shape[2] == 100
    assert torch.isfinite(model.fast.step(small, 1, 99, True)).all()
