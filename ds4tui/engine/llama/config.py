"""The llama-family configuration and the internal weight layout every loader produces.

One forward serves four architectures; what differs between them is a config field
here, never a check of the architecture name in the forward:

| field | llama | qwen2 | qwen3 | gemma3 |
|---|---|---|---|---|
| attn_bias (q/k/v biases) | - | yes | - | - |
| qk_norm (per-head RMSNorm of q and k before RoPE) | - | - | yes | yes |
| post_norms (norms after attention and after the FFN) | - | - | - | yes |
| act (gate activation of the gated FFN) | silu | silu | silu | gelu_tanh |
| embed_scale (embeddings times) | 1 | 1 | 1 | sqrt(hidden) |
| query_pre_attn_scalar (scores scaled by its -1/2 power) | head_dim | head_dim | head_dim | from config |
| sliding_window, layer_types | - | - | - | 5 sliding per global |
| rope_local_theta (RoPE base of sliding layers) | - | - | - | 10000 |
| rope_freq_factors (per-frequency divisors, global layers) | RoPE scaling: linear, yarn, llama3 (rope.py) | same | same | same, global layers only |
| rope_attn_factor (cos/sin of global layers times) | yarn: 0.1 ln(factor) + 1 | same | same | same |

Gemma's RMSNorm multiplies by (1 + w): the loaders store 1 + w (as llama.cpp's GGUF
converter does), so every norm here multiplies by its weight.

Internal weight names (also the names in the converted fp32 cache, so a cached
load maps tensors straight in without renaming or fusing):
  embed [V, H]; norm [H]; lm_head [V, H] (absent: tied to embed);
  rope_freqs [D/2] (only with rope_freq_factors: every RoPE scaling kind, as divisors);
  layers.{i}.attn_norm [H]; layers.{i}.wqkv [(Hq + 2 Hkv) D, H] (q rows, k rows, v rows);
  layers.{i}.bqkv [(Hq + 2 Hkv) D] (attn_bias); layers.{i}.q_norm, k_norm [D] (qk_norm);
  layers.{i}.wo [H, Hq D]; layers.{i}.post_attn_norm [H] (post_norms);
  layers.{i}.ffn_norm [H]; layers.{i}.w13 [2 F, H] (gate rows, up rows); layers.{i}.w2 [H, F];
  layers.{i}.post_ffn_norm [H] (post_norms).
q/k rows are in Hugging Face order (RoPE rotates the two halves of each head).
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Mapping

from ds4tui.engine.errors import WeightsError
from ds4tui.engine.llama.rope import RopeScaling, hf_rope_scaling

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
ACTIVATIONS = ("silu", "gelu_tanh")
FULL, SLIDING = "full", "sliding"
# The RoPE tables hold a row per position (2 x 2M x D/2 floats at most: 1 GB at D = 128): a
# longer context_length is refused rather than allocated. The 1M-context Qwen 2.5 files fit.
MAX_POSITIONS = 1 << 21
MAX_WIDTH = 1 << 20  # hidden or FFN size: a damaged header is refused before it sizes anything
MAX_HEAD_DIM = 1 << 10


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    arch: str = "llama"
    attn_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    act: str = "silu"
    embed_scale: float = 1.0
    query_pre_attn_scalar: float = 0.0  # 0: head_dim
    sliding_window: int = 0  # 0: every layer attends to the whole context
    layer_types: tuple[str, ...] = field(default=())  # per layer FULL or SLIDING; () = all FULL
    rope_local_theta: float = 0.0  # 0: rope_theta
    rope_freq_factors: bool = False
    rope_attn_factor: float = 1.0  # cos/sin of global layers times (YaRN)
    final_logit_softcapping: float = 0.0  # 0: none

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if int(getattr(self, name)) <= 0:
                raise WeightsError(f"config {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise WeightsError(f"{self.num_heads} query heads do not group over {self.num_kv_heads} KV heads")
        if self.head_dim % 2:
            raise WeightsError("head_dim must be even for RoPE")
        if self.max_position_embeddings > MAX_POSITIONS:
            raise WeightsError(f"a context of {self.max_position_embeddings} positions is over the "
                               f"{MAX_POSITIONS} the RoPE tables hold")
        for name in ("rope_theta", "rms_norm_eps", "rope_attn_factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise WeightsError(f"config {name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.rope_local_theta) and self.rope_local_theta >= 0):
            raise WeightsError(f"config rope_local_theta must be a positive number, got {self.rope_local_theta!r}")
        if self.arch not in ARCHITECTURES:
            raise WeightsError(f"architecture {self.arch!r} is not supported ({', '.join(ARCHITECTURES)})")
        if self.act not in ACTIVATIONS:
            raise WeightsError(f"activation {self.act!r} is not supported ({', '.join(ACTIVATIONS)})")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))  # a list after a JSON round trip
        if self.layer_types:
            if len(self.layer_types) != self.num_layers or set(self.layer_types) - {FULL, SLIDING}:
                raise WeightsError(f"layer_types must name {FULL!r} or {SLIDING!r} for each of {self.num_layers} layers")
            if SLIDING in self.layer_types and self.sliding_window <= 0:
                raise WeightsError("sliding layers need a positive sliding_window")

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def kv_row_floats(self) -> int:
        """Floats one token keeps per layer: K and V of every KV head (the payload's head_dim)."""
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == SLIDING

    @property
    def sliding_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_sliding(i)]

    def swa_layout(self) -> str:
        """The attention layout in words, for the model info line."""
        n = len(self.sliding_layers)
        if not n:
            return "full attention"
        return f"{n} sliding (window {self.sliding_window}) + {self.num_layers - n} global layers"

    @classmethod
    def from_hf(cls, cfg: Mapping) -> "LlamaConfig":
        """From a Hugging Face config.json dict (llama, qwen2, qwen3 or gemma3_text)."""
        return parse_hf_config(cfg)[0]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        return d

    def canonical_json(self) -> bytes:
        """The config's identity for the fingerprint. Fields at their default are left out, so
        a plain llama keeps the fingerprint (and its .kv files) it had before they existed."""
        d = {k: v for k, v in self.as_dict().items() if k not in _defaults() or _defaults()[k] != v}
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def _defaults() -> dict:
    """The optional fields and their defaults, as as_dict() writes them."""
    out = {}
    for f in fields(LlamaConfig):
        if f.default is not MISSING:
            out[f.name] = list(f.default) if isinstance(f.default, tuple) else f.default
        elif f.default_factory is not MISSING:
            out[f.name] = list(f.default_factory())
    return out


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every internal tensor name and its shape (optional ones only when the config has them)."""
    h, d, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"embed": (cfg.vocab_size, h), "norm": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (cfg.vocab_size, h)
    if cfg.rope_freq_factors:
        shapes["rope_freqs"] = (d // 2,)
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm"] = (h,)
        shapes[p + "wqkv"] = (qkv, h)
        if cfg.attn_bias:
            shapes[p + "bqkv"] = (qkv,)
        if cfg.qk_norm:
            shapes[p + "q_norm"] = (d,)
            shapes[p + "k_norm"] = (d,)
        shapes[p + "wo"] = (h, cfg.num_heads * d)
        shapes[p + "ffn_norm"] = (h,)
        shapes[p + "w13"] = (2 * f, h)
        shapes[p + "w2"] = (h, f)
        if cfg.post_norms:
            shapes[p + "post_attn_norm"] = (h,)
            shapes[p + "post_ffn_norm"] = (h,)
    return shapes


# Hugging Face model_type -> our architecture.
HF_MODEL_TYPES = {
    "llama": "llama", "mistral": "llama", "smollm": "llama", "smollm2": "llama",
    "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
}
GEMMA3_SWA_PATTERN = 6  # every 6th layer is global
GEMMA3_ROPE_LOCAL_BASE = 10000.0


def supported_text() -> str:
    return ", ".join(ARCHITECTURES)


def arch_features(arch: str, hidden: int) -> dict:
    """The config fields that follow from the architecture alone."""
    if arch == "qwen2":
        return {"attn_bias": True}
    if arch == "qwen3":
        return {"qk_norm": True}
    if arch == "gemma3":
        return {"qk_norm": True, "post_norms": True, "act": "gelu_tanh", "embed_scale": math.sqrt(hidden)}
    return {}


def swa_pattern_types(n_layers: int, pattern) -> tuple[str, ...]:
    """Layer types from a sliding-window pattern: an int N (every N-th layer global, the
    others sliding; 0 or 1: all global) or one bool per layer (True: sliding)."""
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layers:
            raise WeightsError(f"sliding_window_pattern has {len(pattern)} entries for {n_layers} layers")
        return tuple(SLIDING if bool(p) else FULL for p in pattern)
    n = int(pattern)
    return tuple(SLIDING if n > 1 and (i + 1) % n else FULL for i in range(n_layers))


def parse_hf_config(cfg: Mapping) -> tuple[LlamaConfig, RopeScaling | None]:
    """(config, the RoPE scaling of the global layers or None) from a config.json dict.

    Long because it reads config.json's keys one after another, each with its own default and check."""
    model_type = str(cfg.get("model_type", "llama")).lower()
    arch = HF_MODEL_TYPES.get(model_type)
    if arch is None:
        raise WeightsError(f"config.json: model_type {model_type!r} is not supported ({', '.join(HF_MODEL_TYPES)})")
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        layers = int(cfg["num_hidden_layers"])
        params = cfg.get("rope_parameters")  # transformers >= 5; older configs: rope_theta + rope_scaling
        if isinstance(params, Mapping) and "full_attention" in params:
            global_rope, local_rope = params.get("full_attention") or {}, params.get("sliding_attention") or {}
            where = "rope_parameters.full_attention"
        else:
            global_rope, local_rope = (params if isinstance(params, Mapping) else cfg.get("rope_scaling")) or {}, {}
            where = "rope_parameters" if isinstance(params, Mapping) else "rope_scaling"
        theta = float(global_rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        max_positions = int(cfg.get("max_position_embeddings", 2048))
        scaling = hf_rope_scaling(global_rope, head_dim, theta, max_positions, where, "config.json")
        local = hf_rope_scaling(local_rope, head_dim, theta, max_positions, "rope_parameters.sliding_attention",
                                "config.json")
        if local is not None:
            raise WeightsError(f"config.json: RoPE scaling of sliding layers (rope_parameters.sliding_attention."
                               f"rope_type = {local.kind!r}) is not supported")
        extra = arch_features(arch, hidden)
        if arch == "gemma3":
            types = cfg.get("layer_types")
            if types:
                extra["layer_types"] = tuple(SLIDING if t == "sliding_attention" else FULL for t in types)
            else:
                pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", GEMMA3_SWA_PATTERN))
                extra["layer_types"] = swa_pattern_types(layers, pattern)
            extra["sliding_window"] = int(cfg.get("sliding_window") or 0)
            extra["rope_local_theta"] = float(local_rope.get("rope_theta", cfg.get("rope_local_base_freq", GEMMA3_ROPE_LOCAL_BASE)))
            extra["query_pre_attn_scalar"] = float(cfg.get("query_pre_attn_scalar") or head_dim)
            extra["final_logit_softcapping"] = float(cfg.get("final_logit_softcapping") or 0.0)
            if cfg.get("attn_logit_softcapping"):
                raise WeightsError("config.json: attn_logit_softcapping is not supported")
        elif cfg.get("use_sliding_window"):
            raise WeightsError(f"config.json: {model_type} with use_sliding_window is not supported")
        if cfg.get("mlp_bias") or (arch != "qwen2" and cfg.get("attention_bias")):
            raise WeightsError("config.json: biases other than Qwen2's q/k/v are not supported")
        config = LlamaConfig(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rope_theta=theta,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", arch == "gemma3")),
            arch=arch,
            rope_freq_factors=scaling is not None,
            rope_attn_factor=scaling.attn_factor if scaling is not None else 1.0,
            **extra,
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise WeightsError(f"config.json: missing or bad field ({exc})") from None
    return config, scaling
