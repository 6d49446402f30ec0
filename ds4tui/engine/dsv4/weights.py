"""DeepSeek V4 weights: tensor names, checkpoint loading, dequantization and validation.

Owns the map from a checkpoint to `Dsv4Weights`:
- names: the official checkpoint names (`layers.3.attn.wq_a.weight`) are
  canonical; Hugging Face module names (`model.layers.3.self_attn.q_a_proj.weight`,
  fused `mlp.experts.gate_up_proj`) are translated to them, and so are the names
  transformers' `save_pretrained` writes (official layer names under `model.`,
  the KV norm as `attn.norm`); `mtp.*` is ignored;
- storage: *.safetensors files, memory-mapped (safetensors' safe_open), with
  F32/BF16/F16 tensors, FP8 E4M3 weights plus a `.scale` (or HF
  `.weight_scale_inv`) E8M0 partner per 128x128 block, and FP4 routed experts
  (I8, two values a byte) plus a `.scale` per 32 inputs; all are dequantized
  once at load into the compute dtype;
- validation: a missing, unexpected or mis-shaped tensor, an orphan scale, a
  non-finite value or an out-of-range expert id is a WeightsError naming it.
The weights are loaded once per model and shared by every session.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import torch

from ds4tui.engine import quant
from ds4tui.engine.dsv4.attention import AttnWeights, IndexerWeights
from ds4tui.engine.dsv4.compressor import CompressorWeights
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.dsv4.hc import HcHeadWeights, HcWeights
from ds4tui.engine.dsv4.moe import MoeWeights
from ds4tui.engine.errors import WeightsError

_TORCH_TO_ST = {
    torch.float32: "F32", torch.float64: "F64", torch.bfloat16: "BF16", torch.float16: "F16",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e8m0fnu: "F8_E8M0", torch.int8: "I8",
    torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64",
}
_FLOAT = {"F32", "F64", "BF16", "F16"}
_INT = {"I32", "I64"}
_FUSED_GATE_UP, _FUSED_DOWN = "<fused gate_up>", "<fused down>"

_HF_TOP = {
    "model.embed_tokens.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}
_HF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "attn_hc.fn": "hc_attn_fn", "attn_hc.base": "hc_attn_base", "attn_hc.scale": "hc_attn_scale",
    "ffn_hc.fn": "hc_ffn_fn", "ffn_hc.base": "hc_ffn_base", "ffn_hc.scale": "hc_ffn_scale",
    "self_attn.q_a_proj.weight": "attn.wq_a.weight",
    "self_attn.q_a_norm.weight": "attn.q_norm.weight",
    "self_attn.q_b_proj.weight": "attn.wq_b.weight",
    "self_attn.kv_proj.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.kv_norm.weight",
    "self_attn.sinks": "attn.attn_sink",
    "self_attn.o_a_proj.weight": "attn.wo_a.weight",
    "self_attn.o_b_proj.weight": "attn.wo_b.weight",
    "self_attn.compressor.kv_proj.weight": "attn.compressor.wkv.weight",
    "self_attn.compressor.gate_proj.weight": "attn.compressor.wgate.weight",
    "self_attn.compressor.position_bias": "attn.compressor.ape",
    "self_attn.compressor.kv_norm.weight": "attn.compressor.norm.weight",
    "self_attn.compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
    "self_attn.compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
    "self_attn.compressor.indexer.kv_proj.weight": "attn.indexer.compressor.wkv.weight",
    "self_attn.compressor.indexer.gate_proj.weight": "attn.indexer.compressor.wgate.weight",
    "self_attn.compressor.indexer.position_bias": "attn.indexer.compressor.ape",
    "self_attn.compressor.indexer.kv_norm.weight": "attn.indexer.compressor.norm.weight",
    "mlp.gate.weight": "ffn.gate.weight",
    "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.gate.tid2eid": "ffn.gate.tid2eid",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
    "mlp.experts.gate_up_proj": _FUSED_GATE_UP,
    "mlp.experts.down_proj": _FUSED_DOWN,
}
_HF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# transformers' save_pretrained reverses its load-time renames, which turns the official
# layer names back but keeps the `model.` prefix and writes the attention KV norm as
# `attn.norm` (its reverse of `.norm.` -> `.kv_norm.`, a rename shared with the compressors).
_SAVED_LAYER = {"attn.norm.weight": "attn.kv_norm.weight"}
_HF_ONLY_PREFIXES = ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.", "attn_hc.", "ffn_hc.")


def official_to_hf() -> dict[str, str]:
    """Suffix map official -> HF for one layer (fused experts excluded); used by writers."""
    return {v: k for k, v in _HF_LAYER.items() if not v.startswith("<")}


def hf_top_names() -> dict[str, str]:
    return {v: k for k, v in _HF_TOP.items()}


@dataclass
class Source:
    """One stored tensor: its safetensors dtype string, shape, and a loader."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    get: Callable[[], torch.Tensor]


def sources_from_safetensors(path: Path) -> dict[str, Source]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{path}: no *.safetensors files")
    out: dict[str, Source] = {}
    for file in files:
        try:
            handle = safe_open(str(file), framework="pt")  # memory-mapped
        except Exception as exc:  # safetensors raises its own error types
            raise WeightsError(f"{file.name}: not a readable safetensors file ({exc})") from None
        for name in handle.keys():
            if name in out:
                raise WeightsError(f"tensor {name} appears in two files (second: {file.name})")
            sl = handle.get_slice(name)
            out[name] = Source(name, sl.get_dtype(), tuple(sl.get_shape()), lambda h=handle, n=name: h.get_tensor(n))
    return out


def sources_from_dict(tensors: Mapping[str, torch.Tensor]) -> dict[str, Source]:
    out = {}
    for name, t in tensors.items():
        if t.dtype not in _TORCH_TO_ST:
            raise WeightsError(f"tensor {name}: unsupported dtype {t.dtype}")
        out[name] = Source(name, _TORCH_TO_ST[t.dtype], tuple(t.shape), lambda t=t: t)
    return out


def expected_shapes(cfg: Dsv4Config) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """(required canonical name -> shape, names that may also appear)."""
    dm, vocab, heads, d = cfg.hidden_size, cfg.vocab_size, cfg.num_attention_heads, cfg.head_dim
    hc, ql, ff = cfg.hc_mult, cfg.q_lora_rank, cfg.moe_intermediate_size
    s: dict[str, tuple[int, ...]] = {
        "embed.weight": (vocab, dm), "head.weight": (vocab, dm), "norm.weight": (dm,),
        "hc_head_fn": (hc, hc * dm), "hc_head_base": (hc,), "hc_head_scale": (1,),
    }
    optional: dict[str, tuple[int, ...]] = {}
    for li in range(cfg.num_hidden_layers):
        p = f"layers.{li}."
        s[p + "attn_norm.weight"] = s[p + "ffn_norm.weight"] = (dm,)
        for k in ("attn", "ffn"):
            s[f"{p}hc_{k}_fn"], s[f"{p}hc_{k}_base"], s[f"{p}hc_{k}_scale"] = (cfg.hc_mix, hc * dm), (cfg.hc_mix,), (3,)
        a = p + "attn."
        s.update({
            a + "wq_a.weight": (ql, dm), a + "q_norm.weight": (ql,), a + "wq_b.weight": (heads * d, ql),
            a + "wkv.weight": (d, dm), a + "kv_norm.weight": (d,), a + "attn_sink": (heads,),
            a + "wo_a.weight": (cfg.o_groups * cfg.o_lora_rank, heads * d // cfg.o_groups),
            a + "wo_b.weight": (dm, cfg.o_groups * cfg.o_lora_rank),
        })
        r, coff = cfg.ratio(li), cfg.coff(li)
        comps = [(a + "compressor.", d)] if r else []
        if cfg.has_indexer(li):
            ih, idim = cfg.index_n_heads, cfg.index_head_dim
            s[a + "indexer.wq_b.weight"] = (ih * idim, ql)
            s[a + "indexer.weights_proj.weight"] = (ih, dm)
            comps.append((a + "indexer.compressor.", idim))
        for c, dim in comps:
            s[c + "wkv.weight"] = s[c + "wgate.weight"] = (coff * dim, dm)
            s[c + "ape"], s[c + "norm.weight"] = (r, coff * dim), (dim,)
        f = p + "ffn."
        s[f + "gate.weight"] = (cfg.n_routed_experts, dm)
        if cfg.hash_layers[li]:
            s[f + "gate.tid2eid"] = (vocab, cfg.num_experts_per_tok)
            optional[f + "gate.bias"] = (cfg.n_routed_experts,)  # unused: hash layers do not select
        else:
            s[f + "gate.bias"] = (cfg.n_routed_experts,)
        for e in range(cfg.n_routed_experts):
            s[f"{f}experts.{e}.w1.weight"] = s[f"{f}experts.{e}.w3.weight"] = (ff, dm)
            s[f"{f}experts.{e}.w2.weight"] = (dm, ff)
        if cfg.n_shared_experts:
            s[f + "shared_experts.w1.weight"] = s[f + "shared_experts.w3.weight"] = (ff, dm)
            s[f + "shared_experts.w2.weight"] = (dm, ff)
    return {**s, **optional}, set(optional)


def _canonical(name: str) -> str | None:
    """Official name for a source name (itself when already official); None if unknown."""
    if name in _HF_TOP:
        return _HF_TOP[name]
    m = _HF_LAYER_RE.match(name)
    if m:
        rest = m.group(2)
        suffix = _HF_LAYER.get(rest) or _SAVED_LAYER.get(rest)
        if suffix is None and not rest.startswith(_HF_ONLY_PREFIXES):
            suffix = rest  # an official layer name under `model.` (shape-checked like any other)
        return None if suffix is None else f"layers.{m.group(1)}.{suffix}"
    return None if name.startswith(("model.", "lm_head.")) else name


def _materialize(src: Source, scale: Source | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    name = src.name
    if src.dtype in ("F8_E4M3", "I8") and len(shape) == 2:
        kind = "FP8" if src.dtype == "F8_E4M3" else "FP4"
        if scale is None:
            raise WeightsError(f"tensor {name}: {kind} weight without its .scale partner")
        dequant = quant.dequant_fp8_weight if kind == "FP8" else quant.dequant_fp4_weight
        try:
            t = dequant(src.get(), scale.get())
        except ValueError as exc:  # scale shape or dtype
            raise WeightsError(f"tensor {name}: {exc}") from None
    elif src.dtype in _FLOAT:
        t = src.get()
    else:
        raise WeightsError(f"tensor {name}: dtype {src.dtype} is not a weight format")
    if tuple(t.shape) != shape:
        raise WeightsError(f"tensor {name}: shape {tuple(t.shape)} after dequantization, expected {shape}")
    t = t.to(dtype).contiguous()
    if t.data_ptr() % 64:
        # A zero-copy view into the memory-mapped file can sit at any offset; BLAS kernels
        # may sum in another order for unaligned data, so the same weights would give other
        # bits depending on the file layout. A copy is 64-byte aligned.
        t = t.clone()
    if not bool(torch.isfinite(t).all()):
        raise WeightsError(f"tensor {name}: contains NaN or infinite values")
    return t


def resolve(cfg: Dsv4Config, sources: Mapping[str, Source], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Translate, pair, validate and dequantize `sources` into canonical tensors of `dtype`
    (tid2eid stays int64)."""
    want, optional = expected_shapes(cfg)
    scales: dict[str, Source] = {}
    for name, src in sources.items():
        for suffix in (".scale", ".weight_scale_inv"):
            base = name[: -len(suffix)] + ".weight" if name.endswith(suffix) else None
            if base and base in sources and sources[base].dtype in ("F8_E4M3", "I8"):
                scales[base] = src
    scale_names = {s.name for s in scales.values()}
    found: dict[str, tuple[Source, Source | None]] = {}
    for name, src in sources.items():
        if name in scale_names or name.startswith(("mtp.", "model.mtp.")):
            continue
        canon = _canonical(name)
        if canon is None:
            raise WeightsError(f"unexpected tensor {name} (not a DeepSeek V4 tensor name)")
        if canon.endswith((_FUSED_GATE_UP, _FUSED_DOWN)):
            _expand_fused(cfg, name, canon, src, found)
            continue
        if canon in found:
            raise WeightsError(f"tensor {canon} is stored twice (as {found[canon][0].name} and {name})")
        found[canon] = (src, scales.get(name))
    missing = [n for n in want if n not in found and n not in optional]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise WeightsError(f"missing tensor {', '.join(missing[:5])}{more}")
    extra = sorted(n for n in found if n not in want)
    if extra:
        raise WeightsError(f"unexpected tensor {extra[0]}" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    out: dict[str, torch.Tensor] = {}
    for canon, (src, scale) in found.items():
        shape = want[canon]
        stored = src.shape
        if src.dtype == "I8" and scale is not None and len(stored) == 2:
            stored = (stored[0], stored[1] * 2)  # FP4: two values per byte
        if stored != shape:
            raise WeightsError(f"tensor {src.name}: shape {list(stored)}, expected {list(shape)}")
        out[canon] = _load_tid2eid(cfg, src) if canon.endswith("tid2eid") else _materialize(src, scale, shape, dtype)
    return out


def _expand_fused(cfg: Dsv4Config, name: str, canon: str, src: Source, found: dict) -> None:
    """HF keeps routed experts fused: gate_up [E, 2F, D] (w1 rows then w3), down [E, D, F]."""
    e_n, ff, dm = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    prefix = canon[: canon.index("<")] + "ffn.experts."
    if canon.endswith(_FUSED_GATE_UP):
        shape, parts = (e_n, 2 * ff, dm), (("w1", slice(0, ff)), ("w3", slice(ff, 2 * ff)))
    else:
        shape, parts = (e_n, dm, ff), (("w2", slice(None)),)
    if src.shape != shape:
        raise WeightsError(f"tensor {name}: shape {list(src.shape)}, expected {list(shape)}")
    cache: dict[str, torch.Tensor] = {}

    def whole() -> torch.Tensor:  # read the fused tensor once for all its experts
        if "t" not in cache:
            cache["t"] = src.get()
        return cache["t"]

    for e in range(e_n):
        for w, rows in parts:
            part_shape = (ff, dm) if w != "w2" else (dm, ff)
            found[f"{prefix}{e}.{w}.weight"] = (
                Source(f"{name}[{e}]", src.dtype, part_shape, lambda e=e, rows=rows: whole()[e, rows]),
                None,
            )


def _load_tid2eid(cfg: Dsv4Config, src: Source) -> torch.Tensor:
    if src.dtype not in _INT:
        raise WeightsError(f"tensor {src.name}: dtype {src.dtype}, expected an integer type")
    t = src.get().to(torch.int64)
    if bool((t < 0).any()) or bool((t >= cfg.n_routed_experts).any()):
        raise WeightsError(f"tensor {src.name}: expert ids outside 0..{cfg.n_routed_experts - 1}")
    return t


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """Identity of the weights for the fingerprint, independent of names and storage format:
    per canonical tensor, its name, shape and 4096 evenly spaced values (as float32)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].reshape(-1)
        step = max(1, t.numel() // 4096)
        sample = t[::step][:4096].to(torch.float32 if t.is_floating_point() else torch.int64)
        h.update(f"{name}:{list(tensors[name].shape)};".encode())
        h.update(sample.contiguous().numpy().tobytes())
    return h.digest()


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    hc_attn: HcWeights
    hc_ffn: HcWeights
    attn: AttnWeights
    moe: MoeWeights


@dataclass
class Dsv4Weights:
    embed: torch.Tensor  # [V, D]
    head: torch.Tensor  # [V, D]
    norm: torch.Tensor  # [D]
    hc_head: HcHeadWeights
    layers: list[LayerWeights]


def build_weights(cfg: Dsv4Config, t: Mapping[str, torch.Tensor]) -> Dsv4Weights:
    """Group canonical tensors into the per-block weight records (experts stacked [E, ...])."""

    def comp(prefix: str) -> CompressorWeights:
        return CompressorWeights(t[prefix + "wkv.weight"], t[prefix + "wgate.weight"], t[prefix + "ape"],
                                 t[prefix + "norm.weight"])

    layers = []
    for li in range(cfg.num_hidden_layers):
        p, a, f = f"layers.{li}.", f"layers.{li}.attn.", f"layers.{li}.ffn."
        hcw = {k: HcWeights(t[f"{p}hc_{k}_fn"], t[f"{p}hc_{k}_base"], t[f"{p}hc_{k}_scale"]) for k in ("attn", "ffn")}
        indexer = None
        if cfg.has_indexer(li):
            indexer = IndexerWeights(t[a + "indexer.wq_b.weight"], t[a + "indexer.weights_proj.weight"],
                                     comp(a + "indexer.compressor."))
        attn = AttnWeights(
            t[a + "wq_a.weight"], t[a + "q_norm.weight"], t[a + "wq_b.weight"], t[a + "wkv.weight"],
            t[a + "kv_norm.weight"], t[a + "attn_sink"], t[a + "wo_a.weight"], t[a + "wo_b.weight"],
            comp(a + "compressor.") if cfg.ratio(li) else None, indexer,
        )
        experts = range(cfg.n_routed_experts)
        stack = {w: torch.stack([t[f"{f}experts.{e}.{w}.weight"] for e in experts]) for w in ("w1", "w3", "w2")}
        shared = None
        if cfg.n_shared_experts:
            shared = tuple(t[f"{f}shared_experts.{w}.weight"] for w in ("w1", "w3", "w2"))
        hashed = cfg.hash_layers[li]
        moe = MoeWeights(t[f + "gate.weight"], None if hashed else t[f + "gate.bias"],
                         t[f + "gate.tid2eid"] if hashed else None, stack["w1"], stack["w3"], stack["w2"], shared)
        layers.append(LayerWeights(t[p + "attn_norm.weight"], t[p + "ffn_norm.weight"], hcw["attn"], hcw["ffn"], attn, moe))
    hc_head = HcHeadWeights(t["hc_head_fn"], t["hc_head_base"], t["hc_head_scale"])
    return Dsv4Weights(t["embed.weight"], t["head.weight"], t["norm.weight"], hc_head, layers)
