"""chunk.c's layer (a chunk's llama layer in one C call) against the forward's per-layer steps
in Python: the same kernels in the same order, so bit-identical logits and K/V rows, for every
architecture it takes (Llama 3, Qwen 2's biases, Qwen 3's q/k norms, Gemma 3's post norms,
GeGLU and sliding layers, and a Gemma 3 variant with global layers only), f32 and f16 K/V, every
kernel variant, the last layer's two endings (no logits: K/V rows only; logits: one row), and
sliding layers' rings: wrapped by a later chunk, overrun by a chunk longer than the ring, and
shorter than the window (a context below it)."""

from __future__ import annotations

import pytest
import torch

from ds4tui.engine.kernels import qgemv
from ds4tui.engine.llama.config import FULL, LlamaConfig
from ds4tui.engine.llama.layer import blocks_match_table
from ds4tui.engine.llama.model import LlamaModel
from ds4tui.engine.llama.weights import make_info
from ds4tui.engine.loader import load_model
from tests.engine.kernels.test_llama_step_archs import CONFIGS, CTX, _blocks, _tensors, arch_model

# Gemma 3's fields (embedding scale, q/k norms, post norms, GeGLU, query scale) on global
# layers only: the plain buffer of a model without rings.
GLOBAL_GEMMA = dict(CONFIGS["gemma3"], layer_types=(FULL,) * 4, sliding_window=0)
C_ARCHS = list(CONFIGS) + ["gemma3-global"]
# (start, tokens, logits wanted) per chunk: a prefill in chunks (the last layer writes K/V only),
# then a short message with logits at depth (the split attention; Gemma's rings wrap at WINDOW),
# then a two-token chunk
CHUNKS = [(0, 64, False), (64, 200, False), (264, 23, True), (287, 2, True)]
_GLOBAL: dict = {}


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")  # a tokenizer and chat template for the models below


def _model(tiny, arch: str) -> LlamaModel:
    if arch != "gemma3-global":
        return arch_model(tiny, arch, "mix")
    if not _GLOBAL:
        cfg = LlamaConfig(**GLOBAL_GEMMA)
        tensors = _tensors(cfg, seed=11)
        raw = _blocks(tensors, seed=3)
        info = make_info("chunk-gemma3-global", cfg, "test-gemma3-global", 32)
        _GLOBAL["m"] = LlamaModel(cfg, tensors, info, tiny.tokenizer, tiny.chat, "test", raw=raw)
    return _GLOBAL["m"]


def _layers(kv) -> list[torch.Tensor]:
    """A session's K/V per layer: views of its one buffer, or its per-layer buffers (rings)."""
    return list(kv.unbind(0)) if isinstance(kv, torch.Tensor) else list(kv)


def _run(model, use_c: bool, kv_dtype: str, chunks: list[tuple[int, int, bool]], variant: str, seen: list[int],
         ctx: int = CTX, bf16: bool = False):
    """A session's K/V (per layer) and the logits of each chunk (start, length, want_logits),
    the layers run in C or in Python, both on `variant` with bf16 products on or off (pinned:
    the default would depend on the CPU); `seen` collects the before_layer calls."""
    gen = torch.Generator().manual_seed(5)
    session = model.new_session(ctx, kv_dtype=kv_dtype)
    for t in _layers(session.kv):
        t.zero_()
    model.use_c_layers = use_c
    out = []
    try:
        with torch.inference_mode(), qgemv.use_variant(variant), qgemv.use_bf16(bf16):
            for start, n, want in chunks:
                tokens = torch.randint(0, model.cfg.vocab_size, (n,), generator=gen).tolist()
                out.append(model.forward(session.kv, tokens, start, want, before_layer=seen.append))
    finally:
        model.use_c_layers = True
    return [t.clone() for t in _layers(session.kv)], out


def _same(model, kv_dtype, variant, chunks, ctx: int = CTX, bf16: bool = False) -> list[torch.Tensor]:
    """Runs both paths; asserts equal K/V, logits and hooks; returns the K/V."""
    seen_c: list[int] = []
    seen_py: list[int] = []
    kv_c, logits_c = _run(model, True, kv_dtype, chunks, variant, seen_c, ctx, bf16)
    kv_py, logits_py = _run(model, False, kv_dtype, chunks, variant, seen_py, ctx, bf16)
    for i, (a, b) in enumerate(zip(kv_c, kv_py)):
        assert torch.equal(a, b), f"layer {i} K/V"
    for a, b in zip(logits_c, logits_py):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.isfinite(a).all() and torch.equal(a, b)
    # the restore's hook runs before every layer, in order, on both paths
    assert seen_c == seen_py == list(range(model.cfg.num_layers)) * len(chunks)
    return kv_c


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
@pytest.mark.parametrize("arch", C_ARCHS)
def test_c_layers_equal_the_python_steps(tiny, arch, kv_dtype, variant):
    model = _model(tiny, arch)
    assert model.use_c_layers
    kv = _same(model, kv_dtype, variant, CHUNKS)
    end = CHUNKS[-1][0] + CHUNKS[-1][1]
    for i, t in enumerate(kv):
        if model.cfg.is_sliding(i):  # a ring: every slot written once the positions passed it
            assert t.shape[2] == min(model.cfg.sliding_window, CTX) and t.abs().sum(dim=(0, 1, 3)).all()
        else:
            assert t[:, :, :end].abs().sum() > 0 and not t[:, :, end:].any()


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_c_layers_on_rings_overrun_and_shorter_than_the_window(tiny, kv_dtype, variant):
    """A chunk longer than a sliding layer's ring (only its last rows stay), and a context
    shorter than the window (the ring is the context)."""
    model = _model(tiny, "gemma3")
    window = model.cfg.sliding_window
    _same(model, kv_dtype, variant, [(0, window + 20, False), (window + 20, 9, True)])
    short = window - 64
    kv = _same(model, kv_dtype, variant, [(0, 100, False), (100, short - 100, True)], ctx=short)
    assert kv[0].shape[2] == short


@pytest.mark.parametrize("arch", C_ARCHS)
def test_c_layers_equal_the_python_steps_with_bf16_products(tiny, arch, bf16_cpu):
    """The same with the AVX-512 variant's bf16 tiles (chunks of 96 rows and more, and deep
    attention): both paths take them for the same calls."""
    _same(_model(tiny, arch), "f16", "avx512", [(0, 120, False), (120, 9, True)], bf16=True)


def test_c_layers_only_where_they_compute_the_same(tiny):
    """Layers without blocks (fp32 weights: the forward multiplies in torch) keep the Python
    steps; so does a table whose parts are not the layers' blocks."""
    assert arch_model(tiny, "gemma3", "mix").use_c_layers
    assert not arch_model(tiny, "llama3", "f32").use_c_layers
    model = arch_model(tiny, "qwen3", "mix")
    assert blocks_match_table(model.layers, model.fast)
    layer = model.layers[1]
    blocks = layer.w2.blocks
    try:
        layer.w2.blocks = qgemv.QuantMatrix.from_parts([(t, b.clone()) for t, b in blocks.parts], blocks.cols)
        assert not blocks_match_table(model.layers, model.fast)
    finally:
        layer.w2.blocks = blocks
