"""True-shape slices: the plan has ds4's V4 Flash layout (shapes from ds4.c's enum, the Q2 file's
types and size), and a slice written at a small width in the same layout loads through ds4tui's
ds4 validator, holds blocks that gguf.quants decodes at the planned scale, is deterministic
per tensor, and runs."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from ds4tui.engine.dsv4 import slice as S
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.dsv4.gguf import REQUIRED_TOKENS, load_dsv4_gguf
from ds4tui.engine.dsv4.slice_vocab import slice_vocab
from ds4tui.engine.dsv4.tiny import CONFIG

# ds4.c's fixed V4 Flash shape (its enum), written out here rather than taken from Dsv4Config
N_EMBD, N_VOCAB, N_HEAD, HEAD_DIM, LORA_Q, LORA_O, OUT_GROUP = 4096, 129280, 64, 512, 1024, 1024, 8
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_HC, IDX_HEAD, IDX_DIM, N_HASH = 256, 6, 2048, 4, 64, 128, 3

SMALL = dict(CONFIG, hidden_size=256, moe_intermediate_size=256, vocab_size=2048)


def _ds4_layout(n_layers: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (PyTorch-order shape, type) as ds4's weights_validate_layout checks them."""
    hc_dim, mix = N_EMBD * N_HC, 2 * N_HC + N_HC * N_HC
    want = {
        "token_embd.weight": ((N_VOCAB, N_EMBD), "F16"), "output.weight": ((N_VOCAB, N_EMBD), "Q8_0"),
        "output_hc_base.weight": ((N_HC,), "F32"), "output_hc_fn.weight": ((N_HC, hc_dim), "F16"),
        "output_hc_scale.weight": ((1,), "F32"), "output_norm.weight": ((N_EMBD,), "F32"),
    }
    for il in range(n_layers):
        ratio = 0 if il < 2 else (4 if il % 2 == 0 else 128)
        b = f"blk.{il}."
        for k in ("attn", "ffn"):
            want[b + f"hc_{k}_fn.weight"] = ((mix, hc_dim), "F16")
            want[b + f"hc_{k}_scale.weight"] = ((3,), "F32")
            want[b + f"hc_{k}_base.weight"] = ((mix,), "F32")
            want[b + f"{k}_norm.weight"] = ((N_EMBD,), "F32")
        want.update({
            b + "attn_q_a.weight": ((LORA_Q, N_EMBD), "Q8_0"), b + "attn_q_a_norm.weight": ((LORA_Q,), "F32"),
            b + "attn_q_b.weight": ((N_HEAD * HEAD_DIM, LORA_Q), "Q8_0"), b + "attn_kv.weight": ((HEAD_DIM, N_EMBD), "Q8_0"),
            b + "attn_kv_a_norm.weight": ((HEAD_DIM,), "F32"), b + "attn_sinks.weight": ((N_HEAD,), "F32"),
            b + "attn_output_a.weight": ((OUT_GROUP * LORA_O, HEAD_DIM * N_HEAD // OUT_GROUP), "Q8_0"),
            b + "attn_output_b.weight": ((N_EMBD, OUT_GROUP * LORA_O), "Q8_0"),
            b + "ffn_gate_inp.weight": ((N_EXPERT, N_EMBD), "F16"),
            b + "ffn_gate_exps.weight": ((N_EXPERT, N_FF_EXP, N_EMBD), "IQ2_XXS"),
            b + "ffn_up_exps.weight": ((N_EXPERT, N_FF_EXP, N_EMBD), "IQ2_XXS"),
            b + "ffn_down_exps.weight": ((N_EXPERT, N_EMBD, N_FF_EXP), "Q2_K"),
            b + "ffn_gate_shexp.weight": ((N_FF_EXP, N_EMBD), "Q8_0"), b + "ffn_up_shexp.weight": ((N_FF_EXP, N_EMBD), "Q8_0"),
            b + "ffn_down_shexp.weight": ((N_EMBD, N_FF_EXP), "Q8_0"),
        })
        if il < N_HASH:
            want[b + "ffn_gate_tid2eid.weight"] = ((N_VOCAB, N_EXPERT_USED), "I32")
        else:
            want[b + "exp_probs_b.bias"] = ((N_EXPERT,), "F32")  # optional in ds4; the top-k layers use it
        if ratio:
            width = (2 if ratio == 4 else 1) * HEAD_DIM
            want[b + "attn_compressor_ape.weight"] = ((ratio, width), "F16")
            want[b + "attn_compressor_kv.weight"] = want[b + "attn_compressor_gate.weight"] = ((width, N_EMBD), "F16")
            want[b + "attn_compressor_norm.weight"] = ((HEAD_DIM,), "F32")
        if ratio == 4:
            want[b + "indexer.attn_q_b.weight"] = ((IDX_HEAD * IDX_DIM, LORA_Q), "F16")
            want[b + "indexer.proj.weight"] = ((IDX_HEAD, N_EMBD), "F16")
            want[b + "indexer_compressor_ape.weight"] = ((4, 2 * IDX_DIM), "F16")
            want[b + "indexer_compressor_kv.weight"] = want[b + "indexer_compressor_gate.weight"] = ((2 * IDX_DIM, N_EMBD), "F16")
            want[b + "indexer_compressor_norm.weight"] = ((IDX_DIM,), "F32")
    return want


@pytest.mark.parametrize("layers", [1, 4, 43])
def test_the_plan_is_ds4s_v4_flash_layout(layers):
    plan = S.slice_plan(S.slice_config(layers))
    assert {t.name: (t.shape, t.kind) for t in plan} == _ds4_layout(layers)


def test_all_43_layers_are_the_size_of_ds4s_q2_file():
    total = sum(t.nbytes for t in S.slice_plan(S.slice_config(43)))
    # download_model.sh: "2-bit routed experts, about 81 GB on disk" (the tensors: 80.76 GiB)
    assert 80 * 2**30 < total < 81.5 * 2**30


def test_chunks_are_bounded_and_add_up():
    plan = {t.name: t for t in S.slice_plan(S.slice_config(1))}
    embed = plan["token_embd.weight"]  # 1 GiB: never drawn at once
    first = next(S.tensor_chunks(embed, S.SEED))
    assert first.nbytes <= S.CHUNK_VALUES * 2 < embed.nbytes
    down = plan["blk.0.ffn_down_exps.weight"]
    sizes = [c.nbytes for c in S.tensor_chunks(S.SliceTensor(down.name, (3, *down.shape[1:]), down.kind, down.init), 1)]
    assert len(sizes) > 1 and sum(sizes) == 3 * down.nbytes // N_EXPERT


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    cfg = Dsv4Config.from_hf(SMALL)
    path = tmp_path_factory.mktemp("slice") / "small.gguf"
    size = S.write_slice(path, cfg, vocab_size=SMALL["vocab_size"], chunk_values=1 << 16)
    return path, cfg, size


def test_a_slice_loads_through_the_ds4_validator_and_runs(small):
    path, cfg, size = small
    assert size == path.stat().st_size and not path.with_name(path.name + ".part").exists()
    model = load_dsv4_gguf(path, "slice")
    s = model.new_session(64)
    ids = model.tokenizer.encode("The slice runs the real path.")
    s.prefill(ids)
    logits = s.next_logits()
    assert logits.shape == (cfg.vocab_size,) and bool(torch.isfinite(logits).all())
    assert 0.1 < float(logits.std()) < 100  # O(1) activations, not a dead or exploding net


def test_blocks_decode_at_the_planned_scale(small):
    import gguf

    path, cfg, _ = small
    reader = gguf.GGUFReader(str(path))
    plan = {t.name: t for t in S.slice_plan(cfg)}
    for t in reader.tensors:
        p = plan[t.name]
        if p.init[0] == "tid2eid":
            ids = np.asarray(t.data).astype(np.int64)
            assert ids.shape == p.shape
            assert ids.min() >= 0 and ids.max() < cfg.n_routed_experts
            assert all(len(set(row)) == cfg.num_experts_per_tok for row in ids.tolist())
            continue
        values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
        assert values.shape == p.shape and np.isfinite(values).all(), t.name
        mean, std = (0.0, p.init[1]) if p.init[0] == "rms" else p.init[1:]
        tol = 4 * max(std, 1e-3) / values.size ** 0.5 + 0.02 * std  # sampling error, f16 and block rounding
        assert abs(values.mean() - mean) < tol + 1e-3, t.name
        assert abs(values.std() - std) < max(0.1 * std, tol), t.name


def test_a_slice_is_seeded_per_tensor(small, tmp_path):
    import gguf

    path, cfg, _ = small
    again = tmp_path / "again.gguf"
    S.write_slice(again, cfg, vocab_size=SMALL["vocab_size"])
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(again) == digest(path)  # chunk size does not change the bytes
    other = tmp_path / "other-seed.gguf"
    one = tmp_path / "one-layer.gguf"
    S.write_slice(other, cfg, seed=7, vocab_size=SMALL["vocab_size"])
    S.write_slice(one, Dsv4Config.from_hf(dict(SMALL, num_hidden_layers=1)), vocab_size=SMALL["vocab_size"])
    data = {p: {t.name: bytes(t.data.tobytes()) for t in gguf.GGUFReader(str(p)).tensors} for p in (path, other, one)}
    assert data[other]["blk.0.ffn_gate_exps.weight"] != data[path]["blk.0.ffn_gate_exps.weight"]
    for name, raw in data[one].items():
        assert raw == data[path][name], name  # layer 0 and the top tensors do not depend on N


def test_the_v4_size_vocabulary_is_a_valid_bpe_with_ds4s_tokens():
    from ds4tui.engine.text.gguf_vocab import build_gguf_tokenizer

    tokens, types, merges = slice_vocab()
    assert len(tokens) == len(set(tokens)) == N_VOCAB
    assert tokens[0] == "<｜begin▁of▁sentence｜>" and tokens[1] == "<｜end▁of▁sentence｜>"
    assert set(REQUIRED_TOKENS) <= {t for t, k in zip(tokens, types) if k == 3}
    known = set(tokens)
    for m in merges[-1000:]:
        a, b = m.split(" ")
        assert a in known and b in known and a + b in known
    tok = build_gguf_tokenizer("gpt2", tokens, types, merges=merges, pre="joyai-llm")
    text = "Hello there, the quick brown fox: 12345 <｜User｜> ok"
    enc = tok.encode(text).ids
    assert tok.decode(enc, skip_special_tokens=False) == text
    assert tokens.index("<｜User｜>") in enc
    garbage = tok.decode(list(range(N_VOCAB - 50, N_VOCAB)))
    assert garbage.replace(" ", "").isalpha()  # what a random-weight slice says: letters


def test_the_cli_refuses_to_replace_a_file(tmp_path, capsys):
    out = tmp_path / "v4slice.gguf"
    out.write_bytes(b"mine")
    assert S.main(["--layers", "1", "--out", str(out)]) == 2
    assert out.read_bytes() == b"mine" and "exists" in capsys.readouterr().err
    assert S.main(["--layers", "0", "--plan"]) == 2
