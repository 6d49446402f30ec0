"""The C kernels: GEMV per weight type and the fused llama decode step, against torch references."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ds4tui.engine.kernels import qgemv
from ds4tui.engine.kernels.llama_step import FastDecoder
from ds4tui.engine.llama.model import LlamaConfig, LlamaModel
from ds4tui.engine.llama.weights import hf_to_internal, make_info
from ds4tui.engine.loader import load_model
from ds4tui.engine.llama.tiny import CONFIG, random_llama_weights

TYPES = ["q4_1", "q8_0", "f16", "f32"]
# SmolLM2's attention shape (head_dim 64, 3 query heads per KV head) at toy width, so the
# step's 64-wide register paths run; 2 layers.
WIDE = dict(CONFIG, hidden_size=192, intermediate_size=256, num_attention_heads=3, num_key_value_heads=1)


def random_blocks(qtype: str, rows: int, cols: int, seed: int) -> torch.Tensor:
    """Arbitrary bytes (every nibble/int8 value occurs), with sane f16 scales and minimums."""
    gen = torch.Generator().manual_seed(seed)
    if qtype in ("f32", "f16"):
        return qgemv.quantize(torch.randn(rows, cols, generator=gen), qtype)
    b = torch.randint(0, 256, (rows, cols // 32, qgemv.BLOCK_BYTES[qtype]), generator=gen, dtype=torch.uint8)
    scales = 2 if qtype == "q4_1" else 1  # d (and m) lead each block
    f16 = (torch.randn(rows, cols // 32, scales, generator=gen) * 0.05).half()
    b[..., : 2 * scales] = f16.view(torch.uint8).reshape(rows, cols // 32, 2 * scales)
    return b.reshape(rows, -1)


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0"])
def test_dequantize_is_ggufs_reference(qtype):
    w = np.random.default_rng(1).standard_normal((5, 96)).astype(np.float32)
    gtype = Q.Q4_1 if qtype == "q4_1" else Q.Q8_0
    blocks = gguf.quants.quantize(w, gtype)  # ggml's own rounding
    ours = qgemv.dequantize(torch.from_numpy(np.ascontiguousarray(blocks)), qtype, 96)
    assert torch.equal(ours, torch.from_numpy(gguf.quants.dequantize(blocks, gtype)))
    # our quantizer (tests, tiny models) rounds the same way
    assert torch.equal(qgemv.quantize(torch.from_numpy(w), qtype), torch.from_numpy(blocks.view(np.uint8)))


@pytest.mark.parametrize("qtype", TYPES)
def test_matvec_equals_dequantized_matmul(qtype):
    # 301 rows: an odd tail after the row pairs, and several pool chunks.
    rows, cols = 301, 256
    m = qgemv.QuantMatrix(random_blocks(qtype, rows, cols, seed=2), qtype, cols)
    x = torch.randn(cols, generator=torch.Generator().manual_seed(3))
    w = m.dequantize()
    want = (w.double() @ x.double()).float()
    got = m.matvec(x)
    bound = 1e-5 * (w.abs() @ x.abs()).max().item()  # rounding order, scaled to the terms' size
    assert (got - want).abs().max().item() <= bound
    out = torch.empty(rows)
    assert m.matvec(x, out) is out and torch.equal(out, got)
    with pytest.raises(ValueError):
        m.matvec(x[:-1])


def test_results_do_not_depend_on_the_thread_count():
    m = qgemv.QuantMatrix(random_blocks("q4_1", 1000, 576, seed=4), "q4_1", 576)
    x = torch.randn(576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = m.matvec(x)
        torch.set_num_threads(2)
        two = m.matvec(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_backend_is_the_best_this_machine_allows():
    flags = qgemv._cpu_flags()
    if qgemv._compiler() is None or os.environ.get("DS4TUI_KERNELS", "auto") != "auto":
        expected = {"torch", "scalar", "avx2"}
    elif {"avx2", "fma", "f16c"} <= flags:
        expected = {"avx2"}
    else:
        expected = {"scalar"}
    assert qgemv.backend() in expected, qgemv.backend_reason()


def wide_model(tokenizer, chat, qtype: str, seed: int = 11) -> LlamaModel:
    """A random WIDE-config model whose fp32 weights are exactly its `qtype` blocks' values."""
    cfg = LlamaConfig.from_hf(WIDE)
    tensors = hf_to_internal(cfg, random_llama_weights(WIDE, seed=seed), "test")
    raw = {}
    for name, t in list(tensors.items()):
        if t.dim() == 2 and name != "embed":
            blocks = qgemv.quantize(t, qtype)
            raw[name] = (qtype, blocks)
            tensors[name] = qgemv.dequantize(blocks, qtype, t.shape[1])
    info = make_info(f"wide-{qtype}", cfg, f"test-{qtype}", 32)
    return LlamaModel(cfg, tensors, info, tokenizer, chat, "test", raw=raw)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


@pytest.mark.parametrize("qtype", TYPES)
def test_fused_step_matches_the_torch_forward(tiny, qtype):
    model = wide_model(tiny.tokenizer, tiny.chat, qtype)
    assert isinstance(model.fast, FastDecoder)
    assert set(model.fast.types.values()) == ({"f32"} if qtype == "f32" else {qtype})
    cfg, ctx, start, n = model.cfg, 320, 248, 264  # positions 248..263 cross the 256-row block
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
    ref = model.new_session(ctx)
    ref.prefill(tokens[:start])  # torch fp32 prefill writes the first rows for both
    kv_ref, kv_fast = ref.kv, ref.kv.clone()
    fast, worst = model.fast, 0.0
    with torch.inference_mode():
        for pos in range(start, n):
            got = fast.step(kv_fast, tokens[pos], pos, want_logits=pos % 3 == 0 or pos == n - 1)
            model.fast = None  # the torch forward, same weights
            want = model.forward(kv_ref, [tokens[pos]], pos, want_logits=got is not None)
            model.fast = fast
            if got is not None:
                worst = max(worst, (got - want).abs().max().item() / want.abs().max().item())
    assert worst < 2e-5
    assert torch.allclose(kv_fast[..., start:n, :], kv_ref[..., start:n, :], atol=1e-4, rtol=1e-4)


def test_fused_step_is_thread_count_independent(tiny):
    model = wide_model(tiny.tokenizer, tiny.chat, "q4_1")
    cfg = model.cfg
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            kv = torch.zeros(cfg.num_layers, 2, cfg.num_kv_heads, 300, cfg.head_dim)
            for pos in range(280):
                logits = model.fast.step(kv, (pos * 7) % cfg.vocab_size, pos, want_logits=True)
            results.append((logits, kv))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_step_rejects_bad_arguments(tiny):
    fast = tiny.fast
    cfg = tiny.cfg
    kv = torch.zeros(cfg.num_layers, 2, cfg.num_kv_heads, 8, cfg.head_dim)
    with pytest.raises(ValueError, match="position"):
        fast.step(kv, 1, 8, True)
    with pytest.raises(ValueError, match="vocab"):
        fast.step(kv, cfg.vocab_size, 0, True)
    with pytest.raises(ValueError, match="kv"):
        fast.step(kv[:, :, :, :, :-1], 1, 0, True)


FALLBACK_SCRIPT = textwrap.dedent(
    """
    import torch
    from ds4tui.engine.kernels import qgemv
    from ds4tui.engine.loader import load_model
    from tests.engine.kernels.test_kernels import random_blocks, wide_model
    print(qgemv.backend())
    for qtype in ("q4_1", "q8_0", "f16", "f32"):
        m = qgemv.QuantMatrix(random_blocks(qtype, 33, 64, seed=6), qtype, 64)
        x = torch.randn(64)
        w = m.dequantize()
        assert (m.matvec(x) - w @ x).abs().max() <= 1e-5 * (w.abs() @ x.abs()).max(), qtype
    tiny = load_model("tiny-llama")
    model = wide_model(tiny.tokenizer, tiny.chat, "q4_1")
    s = model.new_session(64)
    s.prefill([5, 6, 7])
    got = [s.decode(t).clone() for t in (8, 9)]
    model.fast = None
    r = model.new_session(64)
    r.prefill([5, 6, 7])
    want = [r.decode(t) for t in (8, 9)]
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(got, want))
    print("fused-step" if tiny.fast is not None else "torch-forward")
    """
)


@pytest.mark.parametrize("forced", ["scalar", "torch"])
def test_forced_backends_compute_the_same(forced, tmp_path):
    if forced == "scalar" and qgemv._compiler() is None:
        pytest.fail("no C compiler: the scalar build cannot be tested")  # fails, never hides
    env = dict(os.environ, DS4TUI_KERNELS=forced)
    root = str(Path(__file__).resolve().parents[3])  # the repository: `tests` importable
    proc = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], capture_output=True, text=True,
                          env=env, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [forced, "fused-step" if forced == "scalar" else "torch-forward"]


def test_no_compiler_falls_back_to_torch(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(qgemv, "_backend", None)
    monkeypatch.setattr(qgemv, "_lib", None)
    assert qgemv.backend() == "torch" and "no C compiler" in qgemv.backend_reason()
    m = qgemv.QuantMatrix(random_blocks("q8_0", 9, 64, seed=7), "q8_0", 64)
    x = torch.randn(64)
    assert torch.allclose(m.matvec(x), m.dequantize() @ x, atol=1e-5)
    monkeypatch.undo()  # the real library again for the other tests
    assert qgemv.backend() != "torch" or qgemv._compiler() is None


def test_gguf_blocks_reach_the_step(tiny, tmp_path, monkeypatch):
    from tests.engine.llama.test_gguf import write_tiny_gguf

    from ds4tui.engine.llama.gguf import load_llama_gguf
    from ds4tui.engine.llama.tiny import ensure_tiny_llama

    hf_dir = ensure_tiny_llama()
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "tiny-q4_1.gguf"
    write_tiny_gguf(hf_dir, path, Q.Q4_1)
    for _ in range(2):  # the conversion, then the converted copy
        model = load_llama_gguf(path, "tiny-gguf")
        assert set(model.fast.types.values()) == {"q4_1"}
        prompt = model.tokenizer.encode(model.chat.render([{"role": "user", "content": "Hi there"}]))
        a = model.new_session(128)
        a.prefill(prompt)
        fast = model.fast
        model.fast = None
        b = model.new_session(128)
        b.prefill(prompt)
        for _ in range(5):
            tok = int(a.logits.argmax())
            assert tok == int(b.logits.argmax())
            la = a.decode(tok)
            model.fast, lb = None, b.decode(tok)
            model.fast = fast
            # a wrong q/k row order in the blocks would be off by O(1)
            assert (la - lb).abs().max() <= 1e-4 * lb.abs().max()
        model.fast = fast


@pytest.mark.real_model
def test_smollm2_decodes_through_the_file_blocks():
    from ds4tui.engine.registry import DEFAULT_MODEL

    model = load_model(DEFAULT_MODEL)
    fast = model.fast
    assert fast is not None and fast.types["layers.0.wqkv"] == "q4_1" and fast.types["embed"] == "q8_0"
    text = model.chat.render([{"role": "user", "content": "What is the capital of France?"}])
    a = model.new_session(128)
    a.prefill(model.tokenizer.encode(text))
    b = model.new_session(128)  # the same state, continued by the torch forward
    b.kv.copy_(a.kv)
    b.tokens, b.logits = list(a.tokens), a.logits
    worst, out = 0.0, []
    try:
        for _ in range(6):
            tok = int(a.logits.argmax())
            out.append(tok)
            la = a.decode(tok)
            model.fast = None
            lb = b.decode(tok)
            model.fast = fast
            worst = max(worst, (la - lb).abs().max().item())
    finally:
        model.fast = fast
    assert worst < 1e-3, worst  # measured ~5e-5: the same dequantized values, other rounding order
    assert "Paris" in model.tokenizer.decode(out)
