"""GGUF loading: tiny GGUFs written here with gguf.GGUFWriter from tiny-llama's HF weights."""

from __future__ import annotations

import hashlib
import json
import os

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ds4tui.engine.llama import gguf as gguf_loader
from ds4tui.engine.llama.gguf import load_llama_gguf
from ds4tui.engine.llama.weights import load_llama_hf
from ds4tui.engine.llama.weights import file_sha256
from ds4tui.engine.llama.tiny import CHAT_TEMPLATE, ensure_tiny_llama

# Worst-case error of one weight, as a fraction of the tensor's largest |w|: half a step for
# Q8_0 (step amax/127) and Q4_1 (step (max-min)/15 <= 2 amax/15); a full step amax/8 for Q4_0, whose
# 16 levels -8..7 clip the extreme of the other sign; +15% for the fp16-rounded block scales.
TOLERANCE = {Q.Q8_0: 1.15 * 0.5 / 127, Q.Q4_0: 1.15 / 8, Q.Q4_1: 1.15 / 15, Q.F16: 1e-3, Q.F32: 0.0}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k rows (so ggml rotates adjacent pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(hf_dir, path, qtype: Q, per_tensor: dict | None = None) -> None:
    """per_tensor: GGUF short name ("attn_v", "ffn_down", ...) -> a type for those tensors,
    or a function (float32 array) -> (raw array, type) that writes them itself."""
    from safetensors.numpy import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [None] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    special = {t["id"] for t in tok["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    hf = load_file(str(hf_dir / "model.safetensors"))

    def put(name: str, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        kind = (per_tensor or {}).get(name.split(".")[-2], qtype)
        if callable(kind):
            raw, kind = kind(arr)
            w.add_tensor(name, raw, raw_dtype=kind)
        elif arr.ndim == 1 or kind == Q.F32:
            w.add_tensor(name, arr)
        elif kind == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, kind), raw_dtype=kind)

    put("token_embd.weight", hf["model.embed_tokens.weight"])
    put("output_norm.weight", hf["model.norm.weight"])
    put("output.weight", hf["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for hf_name, g_name in names.items():
            put(f"blk.{i}.{g_name}.weight", hf[p + hf_name + ".weight"])
        put(f"blk.{i}.attn_q.weight", llama_cpp_permute(hf[p + "self_attn.q_proj.weight"], cfg["num_attention_heads"]))
        put(f"blk.{i}.attn_k.weight", llama_cpp_permute(hf[p + "self_attn.k_proj.weight"], cfg["num_key_value_heads"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    hf_dir = ensure_tiny_llama()  # in the real data dir, before redirecting it
    hf = load_llama_hf(hf_dir, "tiny-llama")
    root = tmp_path_factory.mktemp("gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_DATA_DIR", str(root / "data"))  # converted copies and the hash memo go here
        ggufs = {}
        for qtype in (Q.F32, Q.F16, Q.Q8_0, Q.Q4_1, Q.Q4_0):
            path = root / f"tiny-{qtype.name}.gguf"
            write_tiny_gguf(hf_dir, path, qtype)
            ggufs[qtype] = path
        yield hf, ggufs


def _weights(model) -> dict[str, torch.Tensor]:
    out = {"embed": model.embed, "lm_head": model.lm_head.weight}
    for i, layer in enumerate(model.layers):
        for part in ("wqkv", "wo", "w13", "w2"):
            out[f"{i}.{part}"] = getattr(layer, part).weight
    return out


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_1, Q.Q4_0])
def test_dequantized_weights_within_quantization_error(env, qtype):
    hf, ggufs = env
    model = load_llama_gguf(ggufs[qtype], "tiny-gguf")
    ref, got = _weights(hf), _weights(model)
    for name, want in ref.items():
        err = (got[name] - want).abs().max().item()
        bound = TOLERANCE[qtype] * want.abs().max().item()
        # A wrong q/k row order would be off by O(amax), far beyond any bound here.
        assert err <= bound, f"{qtype.name} {name}: max error {err:.4g} > {bound:.4g}"
        assert err > 0, f"{qtype.name} {name}: suspiciously exact (was it quantized?)"


def test_f32_gguf_model_matches_hf_model(env):
    hf, ggufs = env
    model = load_llama_gguf(ggufs[Q.F32], "tiny-gguf")
    perm = llama_cpp_permute(hf.layers[0].wqkv.weight.numpy()[: hf.cfg.num_heads * hf.cfg.head_dim], hf.cfg.num_heads)
    assert not np.array_equal(perm, hf.layers[0].wqkv.weight.numpy()[: perm.shape[0]])  # the test has teeth
    assert model.cfg == hf.cfg
    assert model.chat.default_system_prompt == hf.chat.default_system_prompt
    assert model.tokenizer.eos_ids == hf.tokenizer.eos_ids == {2}
    for text in ["<|im_start|>user\nhello 123<|im_end|>", "The weather, today: sunny!"]:
        assert model.tokenizer.encode(text) == hf.tokenizer.encode(text)
    prompt = hf.tokenizer.encode(hf.chat.render([{"role": "user", "content": "What is the weather like?"}]))
    a, b = hf.new_session(128), model.new_session(128)
    a.prefill(prompt)
    b.prefill(prompt)
    assert torch.allclose(a.logits, b.logits, atol=1e-5, rtol=1e-5)
    for _ in range(6):
        tok = int(a.logits.argmax())
        assert tok == int(b.logits.argmax())
        assert torch.allclose(a.decode(tok), b.decode(tok), atol=1e-5, rtol=1e-5)


def test_quantized_gguf_keeps_the_greedy_choice(env):
    hf, ggufs = env
    model = load_llama_gguf(ggufs[Q.Q8_0], "tiny-gguf")
    assert model.info.quant_bits == 8 and model.info.fingerprint != hf.info.fingerprint
    prompt = hf.tokenizer.encode(hf.chat.render([{"role": "user", "content": "Hi there"}]))
    a, b = hf.new_session(128), model.new_session(128)
    a.prefill(prompt)
    b.prefill(prompt)
    assert int(a.logits.argmax()) == int(b.logits.argmax())
    assert (a.logits - b.logits).abs().max() < 0.05 * a.logits.abs().max()


def test_second_load_uses_the_converted_copy(env, monkeypatch):
    _, ggufs = env
    first = load_llama_gguf(ggufs[Q.Q4_1], "tiny-gguf")

    def no_convert(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_loader, "convert_gguf", no_convert)
    again = load_llama_gguf(ggufs[Q.Q4_1], "tiny-gguf")
    assert again.info == first.info and again.info.quant_bits == 4
    assert torch.equal(again.layers[1].w13.weight, first.layers[1].w13.weight)


def test_damaged_converted_copy_is_rebuilt(env):
    _, ggufs = env
    first = load_llama_gguf(ggufs[Q.Q4_0], "tiny-gguf")
    wqkv = first.layers[0].wqkv.weight.clone()
    out = gguf_loader.converted_dir(file_sha256(ggufs[Q.Q4_0]))
    weights = out / "model.safetensors"
    # Truncated (e.g. a full disk), written as a new file: truncating the inode that `first`
    # has memory-mapped would kill this process with SIGBUS on its next read of a weight.
    broken = out / "broken"
    broken.write_bytes(weights.read_bytes()[:1000])
    broken.replace(weights)
    again = load_llama_gguf(ggufs[Q.Q4_0], "tiny-gguf")
    assert again.info == first.info
    assert torch.equal(again.layers[0].wqkv.weight, wqkv)


def test_file_hash_memo_follows_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 100)
    first = file_sha256(f)
    assert first == hashlib.sha256(b"a" * 100).hexdigest()
    assert file_sha256(f) == first  # memoized
    f.write_bytes(b"b" * 100)
    os.utime(f, ns=(1, 1))  # same size, different mtime: must be hashed again
    assert file_sha256(f) == hashlib.sha256(b"b" * 100).hexdigest()


def test_conversion_reports_its_progress_once(env):
    """The first load converts and says how far it is (the chat shows "preparing … 43%");
    the next load uses the copy and says nothing."""
    import shutil

    _, ggufs = env
    path = ggufs[Q.F16]
    shutil.rmtree(gguf_loader.converted_dir(file_sha256(path)), ignore_errors=True)
    heard: list[tuple[str, float]] = []
    load_llama_gguf(path, "tiny-gguf", progress=lambda what, f: heard.append((what, f)))
    fractions = [f for _, f in heard]
    assert {what for what, _ in heard} == {"tiny-F16"}
    assert fractions[0] == 0.0 and fractions[-1] == 1.0 and fractions == sorted(fractions)
    assert len(set(fractions)) >= 5  # per layer, not just start and end
    heard.clear()
    load_llama_gguf(path, "tiny-gguf", progress=lambda what, f: heard.append((what, f)))
    assert heard == []


def _mapped_file(address: int) -> str:
    """The path of the mapping holding `address` ('' for anonymous memory), from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else ""
    raise AssertionError(f"{address:#x} is not mapped")


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
def test_raw_blocks_moved_into_huge_pages_change_no_logit(env, monkeypatch):
    from ds4tui.engine.kernels import huge_pages

    _, ggufs = env
    monkeypatch.setenv("DS4TUI_HUGE_PAGES", "off")
    mapped = load_llama_gguf(ggufs[Q.Q4_1], "tiny-gguf")
    monkeypatch.delenv("DS4TUI_HUGE_PAGES")
    monkeypatch.setattr(huge_pages, "huge_pages_wanted", lambda: True)  # whatever this system's THP setting
    moved = load_llama_gguf(ggufs[Q.Q4_1], "tiny-gguf")
    assert mapped.huge_pages.wait() == 0
    assert not moved.huge_pages.started  # nothing competes with the load and the warm-up
    moved.warm_up(64)
    assert moved.huge_pages.started  # warm_up's last step
    assert moved.huge_pages.wait() > 0
    for model, where in ((mapped, "model.safetensors"), (moved, "")):
        for lin in (model.layers[0].w13, model.layers[1].wqkv, model.lm_head):
            assert lin.blocks is not None
            path = _mapped_file(lin.blocks.parts[0][1].data_ptr())
            assert path.endswith(where) if where else path == "", (where, path)
    prompt = moved.tokenizer.encode(moved.chat.render([{"role": "user", "content": "Hi there"}]))
    a, b = mapped.new_session(64), moved.new_session(64)
    a.prefill(prompt)
    b.prefill(prompt)
    assert torch.equal(a.logits, b.logits)
    for _ in range(4):  # decode steps: the fused C step reads the blocks
        tok = int(a.logits.argmax())
        assert torch.equal(a.decode(tok), b.decode(tok))
