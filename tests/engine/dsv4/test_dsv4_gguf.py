"""ds4's DeepSeek V4 GGUF layout: a tiny model written in it (ds4's names, keys and types, routed
experts in IQ2_XXS and Q2_K, projections in Q8_0) loads memory-mapped with every matrix left in
the file's blocks, and computes what the same weights loaded from safetensors compute."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ds4tui.engine.dsv4 import gguf_layout as L
from ds4tui.engine.dsv4 import residency
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.dsv4.gguf import load_dsv4_gguf
from ds4tui.engine.dsv4.gguf_write import write_dsv4_gguf
from ds4tui.engine.dsv4.linear import ExpertBank, linear
from ds4tui.engine.dsv4.model import Dsv4Model, load_dsv4
from ds4tui.engine.dsv4.net import Dsv4Trace
from ds4tui.engine.dsv4.tiny import CONFIG, SPECIAL_TOKENS, VOCAB, random_tensors, write_checkpoint
from ds4tui.engine.errors import WeightsError
from ds4tui.engine.kernels import qgemv
from ds4tui.engine.kernels.qgemv import QuantMatrix
from ds4tui.engine.loader import load_model
from ds4tui.engine.text.dsv4_chat import ASSISTANT, BOS, USER
from ds4tui.engine.text.tiny_tokenizer import train_tiny_tokenizer

# tiny-dsv4's recipe (six layers: window-only, CSA with indexer, HCA; hash and top-k routing) at
# the width whose rows the 256-weight K-quant blocks need (tiny-dsv4 itself: hidden 128, F 64).
WIDE = dict(CONFIG, hidden_size=256, moe_intermediate_size=256)
# The continuous model: without the QAT round trips and f16 cache rounding, a last-bit difference
# between two summation orders cannot flip a rounding step, so the two loads compare closely.
# (and fp32 activations: the safetensors model has no 8-bit activation path)
SMOOTH = dict(qat_kv_fp8=False, qat_indexer_fp4=False, cache_f16=False, act_q8=False)
TOKENS = [3 + (7 * i) % 500 for i in range(70)]  # past the window (16) and the indexer's top-8 rows


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    cfg = Dsv4Config.from_hf(WIDE)
    tok = train_tiny_tokenizer(SPECIAL_TOKENS, VOCAB)
    path = tmp_path_factory.mktemp("gguf") / "tiny-v4-q2.gguf"
    held = write_dsv4_gguf(path, cfg, random_tensors(cfg), tok)
    return path, cfg, held, tok


def _run(model, tokens=TOKENS, decode=(9, 11, 13)) -> Dsv4Trace:
    s = model.new_session(256)
    s.trace = Dsv4Trace(all_logits=True)
    s.prefill(tokens)
    for t in decode:
        s.decode(t)
    return s.trace


def _logits(trace: Dsv4Trace) -> torch.Tensor:
    return torch.stack([trace.logits[p] for p in sorted(trace.logits)])


def test_the_file_has_ds4s_names_keys_and_types(written):
    import gguf

    path, cfg, _, _ = written
    r = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert r.fields["general.architecture"].contents() == "deepseek4"
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.5.ffn_up_exps.weight"] == "IQ2_XXS"
    assert types["blk.3.ffn_down_exps.weight"] == "Q2_K"
    assert types["blk.2.attn_q_a.weight"] == types["output.weight"] == types["blk.4.ffn_down_shexp.weight"] == "Q8_0"
    assert types["token_embd.weight"] == types["blk.1.hc_ffn_fn.weight"] == types["blk.2.indexer.proj.weight"] == "F16"
    assert types["blk.0.ffn_gate_tid2eid.weight"] == "I32" and "blk.3.ffn_gate_tid2eid.weight" not in types
    assert "blk.3.attn_compressor_kv.weight" in types and "blk.3.indexer.proj.weight" not in types  # HCA: no indexer
    # GGUF order: ne0 is the row length; experts [D, F, E]
    assert r.tensors[[t.name for t in r.tensors].index("blk.0.ffn_gate_exps.weight")].shape.tolist() == [256, 256, 8]
    assert list(r.fields["deepseek4.attention.compress_ratios"].contents()) == cfg.compress_ratios
    assert r.fields["tokenizer.ggml.pre"].contents() == "joyai-llm"


def test_the_gguf_model_computes_what_the_safetensors_model_does(written, tmp_path):
    """The same values (the file's blocks dequantized) through safetensors and the dense torch
    path, against the GGUF through the C kernels: logits at every position within 1e-4 of their
    spread (summation order), and identical expert and indexer choices."""
    path, cfg, held, _ = written
    st = write_checkpoint(tmp_path / "st", held, names="hf", config=WIDE)
    dense = load_dsv4(st, "st", **SMOOTH)
    quant = load_dsv4_gguf(path, "gguf", **SMOOTH)
    a, b = _run(quant), _run(dense)
    la, lb = _logits(a), _logits(b)
    assert la.shape == (len(TOKENS) + 3, VOCAB)
    assert ((la - lb).abs().max() / lb.std()).item() < 1e-4
    assert a.experts == b.experts and a.indexer == b.indexer
    # the indexer chose: 8 of the 17 CSA rows the last tokens see
    assert max(len(v) for v in a.indexer.values()) == cfg.index_topk < (len(TOKENS) + 1) // 4
    # and that tolerance tells models apart: weights 1% larger differ by far more
    scaled = {k: (v * 1.01 if v.is_floating_point() else v) for k, v in held.items()}
    other = _run(load_dsv4(write_checkpoint(tmp_path / "o", scaled, names="hf", config=WIDE), "o", **SMOOTH),
                 TOKENS[:20], decode=())
    assert ((_logits(other) - lb[:20]).abs().max() / lb.std()).item() > 1e-3


def _matrices(obj, path="w"):
    """Every QuantMatrix and ExpertBank among the net's weights, with its path."""
    if isinstance(obj, (QuantMatrix, ExpertBank)):
        yield path, obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _matrices(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from _matrices(x, f"{path}[{i}]")


def test_every_matrix_stays_in_the_file_mapping(written):
    """Nothing dequantized or copied at load: every matrix (and every expert) is a view of the
    mapped file's bytes, in the file's type."""
    path, cfg, _, _ = written
    model = load_dsv4_gguf(path, "gguf")
    base = model.reader.data.ctypes.data
    end = base + model.reader.data.nbytes
    found = dict(_matrices(model.net.w))
    kinds = {}
    for name, m in found.items():
        blocks = m.blocks if isinstance(m, ExpertBank) else m.parts[0][1]
        assert base <= blocks.data_ptr() and blocks.data_ptr() + blocks.numel() <= end, name
        kinds[m.qtype] = kinds.get(m.qtype, 0) + 1
    # Q8_0: 5 attention and 3 shared-expert projections a layer, the head; F16: 2 HC and the router
    # a layer, 2 per compressor (4 layers) and indexer (2), 2 more per indexer, the head's HC
    assert kinds == {"q8_0": 6 * 8 + 1, "f16": 6 * 3 + 4 * 2 + 2 * 4 + 1, "iq2_xxs": 12, "q2_k": 6}
    assert model.info.quant_bits == 2 and model.info.family == "dsv4"
    assert model.quant_mix.summary() == "Q8_0 x49, F16 x35, IQ2_XXS x12, Q2_K x6 (C kernels)"
    assert "weights Q8_0 x49, F16 x35, IQ2_XXS x12, Q2_K x6 (C kernels)" in model.describe()


@pytest.mark.skipif(not residency.available(), reason="reads /proc/self/pagemap (Linux)")
def test_a_token_reads_only_the_experts_it_selected(written):
    """With the file evicted from the page cache and unmapped, one decode step maps pages of
    exactly the experts the router picked for it, in every layer and matrix (2 of 8 here), and
    no more pages than those experts' rows span."""
    path, cfg, _, _ = written
    model = load_dsv4_gguf(path, "gguf")
    s = model.new_session(64)
    s.prefill(TOKENS[:5])
    residency.forget_pages(model)
    assert residency.mapped_bytes(model) == 0
    s.trace = Dsv4Trace()
    s.decode(42)
    pages = residency.expert_pages(model)
    assert len(pages) == 3 * cfg.num_hidden_layers
    for (li, w), p in pages.items():
        chosen = set(s.trace.experts[(li, 5)])
        assert p.experts == chosen, (li, w)
        span = -(-p.bytes_per_expert // residency.PAGE) + 1  # a run of that many bytes covers at most this
        assert 0 < p.mapped <= len(chosen) * span < p.pages, (li, w)


@pytest.mark.parametrize("n", [1, 5])
def test_the_quantized_products_equal_their_dequantized_reference(written, n):
    path, _, held, _ = written
    model = load_dsv4_gguf(path, "gguf", act_q8=False)  # fp32 activations (8-bit: tests/engine/kernels/test_qdot.py)
    gen = torch.Generator().manual_seed(n)
    for name, m in _matrices(model.net.w):
        mats = [m[e] for e in range(len(m))] if isinstance(m, ExpertBank) else [m]
        for q in mats:
            x = torch.randn(n, q.cols, generator=gen)
            w = q.dequantize().double()
            scale = (x.abs().double() @ w.abs().T).max()
            assert ((linear(x, q).double() - x.double() @ w.T).abs().max() / scale).item() < 1e-6, name
    # the file holds the values the writer reported (gguf's dequantization of what it wrote)
    layer = model.net.w.layers[3]
    assert torch.equal(layer.moe.w2[5].dequantize(), held["layers.3.ffn.experts.5.w2.weight"])
    assert torch.equal(layer.attn.wq_a.dequantize(), held["layers.3.attn.wq_a.weight"])
    if qgemv.library() is not None:  # and the C dequantization gives the same bits
        qtype, blocks = layer.moe.w1[2].parts[0]
        assert torch.equal(qgemv.dequantize_c(blocks, qtype, layer.moe.w1.cols), held["layers.3.ffn.experts.2.w1.weight"])


@pytest.mark.skipif(qgemv.library() is None, reason="no C kernels (no compiler)")
def test_ds4_mode_rounds_the_activations_of_q8_0_and_expert_products(written):
    """By default a GGUF runs ds4's CPU arithmetic: every Q8_0 matrix and routed expert takes
    8-bit activations and integer dot products (F16 ones stay fp32). Each product moves by the
    activation's rounding (under 3% of its largest output here); through six random layers the
    logits stay close, and nearly every expert choice is the same (a near tie can flip)."""
    from ds4tui.engine.kernels.qdot import Q8Matrix

    path, _, _, _ = written
    assert load_dsv4_gguf(path, "gguf").cfg.act_q8
    smooth = {k: v for k, v in SMOOTH.items() if k != "act_q8"}  # no QAT rounding step to flip
    q8, f32 = load_dsv4_gguf(path, "gguf", **smooth), load_dsv4_gguf(path, "gguf", **SMOOTH)
    assert q8.cfg.act_q8 and not f32.cfg.act_q8 and q8.info.fingerprint != f32.info.fingerprint
    gen = torch.Generator().manual_seed(0)
    for (name, m), (_, m32) in zip(_matrices(q8.net.w), _matrices(f32.net.w)):
        one, ref = (m[0], m32[0]) if isinstance(m, ExpertBank) else (m, m32)
        assert isinstance(one, Q8Matrix) == (one.qtype != "f16"), name
        x = torch.randn(3, one.cols, generator=gen)
        y, y32 = linear(x, one), linear(x, ref)
        assert ((y - y32).abs().max() / y32.abs().max()).item() < 0.03, name
    a, b = _run(q8, TOKENS[:20], decode=(9,)), _run(f32, TOKENS[:20], decode=(9,))
    la, lb = _logits(a), _logits(b)
    assert not torch.equal(la, lb)
    same = sum(a.experts[k] == b.experts[k] for k in b.experts)
    assert same >= 0.9 * len(b.experts)
    positions = sorted({p for _, p in b.experts})
    for i, p in enumerate(positions):
        agree = all(a.experts[k] == b.experts[k] for k in b.experts if k[1] == p)
        corr = torch.corrcoef(torch.stack([la[i], lb[i]]))[0, 1].item()
        assert corr > (0.999 if agree else 0.95), (p, agree, corr)  # measured: >= 0.9994, 0.972


def test_tokenizer_and_chat_come_from_the_file(written):
    path, _, _, tok = written
    model = load_model(str(path))
    assert isinstance(model, Dsv4Model) and model.info.family == "dsv4"
    t = model.tokenizer
    text = "Ciao! The 1234 quick foxes, 日本語 and   spaces.\n"
    assert t.decode(t.encode(text)) == text
    assert t.encode("1234") == t.encode("123") + t.encode("4")  # the joyai-llm split: digits in runs of 3
    prompt = model.chat.render([{"role": "user", "content": "hi"}])
    ids = t.encode(prompt)
    assert ids[0] == tok.token_to_id(BOS) == 0 and tok.token_to_id(USER) in ids and ids.count(tok.token_to_id(ASSISTANT)) == 1
    assert t.eos_ids == {1}


def _tiny_cfg(**over) -> tuple[Dsv4Config, dict]:
    """One CSA layer with hash routing: a 1-second file for the refusals below."""
    hf = dict(WIDE, num_hidden_layers=1, compress_ratios=[4], num_hash_layers=1, **over)
    cfg = Dsv4Config.from_hf(hf)
    return cfg, random_tensors(cfg)


@pytest.mark.parametrize("recipe,message", [
    ({"w1": "IQ2_XXS", "w3": "IQ2_XXS", "w2": "Q8_0"},
     "tensor blk.0.ffn_down_exps.weight has type Q8_0; ds4's layout has IQ2_XXS or Q2_K or Q4_K there"),
    ({"w1": "IQ2_XXS", "w3": "Q2_K", "w2": "Q2_K"},
     "layer 0's routed gate and up experts have types IQ2_XXS and Q2_K (ds4 needs one)"),
])
def test_a_file_ds4_would_refuse_is_refused_in_one_line(tmp_path, recipe, message):
    cfg, tensors = _tiny_cfg()
    path = tmp_path / "bad.gguf"
    write_dsv4_gguf(path, cfg, tensors, train_tiny_tokenizer(SPECIAL_TOKENS, VOCAB), recipe=recipe)
    with pytest.raises(WeightsError) as err:
        load_dsv4_gguf(path, "bad")
    assert str(err.value) == f"bad.gguf: {message}"


def test_another_architecture_or_a_missing_key_is_refused(tmp_path):
    import gguf

    other = tmp_path / "llama.gguf"
    w = gguf.GGUFWriter(str(other), "llama")
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(WeightsError, match=r"^llama.gguf: general.architecture is 'llama', not ds4's 'deepseek4'"):
        load_dsv4_gguf(other, "x")

    cfg, tensors = _tiny_cfg()
    path = tmp_path / "nokey.gguf"
    original = L.METADATA
    try:
        L.METADATA = tuple(m for m in original if m[0] != "hyper_connection.sinkhorn_iterations")
        write_dsv4_gguf(path, cfg, tensors, train_tiny_tokenizer(SPECIAL_TOKENS, VOCAB))
    finally:
        L.METADATA = original
    with pytest.raises(WeightsError) as err:
        load_dsv4_gguf(path, "x")
    assert str(err.value) == "nokey.gguf: required metadata key deepseek4.hyper_connection.sinkhorn_iterations is missing"
