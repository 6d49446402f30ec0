"""ds4's GGUF layout for DeepSeek V4 (architecture "deepseek4"): names, metadata keys, types.

Owns what antirez/ds4's loader (`ds4.c`: weights_bind, weights_validate_layout,
config_validate_model) and its quantizer (`gguf-tools/deepseek4-quantize.c`) agree on:
- tensor names: canonical names (weights.py, the official checkpoint's: `layers.3.attn.wq_a.weight`)
  <-> GGUF names (`blk.3.attn_q_a.weight`); each layer's routed experts are three 3-D tensors
  (`blk.L.ffn_{gate,up,down}_exps.weight`, [E, F, D] / [E, D, F] in PyTorch order);
- the types ds4 accepts for each tensor (`TENSOR_TYPES`): F32 vectors, F16 embedding, HC,
  router, compressor and indexer matrices, Q8_0 attention projections, shared experts and
  output head, routed experts in IQ2_XXS, Q2_K or Q4_K (gate and up of one type), I32 tid2eid;
- the `deepseek4.*` metadata keys and the Dsv4Config fields they carry (`METADATA`), and the
  values ds4 fixes (one KV head, K and V of one width, no expert groups, normalized weights);
- `Q2_RECIPE`: the types of ds4's DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8 file.
The shape is read from the metadata, not fixed: ds4 accepts only V4 Flash's (an enum in
ds4.c); a smaller config in the same layout is how tests and slices exercise the real path.
Pure data and functions; reading is gguf.py, writing gguf_write.py.
"""

from __future__ import annotations

import re

ARCH = "deepseek4"
P = ARCH + "."

TOP = {
    "embed.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "head.weight": "output.weight",
    "hc_head_base": "output_hc_base.weight",
    "hc_head_fn": "output_hc_fn.weight",
    "hc_head_scale": "output_hc_scale.weight",
}
# canonical layer suffix -> GGUF layer suffix (ds4's layer_map, reversed)
LAYER = {
    "hc_attn_base": "hc_attn_base.weight",
    "hc_attn_fn": "hc_attn_fn.weight",
    "hc_attn_scale": "hc_attn_scale.weight",
    "hc_ffn_base": "hc_ffn_base.weight",
    "hc_ffn_fn": "hc_ffn_fn.weight",
    "hc_ffn_scale": "hc_ffn_scale.weight",
    "attn.attn_sink": "attn_sinks.weight",
    "attn.wq_a.weight": "attn_q_a.weight",
    "attn.wq_b.weight": "attn_q_b.weight",
    "attn.q_norm.weight": "attn_q_a_norm.weight",
    "attn.wkv.weight": "attn_kv.weight",
    "attn.kv_norm.weight": "attn_kv_a_norm.weight",
    "attn.wo_a.weight": "attn_output_a.weight",
    "attn.wo_b.weight": "attn_output_b.weight",
    "attn.compressor.ape": "attn_compressor_ape.weight",
    "attn.compressor.wkv.weight": "attn_compressor_kv.weight",
    "attn.compressor.wgate.weight": "attn_compressor_gate.weight",
    "attn.compressor.norm.weight": "attn_compressor_norm.weight",
    "attn.indexer.wq_b.weight": "indexer.attn_q_b.weight",
    "attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "attn.indexer.compressor.ape": "indexer_compressor_ape.weight",
    "attn.indexer.compressor.wkv.weight": "indexer_compressor_kv.weight",
    "attn.indexer.compressor.wgate.weight": "indexer_compressor_gate.weight",
    "attn.indexer.compressor.norm.weight": "indexer_compressor_norm.weight",
    "attn_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn.shared_experts.w1.weight": "ffn_gate_shexp.weight",
    "ffn.shared_experts.w3.weight": "ffn_up_shexp.weight",
    "ffn.shared_experts.w2.weight": "ffn_down_shexp.weight",
    "ffn.gate.weight": "ffn_gate_inp.weight",
    "ffn.gate.bias": "exp_probs_b.bias",
    "ffn.gate.tid2eid": "ffn_gate_tid2eid.weight",
}
EXPERTS = {"w1": "ffn_gate_exps.weight", "w3": "ffn_up_exps.weight", "w2": "ffn_down_exps.weight"}
EXPERT_TYPES = ("IQ2_XXS", "Q2_K", "Q4_K")  # ds4's tensor_is_routed_expert_type
EXPERT_RE = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$")


def gguf_name(canon: str) -> str | None:
    """The GGUF tensor of a canonical name (a routed expert: its layer's 3-D tensor); None if
    the layout has no such tensor."""
    if canon in TOP:
        return TOP[canon]
    m = EXPERT_RE.match(canon)
    if m:
        return f"blk.{m.group(1)}.{EXPERTS[m.group(3)]}"
    layer, _, rest = canon.partition(".")
    if layer != "layers":
        return None
    index, _, suffix = rest.partition(".")
    return f"blk.{index}.{LAYER[suffix]}" if suffix in LAYER and index.isdigit() else None


def tensor_types(gguf: str) -> tuple[str, ...]:
    """The GGML type names ds4 accepts for a GGUF tensor (by its name's suffix)."""
    suffix = gguf.split(".", 2)[2] if gguf.startswith("blk.") else gguf
    if suffix in EXPERTS.values():
        return EXPERT_TYPES
    return TENSOR_TYPES[suffix]


TENSOR_TYPES: dict[str, tuple[str, ...]] = {
    "token_embd.weight": ("F16",),
    "output_hc_base.weight": ("F32",),
    "output_hc_fn.weight": ("F16",),
    "output_hc_scale.weight": ("F32",),
    "output_norm.weight": ("F32",),
    "output.weight": ("Q8_0",),
    "hc_attn_fn.weight": ("F16",), "hc_ffn_fn.weight": ("F16",),
    "hc_attn_scale.weight": ("F32",), "hc_ffn_scale.weight": ("F32",),
    "hc_attn_base.weight": ("F32",), "hc_ffn_base.weight": ("F32",),
    "attn_norm.weight": ("F32",), "ffn_norm.weight": ("F32",),
    "attn_q_a.weight": ("Q8_0",), "attn_q_b.weight": ("Q8_0",), "attn_kv.weight": ("Q8_0",),
    "attn_output_a.weight": ("Q8_0",), "attn_output_b.weight": ("Q8_0",),
    "attn_q_a_norm.weight": ("F32",), "attn_kv_a_norm.weight": ("F32",), "attn_sinks.weight": ("F32",),
    "attn_compressor_ape.weight": ("F16",), "attn_compressor_kv.weight": ("F16",),
    "attn_compressor_gate.weight": ("F16",), "attn_compressor_norm.weight": ("F32",),
    "indexer.attn_q_b.weight": ("F16",), "indexer.proj.weight": ("F16",),
    "indexer_compressor_ape.weight": ("F16",), "indexer_compressor_kv.weight": ("F16",),
    "indexer_compressor_gate.weight": ("F16",), "indexer_compressor_norm.weight": ("F32",),
    "ffn_gate_inp.weight": ("F16",), "exp_probs_b.bias": ("F32",),
    "ffn_gate_shexp.weight": ("Q8_0",), "ffn_up_shexp.weight": ("Q8_0",), "ffn_down_shexp.weight": ("Q8_0",),
    "ffn_gate_tid2eid.weight": ("I32",),
}

# ds4's Q2 file: routed gate/up IQ2_XXS, down Q2_K; everything else as TENSOR_TYPES (one type each).
Q2_RECIPE = {"w1": "IQ2_XXS", "w3": "IQ2_XXS", "w2": "Q2_K"}

# (metadata key without the "deepseek4." prefix, GGUF value kind, Dsv4Config field or None)
# Kinds: u32, u64 (u32 accepted too), f32 (f64/u32/i32 accepted, as ds4's required_f32), bool,
# u32[] (compress ratios), f32[] (per-layer SwiGLU clamp).
METADATA: tuple[tuple[str, str, str | None], ...] = (
    ("block_count", "u32", "num_hidden_layers"),
    ("context_length", "u64", "max_position_embeddings"),
    ("embedding_length", "u32", "hidden_size"),
    ("vocab_size", "u32", "vocab_size"),
    ("attention.head_count", "u32", "num_attention_heads"),
    ("attention.head_count_kv", "u32", None),
    ("attention.key_length", "u32", "head_dim"),
    ("attention.value_length", "u32", None),
    ("rope.dimension_count", "u32", "rope_head_dim"),
    ("attention.q_lora_rank", "u32", "q_lora_rank"),
    ("attention.output_lora_rank", "u32", "o_lora_rank"),
    ("attention.output_group_count", "u32", "o_groups"),
    ("expert_count", "u32", "n_routed_experts"),
    ("expert_used_count", "u32", "num_experts_per_tok"),
    ("expert_feed_forward_length", "u32", "moe_intermediate_size"),
    ("expert_shared_count", "u32", "n_shared_experts"),
    ("hash_layer_count", "u32", "num_hash_layers"),
    ("attention.sliding_window", "u32", "sliding_window"),
    ("attention.indexer.head_count", "u32", "index_n_heads"),
    ("attention.indexer.key_length", "u32", "index_head_dim"),
    ("attention.indexer.top_k", "u32", "index_topk"),
    ("hyper_connection.count", "u32", "hc_mult"),
    ("hyper_connection.sinkhorn_iterations", "u32", "hc_sinkhorn_iters"),
    ("hyper_connection.epsilon", "f32", "hc_eps"),
    ("attention.compress_ratios", "u32[]", "compress_ratios"),
    ("swiglu_clamp_exp", "f32[]", "swiglu_limit"),
    ("rope.freq_base", "f32", "rope_theta"),
    ("attention.compress_rope_freq_base", "f32", "compress_rope_theta"),
    ("rope.scaling.factor", "f32", "yarn_factor"),
    ("rope.scaling.original_context_length", "u64", "yarn_original_max_position"),
    ("rope.scaling.yarn_beta_fast", "f32", "yarn_beta_fast"),
    ("rope.scaling.yarn_beta_slow", "f32", "yarn_beta_slow"),
    ("expert_weights_scale", "f32", "routed_scaling_factor"),
    ("expert_weights_norm", "bool", None),
    ("attention.layer_norm_rms_epsilon", "f32", "rms_norm_eps"),
)
# Optional keys ds4 reads with these required values when present.
OPTIONAL_ZERO = ("expert_group_count", "expert_group_used_count")
