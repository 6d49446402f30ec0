"""What each supported architecture reads from a GGUF, and its tensor names in both formats.

Owns the translation of a GGUF's metadata into a LlamaConfig (config.py lists what each
field means, and reads Hugging Face config.json files), and the per-architecture tensor
names of GGUF files and Hugging Face checkpoints.
GGUF metadata is read wherever the file has it; the values llama.cpp itself assumes for
Gemma 3 when a file lacks them (5 sliding layers per global one, a sliding RoPE base of
10000, scores scaled by head_dim^-1/2 except on the 62-layer 27B) are the fallbacks.
"""

from __future__ import annotations

from ds4tui.engine.errors import WeightsError
from ds4tui.engine.llama.config import (
    ARCHITECTURES,
    GEMMA3_ROPE_LOCAL_BASE,
    GEMMA3_SWA_PATTERN,
    MAX_HEAD_DIM,
    MAX_POSITIONS,
    MAX_WIDTH,
    LlamaConfig,
    arch_features,
    expected_shapes,
    supported_text,
    swa_pattern_types,
)
from ds4tui.engine.llama.gguf_meta import GgufMeta
from ds4tui.engine.llama.rope import RopeScaling, gguf_rope_scaling

def _f32(value) -> float:
    """GGUF stores these as float32 (1e-5 reads back as 9.99999974e-06): take the shortest decimal
    that rounds to the same float32, i.e. the value the model's config was written with."""
    import numpy as np

    return float(str(np.float32(value)))


def parse_gguf_metadata(meta: GgufMeta, tensor_names: set[str], n_tokens: int,
                        source: str) -> tuple[LlamaConfig, RopeScaling | None]:
    """(config, the RoPE scaling the keys describe or None) from a GGUF's metadata. A
    `rope_freqs.weight` tensor (Llama 3 files) sets config.rope_freq_factors; the caller reads
    it and multiplies in the scaling's divisors (rope.combined_divisors)."""
    arch = meta.text("general.architecture")
    if arch not in ARCHITECTURES:
        raise WeightsError(f"{source}: architecture {arch!r} is not supported (supported: {supported_text()})")
    p = f"{arch}."
    # Bounds that keep a damaged header from sizing anything: every layer has tensors in the
    # file, every table row is a position (config.MAX_POSITIONS).
    layers = meta.integer(p + "block_count", low=1, high=max(1, len(tensor_names)))
    hidden = meta.integer(p + "embedding_length", low=1, high=MAX_WIDTH)
    heads = meta.integer(p + "attention.head_count", low=1, high=hidden)
    head_dim = meta.integer(p + "attention.key_length", hidden // heads, low=2, high=MAX_HEAD_DIM)
    value_dim = meta.integer(p + "attention.value_length", head_dim)
    if value_dim != head_dim:
        raise WeightsError(f"{source}: {p}attention.value_length {value_dim} differs from key_length {head_dim} "
                           "(not supported)")
    rot = meta.integer(p + "rope.dimension_count", head_dim)
    if rot != head_dim:
        raise WeightsError(f"{source}: {p}rope.dimension_count {rot} is not the head size {head_dim} "
                           "(partial RoPE is not supported)")
    context = meta.integer(p + "context_length", 2048, low=1, high=MAX_POSITIONS)
    theta = _f32(meta.number(p + "rope.freq_base", 10000.0, positive=True))
    scaling = gguf_rope_scaling(meta.number, meta.text, meta.integer, p, head_dim, theta, context, source)
    extra = arch_features(arch, hidden)
    if arch == "qwen2" and "blk.0.attn_q.bias" not in tensor_names:
        extra["attn_bias"] = False  # some Qwen2-architecture files carry no biases
    if arch == "gemma3":
        window = meta.integer(p + "attention.sliding_window", 0, low=0)
        extra["sliding_window"] = window
        pattern = meta.value(p + "attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
        if isinstance(pattern, list):
            pattern = meta.flags(p + "attention.sliding_window_pattern")
        else:
            pattern = meta.integer(p + "attention.sliding_window_pattern", GEMMA3_SWA_PATTERN, low=0)
        extra["layer_types"] = swa_pattern_types(layers, pattern if window else 0)
        extra["rope_local_theta"] = _f32(meta.number(p + "rope.freq_base_swa", GEMMA3_ROPE_LOCAL_BASE, positive=True))
        # llama.cpp: the 27B (62 layers) scales by (hidden / heads)^-1/2, the others by head_dim^-1/2.
        extra["query_pre_attn_scalar"] = float(hidden // heads if layers == 62 else head_dim)
        extra["final_logit_softcapping"] = _f32(meta.number(p + "final_logit_softcapping", 0.0) or 0.0)
    config = LlamaConfig(
        vocab_size=meta.integer(p + "vocab_size", n_tokens, low=n_tokens),
        hidden_size=hidden,
        intermediate_size=meta.integer(p + "feed_forward_length", low=1, high=MAX_WIDTH),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=meta.integer(p + "attention.head_count_kv", heads, low=1, high=heads),
        head_dim=head_dim,
        rope_theta=theta,
        rms_norm_eps=_f32(meta.number(p + "attention.layer_norm_rms_epsilon", 1e-5, positive=True)),
        max_position_embeddings=context,
        tie_word_embeddings="output.weight" not in tensor_names,
        arch=arch,
        rope_freq_factors=scaling is not None or "rope_freqs.weight" in tensor_names,
        rope_attn_factor=scaling.attn_factor if scaling is not None else 1.0,
        **extra,
    )
    return config, scaling


def gguf_expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Each GGUF tensor the config reads and its shape in (rows, columns) order, the reverse of
    ggml's: checked against the file's tensor index before any data is read."""
    h, d, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = (cfg.vocab_size, h)
    layer = {"attn_q.weight": (q, h), "attn_k.weight": (kv, h), "attn_v.weight": (kv, h), "attn_output.weight": (h, q),
             "ffn_gate.weight": (f, h), "ffn_up.weight": (f, h), "ffn_down.weight": (h, f)}
    if cfg.attn_bias:
        layer.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
    shapes = expected_shapes(cfg)
    for ours, theirs in GGUF_LAYER_NORMS.items():
        if f"layers.0.{ours}" in shapes:
            layer[theirs + ".weight"] = shapes[f"layers.0.{ours}"]
    for i in range(cfg.num_layers):
        out.update({f"blk.{i}.{name}": shape for name, shape in layer.items()})
    return out


def gguf_permutes_qk(cfg: LlamaConfig) -> bool:
    """llama.cpp's converter interleaves q/k rows for the llama architecture only (ggml's
    'normal' RoPE); Qwen and Gemma use the NeoX layout, which is Hugging Face's."""
    return cfg.arch == "llama"


# Per-layer internal name -> GGUF tensor (without "blk.{i}." and ".weight").
GGUF_LAYER_NORMS = {
    "attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
    "post_attn_norm": "post_attention_norm", "post_ffn_norm": "post_ffw_norm",
}


def hf_layer_norms(cfg: LlamaConfig) -> dict[str, str]:
    """Per-layer internal norm name -> Hugging Face name (after "model.layers.{i}.").
    In llama/qwen `post_attention_layernorm` is the norm before the FFN; in Gemma 3 it is
    the norm after attention, and `pre_feedforward_layernorm` comes before the FFN."""
    if cfg.post_norms:
        out = {"attn_norm": "input_layernorm.weight", "post_attn_norm": "post_attention_layernorm.weight",
               "ffn_norm": "pre_feedforward_layernorm.weight", "post_ffn_norm": "post_feedforward_layernorm.weight"}
    else:
        out = {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight"}
    if cfg.qk_norm:
        out["q_norm"] = "self_attn.q_norm.weight"
        out["k_norm"] = "self_attn.k_norm.weight"
    return out


def hf_norm_offset(cfg: LlamaConfig) -> float:
    """What a Hugging Face norm weight needs added to be the internal one: Gemma's RMSNorm
    multiplies by (1 + w)."""
    return 1.0 if cfg.arch == "gemma3" else 0.0
