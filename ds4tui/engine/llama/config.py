"""The llama-family configuration and the internal weight layout every loader produces.

Internal weight names (also the names in the converted fp32 cache, so a cached
load maps tensors straight in without renaming or fusing):
  embed [V, H]; norm [H]; lm_head [V, H] (absent: tied to embed);
  layers.{i}.attn_norm [H]; layers.{i}.wqkv [(Hq + 2 Hkv) D, H] (q rows, k rows, v rows);
  layers.{i}.wo [H, Hq D]; layers.{i}.ffn_norm [H]; layers.{i}.w13 [2 F, H] (gate rows, up rows);
  layers.{i}.w2 [H, F].
q/k rows are in Hugging Face order (RoPE rotates the two halves of each head).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Mapping

from ds4tui.engine.errors import WeightsError


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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if int(getattr(self, name)) <= 0:
                raise WeightsError(f"config {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise WeightsError(f"{self.num_heads} query heads do not group over {self.num_kv_heads} KV heads")
        if self.head_dim % 2:
            raise WeightsError("head_dim must be even for RoPE")

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def kv_row_floats(self) -> int:
        """Floats one token keeps per layer: K and V of every KV head (the payload's head_dim)."""
        return 2 * self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, cfg: Mapping) -> "LlamaConfig":
        """From a Hugging Face config.json dict (llama-like)."""
        try:
            if cfg.get("rope_scaling"):
                raise WeightsError(f"rope_scaling {cfg['rope_scaling']!r} is not supported")
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rope_theta=float(cfg.get("rope_theta", 10000.0)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WeightsError(f"config.json: missing or bad field ({exc})") from None

    def as_dict(self) -> dict:
        return asdict(self)

    def canonical_json(self) -> bytes:
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":")).encode()


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every internal tensor name and its shape (lm_head only when not tied)."""
    h, d, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"embed": (cfg.vocab_size, h), "norm": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm"] = (h,)
        shapes[p + "wqkv"] = ((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h)
        shapes[p + "wo"] = (h, cfg.num_heads * d)
        shapes[p + "ffn_norm"] = (h,)
        shapes[p + "w13"] = (2 * f, h)
        shapes[p + "w2"] = (h, f)
    return shapes
