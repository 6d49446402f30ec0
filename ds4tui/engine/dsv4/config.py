"""DeepSeek V4 configuration: the HF config.json keys, and every size derived from them.

Owns `Dsv4Config` (a dataclass; `__post_init__` derives per-layer ratios,
hash-layer flags, RoPE/YaRN parameters and widths, and validates them) and
the canonical JSON that goes into the model fingerprint. Both the legacy keys
(`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`, `rope_scaling`)
and HF's newer ones (`layer_types`, `mlp_layer_types`, `partial_rotary_factor`,
`rope_parameters`) are read. Defaults are DeepSeek V4 Flash's values.

`act_q8` (8-bit activations for the GGUF's Q8_0 and expert products, ds4's CPU
arithmetic) is another such choice; a GGUF load turns it on (docs/dsv4-gguf.md).
The QAT switches (`qat_kv_fp8`, `qat_indexer_fp4`, `cache_f16`) are not HF
keys: they are ds4tui runtime choices that change the cached numbers, so they
are part of the config (and the fingerprint). All default to on, as in ds4.
A checkpoint's config.json may set them with two ds4tui keys:
`"ds4tui_qat": false` turns both QAT roundings off (FP8 KV rows, Hadamard + FP4
indexer rows), `"ds4tui_cache_f16": false` keeps cached rows in float32 instead of
rounding them through f16. Both off compute what a plain float implementation
(transformers' DeepseekV4ForCausalLM) computes; docs/fidelity.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from ds4tui.engine.errors import WeightsError

_LAYER_TYPE_RATIO = {
    "sliding_attention": 0,
    "compressed_sparse_attention": 4,
    "heavily_compressed_attention": 128,
}
CSA_RATIO = 4  # the overlapping-lane compressor (and the indexer) exist only at ratio 4

# The architecture values of DeepSeek V4 Flash; a config matching them is "the real Flash"
# (KVC model_id 0); anything else is a custom DSV4 model.
FLASH_SHAPE = {
    "vocab_size": 129280,
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "head_dim": 512,
    "rope_head_dim": 64,
    "q_lora_rank": 1024,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "sliding_window": 128,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "n_routed_experts": 256,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 2048,
    "num_hash_layers": 3,
    "hc_mult": 4,
}


def flash_compress_ratios(n_layers: int) -> list[int]:
    """ds4's schedule: layers 0-1 window only, then 4 on even and 128 on odd layers."""
    return [0 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(n_layers)]


@dataclass
class Dsv4Config:
    vocab_size: int = 129280
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    head_dim: int = 512
    rope_head_dim: int = 64  # HF `qk_rope_head_dim`: the LAST dims of every head are rotated
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    sliding_window: int = 128
    compress_ratios: list[int] | None = None  # per layer: 0, 4 or 128 (any ratio > 0 works)
    rope_theta: float = 10000.0  # window-only layers
    compress_rope_theta: float = 160000.0  # compressed layers (with YaRN)
    yarn_factor: float = 16.0
    yarn_original_max_position: int = 65536
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    n_routed_experts: int = 256
    num_experts_per_tok: int = 6
    n_shared_experts: int = 1
    moe_intermediate_size: int = 2048
    routed_scaling_factor: float = 1.5
    num_hash_layers: int = 3
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 1048576
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    qat_kv_fp8: bool = True
    qat_indexer_fp4: bool = True
    cache_f16: bool = True
    kv_fp8_block: int = 64
    # Q8_0 and routed-expert products with the activation rounded to 8 bits (Q8_K / ds4's Q8A)
    # and integer dot products, as ds4's CPU path; GGUF weights only (gguf.py turns it on).
    act_q8: bool = False

    # derived in __post_init__ (not constructor arguments)
    hash_layers: list[bool] = field(init=False)
    n_nope: int = field(init=False)
    hc_mix: int = field(init=False)  # (2 + hc_mult) * hc_mult: pre, post, then the mixing matrix
    ratio_lcm: int = field(init=False)  # chunk sizes must be multiples of this

    def __post_init__(self) -> None:
        n = self.num_hidden_layers
        if self.compress_ratios is None:
            self.compress_ratios = flash_compress_ratios(n)
        # HF configs may list an extra entry for the MTP layer; only the main layers count.
        self.compress_ratios = [int(r) for r in self.compress_ratios[:n]]
        if len(self.compress_ratios) != n:
            raise WeightsError(f"config: compress_ratios has {len(self.compress_ratios)} entries for {n} layers")
        if any(r < 0 or r == 1 for r in self.compress_ratios):
            raise WeightsError(f"config: compress ratios must be 0 or >= 2, got {self.compress_ratios}")
        self.hash_layers = [i < self.num_hash_layers for i in range(n)]
        self.n_nope = self.head_dim - self.rope_head_dim
        self.hc_mix = (2 + self.hc_mult) * self.hc_mult
        ratios = [r for r in self.compress_ratios if r] or [1]
        self.ratio_lcm = math.lcm(*ratios)
        self._validate()

    def _validate(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise WeightsError(f"config: {what}")

        need(self.rope_head_dim % 2 == 0 and 0 < self.rope_head_dim <= self.head_dim, "rope dims must be even and <= head_dim")
        need(self.rope_head_dim <= self.index_head_dim, "index_head_dim must hold the rope dims")
        need(self.num_attention_heads % self.o_groups == 0, "num_attention_heads must be a multiple of o_groups")
        need(not self.qat_kv_fp8 or self.n_nope % self.kv_fp8_block == 0,
             f"head_dim - rope dims ({self.n_nope}) must be a multiple of the FP8 KV block {self.kv_fp8_block}")
        need(not self.qat_indexer_fp4 or (self.index_head_dim & (self.index_head_dim - 1) == 0
                                         and self.index_head_dim % 32 == 0),
             "index_head_dim must be a power of two >= 32 for the Hadamard + FP4 step")
        need(0 < self.num_experts_per_tok <= self.n_routed_experts, "num_experts_per_tok must be in 1..n_routed_experts")
        need(self.n_shared_experts in (0, 1), "at most one shared expert is supported")
        need(self.sliding_window > 0 and self.index_topk > 0, "sliding_window and index_topk must be positive")
        need(self.vocab_size > 0 and self.hidden_size > 0, "vocab_size and hidden_size must be positive")

    # -- derived helpers --------------------------------------------------------------------

    def ratio(self, layer: int) -> int:
        return self.compress_ratios[layer]

    def coff(self, layer: int) -> int:
        """Compressor lanes: 2 (overlapping windows) at ratio 4, else 1."""
        return 2 if self.compress_ratios[layer] == CSA_RATIO else 1

    def has_indexer(self, layer: int) -> bool:
        return self.compress_ratios[layer] == CSA_RATIO

    @property
    def eos_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, list) else [int(self.eos_token_id)]

    @property
    def is_flash(self) -> bool:
        return self.has_flash_shape and self.num_hidden_layers == FLASH_SHAPE["num_hidden_layers"]

    @property
    def has_flash_shape(self) -> bool:
        """V4 Flash's shape with any layer count (and its ratios for that count): what a ds4
        build runs when its layer-count enum is set to that count (a true-shape slice)."""
        mine = asdict(self)
        return all(mine[k] == v for k, v in FLASH_SHAPE.items() if k != "num_hidden_layers") and (
            self.compress_ratios == flash_compress_ratios(self.num_hidden_layers))

    def canonical_json(self) -> bytes:
        """Every constructor field, sorted: the config part of the fingerprint."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        if not data["act_q8"]:
            del data["act_q8"]  # added later: models without it keep their fingerprints
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    # -- HF config.json ---------------------------------------------------------------------

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], **overrides: Any) -> "Dsv4Config":
        """Read a config.json dict (legacy or HF-style keys); `overrides` win (e.g. QAT switches)."""
        kw: dict[str, Any] = {}
        names = {f.name for f in fields(cls) if f.init}
        for key in names:
            if key in cfg:
                kw[key] = cfg[key]
        if "qk_rope_head_dim" in cfg:
            kw["rope_head_dim"] = cfg["qk_rope_head_dim"]
        elif "partial_rotary_factor" in cfg and cfg["partial_rotary_factor"] is not None:
            kw["rope_head_dim"] = int(round(cfg.get("head_dim", cls.head_dim) * cfg["partial_rotary_factor"]))
        if "compress_ratios" not in cfg and cfg.get("layer_types"):
            rates = dict(cfg.get("compress_rates") or {})
            try:
                kw["compress_ratios"] = [rates.get(t, _LAYER_TYPE_RATIO[t]) for t in cfg["layer_types"]]
            except KeyError as exc:
                raise WeightsError(f"config: unknown layer type {exc.args[0]!r}") from None
            for t, r in zip(cfg["layer_types"], kw["compress_ratios"]):
                # The overlapping lanes and the indexer come with ratio 4 here (as in the official
                # code); a type whose rate contradicts that would be another architecture.
                if (t == "compressed_sparse_attention") != (r == CSA_RATIO):
                    raise WeightsError(f"config: {t} with compress rate {r} is not supported "
                                       f"(compressed_sparse_attention exactly at rate {CSA_RATIO})")
        if "num_hash_layers" not in cfg and cfg.get("mlp_layer_types"):
            types = list(cfg["mlp_layer_types"])
            kw["num_hash_layers"] = sum(1 for t in types if t == "hash_moe")
            if types[: kw["num_hash_layers"]] != ["hash_moe"] * kw["num_hash_layers"]:
                raise WeightsError("config: hash_moe layers must come first")
        kw.update(_yarn_keys(cfg))
        for key, names in (("ds4tui_qat", ("qat_kv_fp8", "qat_indexer_fp4")), ("ds4tui_cache_f16", ("cache_f16",))):
            if key in cfg:
                if not isinstance(cfg[key], bool):
                    raise WeightsError(f"config: {key} must be true or false, got {cfg[key]!r}")
                kw.update({name: cfg[key] for name in names})
        if cfg.get("hidden_act", "silu") != "silu":
            raise WeightsError(f"config: hidden_act {cfg.get('hidden_act')!r} is not supported (silu)")
        if cfg.get("num_key_value_heads", 1) != 1:
            raise WeightsError("config: DeepSeek V4 attention has one shared KV head (num_key_value_heads 1)")
        if cfg.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
            raise WeightsError(f"config: scoring_func {cfg.get('scoring_func')!r} is not supported (sqrtsoftplus)")
        if cfg.get("norm_topk_prob", True) is not True:
            raise WeightsError("config: norm_topk_prob false is not supported")
        kw.update(overrides)
        try:
            return cls(**kw)
        except TypeError as exc:
            raise WeightsError(f"config: {exc}") from None

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict in the legacy (official checkpoint) spelling."""
        out: dict[str, Any] = {
            "model_type": "deepseek_v4",
            "architectures": ["DeepseekV4ForCausalLM"],
            "num_key_value_heads": 1,
            "qk_rope_head_dim": self.rope_head_dim,
            "scoring_func": "sqrtsoftplus",
            "norm_topk_prob": True,
            "tie_word_embeddings": False,
            "rope_scaling": {
                "type": "yarn",
                "factor": self.yarn_factor,
                "original_max_position_embeddings": self.yarn_original_max_position,
                "beta_fast": self.yarn_beta_fast,
                "beta_slow": self.yarn_beta_slow,
            },
        }
        skip = {"rope_head_dim", "yarn_factor", "yarn_original_max_position", "yarn_beta_fast", "yarn_beta_slow"}
        for f in fields(self):
            if f.init and f.name not in skip:
                out[f.name] = getattr(self, f.name)
        return out


def _yarn_keys(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """YaRN settings from `rope_scaling` (legacy) or `rope_parameters["compress"]` (HF)."""
    src = cfg.get("rope_scaling")
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and isinstance(params.get("compress"), Mapping):
        src = params["compress"]
        if "rope_theta" in src and "compress_rope_theta" not in cfg:
            # HF nests the compressed-layer base here
            out = {"compress_rope_theta": src["rope_theta"]}
        else:
            out = {}
        main = params.get("main")
        if isinstance(main, Mapping) and "rope_theta" in main and "rope_theta" not in cfg:
            out["rope_theta"] = main["rope_theta"]
    else:
        out = {}
        if src is None and isinstance(params, Mapping) and "rope_type" in params:
            src = params  # HF's flat form before nesting: the YaRN settings themselves
    if not isinstance(src, Mapping):
        return out
    kind = src.get("rope_type", src.get("type", "yarn"))
    if kind not in ("yarn", "default"):
        raise WeightsError(f"config: rope scaling type {kind!r} is not supported (yarn)")
    if src.get("attention_factor", 1.0) not in (1, 1.0, None):
        # V4 applies YaRN's frequencies but never its magnitude factor (transformers pins it to 1)
        raise WeightsError(f"config: YaRN attention_factor {src['attention_factor']!r} is not supported (1.0)")
    if kind == "default":
        out["yarn_factor"] = 1.0
        return out
    for key, name in (
        ("factor", "yarn_factor"),
        ("original_max_position_embeddings", "yarn_original_max_position"),
        ("beta_fast", "yarn_beta_fast"),
        ("beta_slow", "yarn_beta_slow"),
    ):
        if key in src:
            out[name] = src[key]
    return out
