"""Tiny seeded Hugging Face models of each architecture, saved as a HF directory and written
as GGUF files the way llama.cpp's converter names and lays them out (tensor names, metadata
keys, q/k row interleave for `llama` only, Gemma norms stored as 1 + w, Llama 3 RoPE
divisors as a `rope_freqs` tensor). transformers is the reference implementation.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from ds4tui.engine.llama.tiny import CHAT_TEMPLATE, SPECIALS
from ds4tui.engine.text.hf_tokenizer import IM_END
from ds4tui.engine.text.tiny_tokenizer import train_tiny_tokenizer

VOCAB = 512
WINDOW = 16  # gemma3's sliding window here: prompts of 40+ tokens cross it
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=2, pad_token_id=0)

CONFIGS = {
    "llama": dict(BASE, num_hidden_layers=2, tie_word_embeddings=False, rope_theta=10000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 32}),
    "qwen2": dict(BASE, num_hidden_layers=2, tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen3": dict(BASE, num_hidden_layers=2, head_dim=32, tie_word_embeddings=False, rope_theta=1000000.0),
    # 7 layers: sliding x5, global, sliding (llama.cpp's pattern of 6). query_pre_attn_scalar is
    # head_dim, as in the 270M (a GGUF does not store it); the "gemma3-qpas" variant differs.
    "gemma3": dict(BASE, num_hidden_layers=7, head_dim=32, sliding_window=WINDOW, query_pre_attn_scalar=32,
                   rope_theta=1000000.0, rope_local_base_freq=10000.0, tie_word_embeddings=True),
}
CONFIGS["gemma3-qpas"] = dict(CONFIGS["gemma3"], query_pre_attn_scalar=24)

# RoPE scaling kinds, as a config.json's rope_scaling names them (test_rope_scaling.py): original
# contexts at which YaRN's ramp and llama3's blend both cut through the frequencies of these
# head sizes, factors that move every angle of a 53-token prompt. A YaRN model's context is
# its factor times the original one, as in real configs.
ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-betas": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                   "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.25},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
}


def scaled(arch: str, scaling: str | None) -> str:
    """Register CONFIGS[arch/scaling]: `arch` with that RoPE scaling (None: none at all)."""
    name = f"{arch}/{scaling or 'none'}"
    cfg = {k: v for k, v in CONFIGS[arch].items() if k != "rope_scaling"}
    if scaling is not None:
        rope = cfg["rope_scaling"] = dict(ROPE_SCALINGS[scaling])
        if rope["rope_type"] == "yarn":
            cfg["max_position_embeddings"] = int(rope["factor"] * rope["original_max_position_embeddings"])
    CONFIGS[name] = cfg
    return name


def hf_model(arch: str, seed: int = 7):
    """A transformers model with seeded random weights of sizes that keep activations O(1)."""
    import transformers as tr

    kind = arch.split("-")[0].split("/")[0]
    cls = {"llama": (tr.LlamaConfig, tr.LlamaForCausalLM), "qwen2": (tr.Qwen2Config, tr.Qwen2ForCausalLM),
           "qwen3": (tr.Qwen3Config, tr.Qwen3ForCausalLM),
           "gemma3": (tr.Gemma3TextConfig, tr.Gemma3ForCausalLM)}[kind]
    cfg = cls[0](**CONFIGS[arch])
    cfg._attn_implementation = "eager"
    model = cls[1](cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Gemma multiplies by (1 + w): a zero-centred w keeps the same scale as 1 + 0.1 noise.
                p.copy_((0.0 if kind == "gemma3" else 1.0) + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.15 if kind == "gemma3" else 1.0))
            else:
                scale = (3.0 if name.startswith("lm_head") else 1.5) / p.shape[1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return model


def quantized_copy(model, qtype: Q):
    """The model with every matrix replaced by gguf's quantize-then-dequantize of it: the
    weights a GGUF of `qtype` holds (rows are quantized independently, so llama.cpp's q/k
    row interleave does not change them). transformers on it is the quantized reference."""
    import copy

    out = copy.deepcopy(model)
    with torch.no_grad():
        for _, p in out.named_parameters():
            if p.dim() == 2:
                w = p.detach().numpy().astype(np.float32)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).reshape(w.shape)))
    return out


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    """transformers' logits [S, V] for every position of one sequence."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def save_hf_dir(model, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok = _tokenizer()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": IM_END, "chat_template": CHAT_TEMPLATE}))
    return out


def _tokenizer(specials=tuple(SPECIALS)):
    return train_tiny_tokenizer(specials, vocab_size=VOCAB)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter interleaves each head's q/k rows (so ggml rotates adjacent pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_divisors(model) -> np.ndarray:
    """The divisors a Llama 3 GGUF stores, from transformers' own llama3 and default frequencies."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = model.config
    d = cfg.head_dim
    base = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, None)
    return (base / scaled).numpy().astype(np.float32)


def _write_rope_scaling(w, rope: dict) -> None:
    """The keys llama.cpp's converter writes for a rope_parameters dict (conversion/base.py,
    TextModel.set_gguf_parameters); llama3 is the rope_freqs tensor instead."""
    kind, factor = rope.get("rope_type"), rope.get("factor")
    if kind == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif kind == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if rope.get("attention_factor") is not None:
            w.add_rope_scaling_yarn_attn_factor(rope["attention_factor"])
        if rope.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if rope.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])


def write_gguf(model, arch: str, path: Path, qtype: Q = Q.F32, *, specials=tuple(SPECIALS),
               chat_template: str = CHAT_TEMPLATE, bos_id: int | None = None) -> Path:
    """specials: the tokenizer's special tokens, ids 0, 1, 2, ... (id 2 is the EOS)."""
    kind = arch.split("-")[0].split("/")[0]
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    tok = json.loads(_tokenizer(tuple(specials)).to_str())
    vocab = tok["model"]["vocab"]
    tokens = [None] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    special = {t["id"] for t in tok["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), kind)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    rope = cfg.rope_parameters
    rope = rope.get("full_attention") or rope
    w.add_rope_freq_base(rope["rope_theta"])
    _write_rope_scaling(w, rope)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if kind == "gemma3":
        w.add_sliding_window(cfg.sliding_window)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_eos_token_id(2)
    if bos_id is not None:
        w.add_bos_token_id(bos_id)
    w.add_add_bos_token(False)
    w.add_chat_template(chat_template)

    def put(name: str, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.ndim == 1 or qtype == Q.F32:
            w.add_tensor(name, arr)
        elif qtype == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)

    shift = 1.0 if kind == "gemma3" else 0.0

    def norm(name: str, hf: str) -> None:
        put(name, sd[hf] + shift)

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    norm("output_norm.weight", "model.norm.weight")
    if not cfg.tie_word_embeddings:
        put("output.weight", sd["lm_head.weight"])
    if kind == "llama" and rope.get("rope_type") == "llama3":
        put("rope_freqs.weight", _llama3_divisors(model))
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if kind == "llama":
            q, k = llama_cpp_permute(q, heads), llama_cpp_permute(k, kv_heads)
        put(b + "attn_q.weight", q)
        put(b + "attn_k.weight", k)
        put(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        if kind == "qwen2":
            for x in "qkv":
                put(b + f"attn_{x}.bias", sd[p + f"self_attn.{x}_proj.bias"])
        if kind in ("qwen3", "gemma3"):
            norm(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight")
            norm(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight")
        norm(b + "attn_norm.weight", p + "input_layernorm.weight")
        if kind == "gemma3":
            norm(b + "post_attention_norm.weight", p + "post_attention_layernorm.weight")
            norm(b + "ffn_norm.weight", p + "pre_feedforward_layernorm.weight")
            norm(b + "post_ffw_norm.weight", p + "post_feedforward_layernorm.weight")
        else:
            norm(b + "ffn_norm.weight", p + "post_attention_layernorm.weight")
        put(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        put(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        put(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
