"""The C kernels: dequantization, GEMV and block GEMM per weight type and per ISA variant, and the
fused llama decode step, against gguf.quants and torch references."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ds4tui.engine.kernels import build, qgemv, quants
from ds4tui.engine.kernels.llama_step import FastDecoder
from ds4tui.engine.kernels.qgemv import QuantMatrix
from ds4tui.engine.llama.model import LlamaConfig, LlamaModel
from ds4tui.engine.llama.weights import hf_to_internal, make_info
from ds4tui.engine.loader import load_model
from ds4tui.engine.llama.tiny import CONFIG, random_llama_weights

BLOCK_TYPES = list(quants.BLOCK_TYPES)
TYPES = BLOCK_TYPES + ["f32"]
# SmolLM2's head_dim (64) at toy width, rows and columns multiples of 256 so that every
# type (K-quants included) fits; 4 query heads per KV head; 2 layers.
WIDE = dict(CONFIG, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=1)
# A Q4_K_M-like mix: V, up and down rows in Q6_K, the rest Q4_K (fused matrices in two parts).
MIX = "q4_k_m"


def random_blocks(qtype: str, rows: int, cols: int, seed: int, scale: float = 0.05) -> torch.Tensor:
    """Valid random blocks: arbitrary quant bytes and sub-block scales (every value occurs),
    finite f16 block scales chosen so that weights are of order `scale`."""
    gen = torch.Generator().manual_seed(seed)
    _, qk, bs = quants.TYPES[qtype]
    if qk == 1:
        return quants.quantize(torch.randn(rows, cols, generator=gen) * scale, qtype)
    nb = cols // qk
    b = torch.randint(0, 256, (rows, nb, bs), generator=gen, dtype=torch.uint8)

    def f16(s: float, sign: float = 1.0) -> torch.Tensor:
        v = (torch.rand(rows, nb, 1, generator=gen) * s * sign).half()
        return v.view(torch.uint8).reshape(rows, nb, 2)

    if qtype in ("q4_0", "q5_0", "q8_0"):
        b[..., 0:2] = f16(scale / 8)
    elif qtype in ("q4_1", "q5_1"):
        b[..., 0:2], b[..., 2:4] = f16(scale / 8), f16(scale, -1.0)  # d, m
    elif qtype in ("q4_k", "q5_k"):
        b[..., 0:2], b[..., 2:4] = f16(scale / 300), f16(scale / 60)  # d, dmin
    elif qtype == "q6_k":
        b[..., 208:210] = f16(scale / 1000)
    elif qtype == "q2_k":
        b[..., 80:82], b[..., 82:84] = f16(scale / 20), f16(scale / 20)  # d, dmin
    elif qtype == "iq2_xxs":  # every byte pattern is a valid block; d sets the magnitude
        b[..., 0:2] = f16(scale / 200)
    return b.reshape(rows, -1)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("qtype", TYPES)
def test_c_dequantization_is_ggufs_bit_for_bit(qtype, variant):
    blocks = random_blocks(qtype, 7, 512, seed=1)
    want = quants.dequantize(blocks, qtype, 512)  # gguf.quants.dequantize itself
    with qgemv.use_variant(variant):
        got = qgemv.dequantize_c(blocks, qtype, 512)
    assert torch.equal(bits(got), bits(want))


def iq2_xxs_every_code() -> torch.Tensor:
    """IQ2_XXS blocks whose groups of 8 run through every grid index, every 7-bit sign field
    and every 4-bit scale (32 groups per block, 8 blocks per row)."""
    rows, nb = 4, 8
    b = np.zeros((rows, nb, 66), dtype=np.uint8)
    b[..., 0:2] = np.array([0.01], dtype=np.float16).view(np.uint8)
    g = np.arange(rows * nb * 32).reshape(rows, nb, 8, 4)  # [row, block, sub-block, group]
    a0 = (g % 256).astype(np.uint32) << (8 * np.arange(4, dtype=np.uint32))
    a1 = ((g * 37) % 128).astype(np.uint32) << (7 * np.arange(4, dtype=np.uint32))
    words = np.stack([a0.sum(-1, dtype=np.uint32), a1.sum(-1, dtype=np.uint32) | ((g[..., 0] // 4 % 16).astype(np.uint32) << 28)], -1)
    b[..., 2:] = words.astype("<u4").view(np.uint8).reshape(rows, nb, 64)
    return torch.from_numpy(b.reshape(rows, -1))


def test_iq2_xxs_grid_signs_and_scales_are_ggufs(variant):
    from gguf.quants import IQ2_XXS

    blocks = iq2_xxs_every_code()
    want = quants.dequantize(blocks, "iq2_xxs", 2048)
    with qgemv.use_variant(variant):
        got = qgemv.dequantize_c(blocks, "iq2_xxs", 2048)
    assert torch.equal(bits(got), bits(want))
    # The format itself: magnitudes / db are codebook entries, an even number of negatives per 8.
    IQ2_XXS.init_grid()
    grid = torch.from_numpy(np.asarray(IQ2_XXS.grid, dtype=np.float32).reshape(256, 8))
    groups = got.reshape(-1, 8)
    idx = torch.arange(groups.shape[0]) % 256
    scale = groups.abs() / grid[idx]
    assert torch.allclose(scale, scale[:, :1].expand_as(scale), rtol=1e-6)
    assert ((groups < 0).sum(1) % 2 == 0).all() and (groups < 0).any()
    assert set(grid.unique().tolist()) == {8.0, 25.0, 43.0}


@pytest.mark.parametrize("qtype", ["q2_k", "iq2_xxs"])
def test_plain_2_bit_quantizers_write_blocks_near_the_weights(qtype):
    """simple_quants (gguf-py cannot quantize these): gguf decodes its blocks to values near w."""
    w = torch.randn(16, 512, generator=torch.Generator().manual_seed(5)) * 0.05
    back = quants.dequantize(quants.quantize(w, qtype), qtype, 512)
    assert ((back - w).norm() / w.norm()).item() < 0.4  # 2 bits: ~0.33 here (llama.cpp's search: less)
    assert ((back > 0) == (w > 0)).float().mean().item() > 0.85  # signs kept (IQ2_XXS: one in 8 may flip)
    zero = quants.dequantize(quants.quantize(torch.zeros(2, 256), qtype), qtype, 256)
    assert torch.equal(zero, torch.zeros(2, 256))


@pytest.mark.parametrize("qtype", ["f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
def test_quantize_is_ggufs_and_round_trips(qtype):
    w = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)) * 0.1
    back = quants.dequantize(quants.quantize(w, qtype), qtype, 64)
    tol = {"f16": 1e-3, "bf16": 1e-2, "q8_0": 1e-2}.get(qtype, 0.1)
    assert (back - w).abs().max() <= tol * w.abs().max()


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows", [301, 302])
def test_matvec_and_matmul_equal_the_dequantized_product(qtype, variant, rows):
    # Two pool chunks of 152 rows and 149 or 150: after the AVX-512 build's rows in fours,
    # an odd row (301) or a row pair (302) is left.
    cols = 512
    m = QuantMatrix(random_blocks(qtype, rows, cols, seed=2), qtype, cols)
    w = m.dequantize().double()
    x = torch.randn(5, cols, generator=torch.Generator().manual_seed(3))
    with qgemv.use_variant(variant), qgemv.use_bf16(False):  # fp32 tiles (bf16 ones: test_qgemm.py)
        y = m.matvec(x[0])
        out = torch.empty(rows)
        assert m.matvec(x[0], out) is out and torch.equal(out, y)
        ys = m.matmul(x)
    scale = (x.abs().double() @ w.abs().T).max()  # magnitude of the summed terms
    assert ((y.double() - w @ x[0].double()).abs().max() / scale).item() < 1e-6
    assert ((ys.double() - x.double() @ w.T).abs().max() / scale).item() < 1e-6
    with pytest.raises(ValueError):
        m.matvec(x[0, :-1])


def test_row_parts_of_different_types_stack(variant):
    """A fused matrix in parts (Q4_K q/k rows, Q6_K v rows): the same as its dequantized rows."""
    cols = 256
    parts = [("q4_k", random_blocks("q4_k", 40, cols, 4)), ("q6_k", random_blocks("q6_k", 9, cols, 5)),
             ("q8_0", random_blocks("q8_0", 3, cols, 6))]
    m = QuantMatrix.from_parts(parts, cols)
    assert (m.rows, m.qtype) == (52, "mixed")
    w = torch.cat([quants.dequantize(b, t, cols) for t, b in parts]).double()
    x = torch.randn(3, cols)
    with qgemv.use_variant(variant), qgemv.use_bf16(False):
        y, ys = m.matvec(x[0]), m.matmul(x)
    scale = (x.abs().double() @ w.abs().T).max()
    assert ((y.double() - w @ x[0].double()).abs().max() / scale).item() < 1e-6
    assert ((ys.double() - x.double() @ w.T).abs().max() / scale).item() < 1e-6
    merged = QuantMatrix.cat([QuantMatrix(parts[0][1][:20], "q4_k", cols), QuantMatrix(parts[0][1][20:], "q4_k", cols),
                              QuantMatrix(parts[1][1], "q6_k", cols)])
    assert [t for t, _ in merged.parts] == ["q4_k", "q6_k"]  # same-type neighbours merged


def test_results_do_not_depend_on_the_thread_count(variant):
    m = qgemv.QuantMatrix(random_blocks("q4_k", 1000, 512, seed=4), "q4_k", 512)
    x = torch.randn(23, 512)
    before = torch.get_num_threads()
    results = []
    try:
        with qgemv.use_variant(variant):
            for threads in (1, 2):
                torch.set_num_threads(threads)
                results.append((m.matvec(x[0]), m.matmul(x)))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_the_widest_variant_this_cpu_runs_is_chosen():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if build.find_compiler() is None or os.environ.get("DS4TUI_KERNELS", "auto") != "auto":
        pytest.skip("a forced or compiler-less backend is tested by test_forced_variants_compute_the_same")
    if {"avx512f", "avx512bw", "avx512vl", "avx2", "fma"} <= flags:
        expected = "avx512"
    elif {"avx2", "fma"} <= flags:
        expected = "avx2"
    else:
        expected = "scalar"
    assert qgemv.backend() == expected, qgemv.backend_reason()
    assert qgemv.variants()[-1] == expected and qgemv.variants()[0] == "scalar"
    with pytest.raises(ValueError):
        with qgemv.use_variant("avx1024"):
            pass


def test_quant_mix_names_fast_and_fallback_tensors():
    mix = quants.quant_mix([("Q4_K", 512), ("Q4_K", 2048), ("Q6_K", 512), ("Q4_K", 576), ("IQ4_NL", 64),
                            ("F32", 64), ("Q8_0", 64)])
    assert mix.fast == {"Q4_K": 2, "Q6_K": 1, "F32": 1, "Q8_0": 1}
    assert mix.fallback == {"Q4_K": 1, "IQ4_NL": 1}  # 576 is not whole 256-blocks
    assert mix.summary() == "Q4_K x2, F32 x1, Q6_K x1, Q8_0 x1 (C kernels); IQ4_NL x1, Q4_K x1 (fp32 fallback)"
    assert quants.QuantMix.from_dict(mix.as_dict()) == mix


def _wide_raw(tensors: dict, qtype: str, seed: int) -> dict:
    """Replace every matrix (the embedding aside) by random `qtype` blocks' values; return the raw entries."""
    raw = {}
    for k, (name, t) in enumerate(sorted(tensors.items())):
        if t.dim() != 2 or name == "embed" or qtype == "f32":
            continue
        rows, cols = t.shape
        if qtype == MIX and name.endswith(("wqkv", "w13")):
            split = rows - WIDE["hidden_size"] // WIDE["num_attention_heads"] if name.endswith("wqkv") else rows // 2
            parts = [("q4_k", random_blocks("q4_k", split, cols, seed + k)),
                     ("q6_k", random_blocks("q6_k", rows - split, cols, seed + k + 1000))]
        else:
            kind = "q6_k" if qtype == MIX and name.endswith("w2") else "q4_k" if qtype == MIX else qtype
            parts = [(kind, random_blocks(kind, rows, cols, seed + k))]
        raw[name] = parts
        tensors[name] = torch.cat([quants.dequantize(b, kt, cols) for kt, b in parts])
    return raw


def wide_model(tokenizer, chat, qtype: str, seed: int = 11, config: dict = WIDE) -> LlamaModel:
    """A random WIDE-config model whose fp32 weights are exactly its `qtype` blocks' values."""
    cfg = LlamaConfig.from_hf(config)
    tensors = hf_to_internal(cfg, random_llama_weights(config, seed=seed), "test")
    raw = _wide_raw(tensors, qtype, seed)
    info = make_info(f"wide-{qtype}", cfg, f"test-{qtype}", 32)
    return LlamaModel(cfg, tensors, info, tokenizer, chat, "test", raw=raw)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


def _step_vs_torch(model, ctx=320, start=248, n=264, variant=None, kv_dtype="f32"):
    """Decode positions start..n-1 with the C step and with the torch forward; return the
    worst relative logit difference and both KV buffers."""
    cfg = model.cfg
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
    ref = model.new_session(ctx, kv_dtype=kv_dtype)
    fast, worst, logits = model.fast, 0.0, []
    # Both sides on one variant, fp32 products (pinned: the defaults depend on the CPU).
    with torch.inference_mode(), qgemv.use_variant(variant or qgemv.backend()), qgemv.use_bf16(False):
        ref.prefill(tokens[:start])  # torch fp32 prefill writes the first rows for both
        kv_ref, kv_fast = ref.kv, ref.kv.clone()
        for pos in range(start, n):
            got = fast.step(kv_fast, tokens[pos], pos, want_logits=pos % 3 == 0 or pos == n - 1)
            model.fast = None  # the torch forward, same weights
            want = model.forward(kv_ref, [tokens[pos]], pos, want_logits=got is not None)
            model.fast = fast
            if got is not None:
                logits.append(got)
                worst = max(worst, (got - want).abs().max().item() / want.abs().max().item())
    return worst, kv_fast, kv_ref, logits


@pytest.mark.parametrize("qtype", TYPES + [MIX])
def test_fused_step_matches_the_torch_forward(tiny, qtype):
    model = wide_model(tiny.tokenizer, tiny.chat, qtype)
    assert isinstance(model.fast, FastDecoder)
    want_types = {"f32"} if qtype == "f32" else {"q4_k+q6_k", "q4_k", "q6_k"} if qtype == MIX else {qtype}
    assert set(model.fast.types.values()) == want_types
    worst, kv_fast, kv_ref, _ = _step_vs_torch(model)  # positions 248..263 cross the 256-row block
    assert worst < 2e-5
    assert torch.allclose(kv_fast[..., 248:264, :], kv_ref[..., 248:264, :], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_fused_step_matches_the_torch_forward_over_long_attention_blocks(tiny, kv_dtype):
    """4 KV heads of 64 past 1,536 positions: the step's attention blocks double to 512 rows
    (a layer keeps 16 of them), and each V pass serves G = 2 query heads."""
    config = dict(WIDE, hidden_size=512, num_attention_heads=8, num_key_value_heads=4)
    model = wide_model(tiny.tokenizer, tiny.chat, "q8_0", config=config)
    worst, kv_fast, kv_ref, _ = _step_vs_torch(model, ctx=1560, start=1530, n=1542, kv_dtype=kv_dtype)
    assert worst < (2e-5 if kv_dtype == "f32" else 5e-4)
    tol = 1e-4 if kv_dtype == "f32" else 2e-3
    assert torch.allclose(kv_fast[..., 1530:1542, :].float(), kv_ref[..., 1530:1542, :].float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("qtype", ["q4_k", "f32"])
def test_fused_step_reads_and_writes_f16_kv_like_the_torch_forward(tiny, qtype):
    """An f16 buffer: the step rounds its new rows to nearest-even f16 and reads f16 rows as
    it goes; the torch forward converts the rows it uses. Two f32 paths that differ in
    summation order may round a row to neighbouring f16 values, hence one f16 step of slack."""
    model = wide_model(tiny.tokenizer, tiny.chat, qtype)
    worst, kv_fast, kv_ref, _ = _step_vs_torch(model, kv_dtype="f16")
    assert kv_fast.dtype == kv_ref.dtype == torch.float16
    assert worst < 5e-4
    assert torch.allclose(kv_fast[..., 248:264, :].float(), kv_ref[..., 248:264, :].float(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
@pytest.mark.parametrize("variant", qgemv.ISAS[1:], indirect=True)
def test_every_variant_steps_like_the_scalar_one(tiny, variant, kv_dtype):
    """f16: the scalar build's own f32 -> f16 rounding and f16 reads against F16C's."""
    model = wide_model(tiny.tokenizer, tiny.chat, MIX)
    _, kv_s, _, logits_s = _step_vs_torch(model, ctx=280, start=250, n=262, variant="scalar", kv_dtype=kv_dtype)
    _, kv_v, _, logits_v = _step_vs_torch(model, ctx=280, start=250, n=262, variant=variant, kv_dtype=kv_dtype)
    tol = 1e-5 if kv_dtype == "f32" else 5e-4  # f16: a row may round to the neighbouring value
    for a, b in zip(logits_s, logits_v):
        assert (a - b).abs().max() <= tol * a.abs().max()
    rows_s, rows_v = kv_s[..., :262, :].float(), kv_v[..., :262, :].float()  # rows past 262: unwritten
    assert torch.allclose(rows_s, rows_v, atol=1e-5 if kv_dtype == "f32" else 2e-3, rtol=1e-5 if kv_dtype == "f32" else 2e-3)


def test_fused_step_is_thread_count_independent(tiny):
    model = wide_model(tiny.tokenizer, tiny.chat, MIX)
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
    for qtype in ("q4_k", "q8_0", "f16", "f32"):
        m = qgemv.QuantMatrix(random_blocks(qtype, 33, 256, seed=6), qtype, 256)
        x = torch.randn(256)
        w = m.dequantize()
        assert (m.matvec(x) - w @ x).abs().max() <= 1e-5 * (w.abs() @ x.abs()).max(), qtype
    tiny = load_model("tiny-llama")
    model = wide_model(tiny.tokenizer, tiny.chat, "q4_k_m")
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


@pytest.mark.slow  # a fresh interpreter per variant, with torch and a model
@pytest.mark.parametrize("forced", ["scalar", "torch"])
def test_forced_variants_compute_the_same(forced, tmp_path):
    if forced == "scalar" and build.find_compiler() is None:
        pytest.fail("no C compiler: the scalar build cannot be tested")  # fails, never hides
    env = dict(os.environ, DS4TUI_KERNELS=forced)
    root = str(Path(__file__).resolve().parents[3])  # the repository: `tests` importable
    proc = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], capture_output=True, text=True,
                          env=env, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [forced, "fused-step" if forced == "scalar" else "torch-forward"]


def test_no_compiler_falls_back_to_torch(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(qgemv, "PREBUILT", tmp_path / "none" / "libds4k.so")  # an install whose build had no compiler
    monkeypatch.setattr(qgemv, "_backend", None)
    monkeypatch.setattr(qgemv, "_lib", None)
    assert qgemv.backend() == "torch" and "no C compiler" in qgemv.backend_reason()
    m = qgemv.QuantMatrix(random_blocks("q6_k", 9, 256, seed=7), "q6_k", 256)
    x = torch.randn(256)
    assert torch.allclose(m.matvec(x), m.dequantize() @ x, atol=1e-5)
    monkeypatch.undo()  # the real library again for the other tests
    assert qgemv.backend() != "torch" or build.find_compiler() is None


def _tiny_gguf_model(tmp_path, monkeypatch, per_tensor, qtype=Q.Q4_1):
    from tests.engine.llama.test_gguf import write_tiny_gguf

    from ds4tui.engine.llama.gguf import load_llama_gguf
    from ds4tui.engine.llama.tiny import ensure_tiny_llama

    hf_dir = ensure_tiny_llama()
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(hf_dir, path, qtype, per_tensor)
    return path, load_llama_gguf


# Every 32-block type in one file: fused q/k/v and gate/up in parts of different types.
MIXED = {"attn_q": Q.Q4_0, "attn_k": Q.Q4_0, "attn_v": Q.Q5_1, "attn_output": Q.Q8_0, "ffn_gate": Q.Q5_0,
         "ffn_up": Q.BF16, "ffn_down": Q.F16}


@pytest.mark.parametrize("per_tensor", [{}, MIXED], ids=["q4_1", "mixed"])
def test_gguf_blocks_reach_the_step(tmp_path, monkeypatch, per_tensor):
    path, load_llama_gguf = _tiny_gguf_model(tmp_path, monkeypatch, per_tensor)
    with qgemv.use_bf16(False):  # fp32 products on both sides: a wrong row order shows at 1e-4
        _blocks_reach_the_step(load_llama_gguf, path, per_tensor)


def _blocks_reach_the_step(load_llama_gguf, path, per_tensor):
    want = {"layers.0.wqkv": "q4_0+q5_1", "layers.0.wo": "q8_0", "layers.0.w13": "q5_0+bf16", "layers.0.w2": "f16",
            "lm_head": "q4_1"} if per_tensor else {"layers.0.wqkv": "q4_1", "lm_head": "q4_1"}
    for _ in range(2):  # the conversion, then the converted copy
        model = load_llama_gguf(path, "tiny-gguf")
        assert {k: model.fast.types[k] for k in want} == want
        assert model.quant_mix.fallback == {}
        assert sum(model.quant_mix.fast.values()) == 2 * 7 + 2  # 7 per layer, embedding, head
        prompt = model.tokenizer.encode(model.chat.render([{"role": "user", "content": "Hi there"}]))
        a = model.new_session(128)
        a.prefill(prompt)  # short: the block GEMM (qgemm.c)
        fast = model.fast
        model.fast = None
        b = model.new_session(128)
        b.prefill(prompt)
        model.fast = fast
        assert (a.logits - b.logits).abs().max() <= 1e-4 * b.logits.abs().max()
        for _ in range(5):
            tok = int(a.logits.argmax())
            assert tok == int(b.logits.argmax())
            la = a.decode(tok)
            model.fast, lb = None, b.decode(tok)
            model.fast = fast
            # a wrong q/k row order in the blocks would be off by O(1)
            assert (la - lb).abs().max() <= 1e-4 * lb.abs().max()


def _iq4_nl(arr):
    """Valid random IQ4_NL blocks (a type gguf dequantizes but the kernels do not read)."""
    rows, cols = arr.shape
    rng = np.random.default_rng(0)
    b = rng.integers(0, 256, (rows, cols // 32, 18), dtype=np.uint8)
    b[..., 0:2] = (rng.random((rows, cols // 32, 1)) * 0.001).astype(np.float16).view(np.uint8)
    return b.reshape(rows, -1), Q.IQ4_NL


def test_a_type_the_kernels_do_not_read_falls_back_to_fp32(tmp_path, monkeypatch):
    path, load_llama_gguf = _tiny_gguf_model(tmp_path, monkeypatch, {"ffn_down": _iq4_nl})
    model = load_llama_gguf(path, "tiny-gguf")
    assert model.fast.types["layers.0.w2"] == "f32" and model.fast.types["layers.0.wqkv"] == "q4_1"
    assert model.quant_mix.fallback == {"IQ4_NL": 2}
    assert model.quant_mix.summary().endswith("IQ4_NL x2 (fp32 fallback)")
    s = model.new_session(32)
    s.prefill([5, 6, 7])
    assert torch.isfinite(s.decode(8)).all()


def test_a_type_gguf_cannot_dequantize_is_a_one_line_error(tmp_path, monkeypatch):
    from ds4tui.engine.errors import WeightsError

    def int8(arr):
        return np.zeros(arr.shape, dtype=np.int8), Q.I8

    path, load_llama_gguf = _tiny_gguf_model(tmp_path, monkeypatch, {"ffn_down": int8})
    with pytest.raises(WeightsError) as exc:
        load_llama_gguf(path, "tiny-gguf")
    msg = str(exc.value)
    assert "\n" not in msg and "blk.0.ffn_down.weight" in msg and "I8" in msg and "Q4_K" in msg


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_smollm2_decodes_through_the_file_blocks(kv_dtype):
    from ds4tui.engine.registry import DEFAULT_MODEL

    model = load_model(DEFAULT_MODEL)
    fast = model.fast
    assert fast is not None and fast.types["layers.0.wqkv"] == "q4_1" and fast.types["embed"] == "q8_0"
    assert model.quant_mix.summary() == "Q4_1 x210, Q8_0 x1 (C kernels)"
    from ds4tui.bench.engine_bench import measure_engine

    r = measure_engine(DEFAULT_MODEL, prompt_tokens=4, decode_tokens=2, repeats=1)
    bf16 = " (prefill products in bf16)" if qgemv.bf16_products() else ""
    assert (r.weights, r.kernels) == ("Q4_1 x210, Q8_0 x1 (C kernels)", f"{qgemv.backend()}{bf16}, fused C decode step")
    text = model.chat.render([{"role": "user", "content": "What is the capital of France?"}])
    a = model.new_session(128, kv_dtype=kv_dtype)
    a.prefill(model.tokenizer.encode(text))
    b = model.new_session(128, kv_dtype=kv_dtype)  # the same state, continued by the torch forward
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
    # f32 measured ~5e-5: the same dequantized values, other rounding order; f16 ~5e-3: a row
    # that the two orders put either side of an f16 rounding boundary differs by one f16 step
    assert worst < (1e-3 if kv_dtype == "f32" else 2e-2), worst
    assert "Paris" in model.tokenizer.decode(out)


def test_other_architectures_build_only_the_portable_variant(monkeypatch):
    import platform

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    names = [name for _, name in build.objects("cc")]
    assert names == ["pool.o", "dispatch.o", "isa_scalar.o"]
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert [name for _, name in build.objects("cc")][2:] == ["isa_scalar.o", "isa_avx2.o", "isa_avx512.o"]


def test_long_chunks_take_the_blocks_with_every_vector_variant(tiny, variant, monkeypatch):
    """A 300-row chunk (over _SMALL_ROWS) multiplies by the file's blocks with AVX2 and AVX-512
    (their qgemm.c tiles beat torch's fp32 GEMM at every size) and by the fp32 copy with
    portable C, whose blocks only win on short chunks."""
    model = wide_model(tiny.tokenizer, tiny.chat, "q4_k")
    model.use_c_layers = False  # the per-layer steps in Python, where the products can be seen
    calls = []
    real = QuantMatrix.matmul
    monkeypatch.setattr(QuantMatrix, "matmul", lambda self, x: calls.append(x.shape[0]) or real(self, x))
    tokens = torch.randint(0, model.cfg.vocab_size, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode(), qgemv.use_variant(variant):
        model.forward(model.new_session(320).kv, tokens, 0, want_logits=False)
    assert (300 in calls) == (variant != "scalar")
