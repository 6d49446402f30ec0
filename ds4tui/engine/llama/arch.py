"""What each supported architecture reads from a GGUF, and its tensor names in both formats.

Owns the translation of a GGUF's metadata into a LlamaConfig (config.py lists what each
field means, and reads Hugging Face config.json files), and the per-architecture tensor
names of GGUF files and Hugging Face checkpoints.
GGUF metadata is read wherever the file has it; the values llama.cpp itself assumes for
Gemma 3 when a file lacks them (5 sliding layers per global one, a sliding RoPE base of
10000, scores scaled by head_dim^-1/2 except on the 62-layer 27B) are the fallbacks.
"""

from __future__ import annotations

from typing import Callable

from ds4tui.engine.errors import WeightsError
from ds4tui.engine.llama.config import (
    ARCHITECTURES,
    GEMMA3_ROPE_LOCAL_BASE,
    GEMMA3_SWA_PATTERN,
    LlamaConfig,
    arch_features,
    supported_text,
    swa_pattern_types,
)

def _f32(value) -> float:
    """GGUF stores these as float32 (1e-5 reads back as 9.99999974e-06): take the shortest decimal
    that rounds to the same float32, i.e. the value the model's config was written with."""
    import numpy as np

    return float(str(np.float32(value)))


def parse_gguf_metadata(meta: Callable, tensor_names: set[str], n_tokens: int,
                        source: str) -> tuple[LlamaConfig, list[float] | None]:
    """(config, RoPE divisors or None) from a GGUF's metadata; meta(key, default) reads a field.
    Divisors stored as the `rope_freqs.weight` tensor (Llama 3 files) are read by the caller."""
    arch = meta("general.architecture")
    if arch not in ARCHITECTURES:
        raise WeightsError(f"{source}: architecture {arch!r} is not supported (supported: {supported_text()})")

    def key(name: str, default=None):
        return meta(f"{arch}.{name}", default)

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    head_dim = int(key("attention.key_length", hidden // heads))
    layers = int(key("block_count"))
    theta = _f32(key("rope.freq_base", 10000.0))
    scaling = str(key("rope.scaling.type", "none") or "none")
    factors = None
    if scaling == "linear":
        factors = [float(key("rope.scaling.factor"))] * (head_dim // 2)
    elif scaling not in ("none", ""):
        raise WeightsError(f"{source}: RoPE scaling {scaling!r} is not supported (none, linear, llama3)")
    extra = arch_features(arch, hidden)
    if arch == "qwen2" and "blk.0.attn_q.bias" not in tensor_names:
        extra["attn_bias"] = False  # some Qwen2-architecture files carry no biases
    if arch == "gemma3":
        window = int(key("attention.sliding_window", 0) or 0)
        extra["sliding_window"] = window
        pattern = key("attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
        extra["layer_types"] = swa_pattern_types(layers, pattern if window else 0)
        extra["rope_local_theta"] = _f32(key("rope.freq_base_swa", GEMMA3_ROPE_LOCAL_BASE))
        # llama.cpp: the 27B (62 layers) scales by (hidden / heads)^-1/2, the others by head_dim^-1/2.
        extra["query_pre_attn_scalar"] = float(hidden // heads if layers == 62 else head_dim)
        extra["final_logit_softcapping"] = _f32(key("final_logit_softcapping", 0.0) or 0.0)
    config = LlamaConfig(
        vocab_size=int(key("vocab_size", n_tokens)),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=theta,
        rms_norm_eps=_f32(key("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(key("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensor_names,
        arch=arch,
        rope_freq_factors=factors is not None or "rope_freqs.weight" in tensor_names,
        **extra,
    )
    return config, factors


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
