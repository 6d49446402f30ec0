"""tiny-dsv4: a seeded random DeepSeek V4 checkpoint that exercises every path, built on first use.

Owns the recipe (config, seed, weight scales, tokenizer with the V4 chat tokens)
and the writers: official tensor names (the default; routed experts in FP4 with
E8M0 scales like the real Flash), HF module names (experts fused, float), or an
FP8-quantized copy (block-scaled E4M3 attention and shared-expert matrices).

Scale: the reference's small test configuration with the real ratios: six
layers [0, 0, 4, 128, 4, 128] (window-only, CSA with indexer, HCA), window 16,
indexer top-8, 8 experts (top-2, one shared), three hash layers. The routed
experts are snapped to FP4-representable values, so every writer stores
exactly the same model. The directory is assembled in a temp dir beside the
target and renamed into place: concurrent first uses are safe (the first
rename wins). Bump RECIPE_VERSION on any change: config.json records it, and a
build from another recipe is replaced on next use.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from ds4tui import paths
from ds4tui.engine import quant
from ds4tui.engine.text.dsv4_chat import SPECIAL_TOKENS
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.dsv4.weights import expected_shapes, hf_top_names, official_to_hf
from ds4tui.engine.text.tiny_tokenizer import train_tiny_tokenizer

RECIPE_VERSION = 1
RECIPE_KEY = "ds4tui_tiny_recipe"  # in config.json: a build from an older recipe is replaced
SEED = 4_0_4_2026
VOCAB = 512
CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "head_dim": 80,  # 64 non-RoPE dims: one FP8 KV block of the real size (64)
    "qk_rope_head_dim": 16,  # YaRN ramp lo = 3, hi = 7: interpolated, mixed and plain pairs
    "q_lora_rank": 64,
    "o_groups": 2,
    "o_lora_rank": 32,
    "sliding_window": 16,
    "compress_ratios": [0, 0, 4, 128, 4, 128],
    "index_n_heads": 2,
    "index_head_dim": 32,  # Hadamard-32 and one FP4 block
    "index_topk": 8,  # ratio-4 layers have more than 8 rows from 36 tokens on
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 64,
    "num_hash_layers": 3,  # hash routing on window-only and CSA layers, biased top-k after
    "max_position_embeddings": 16384,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "swiglu_limit": 10.0,
    "routed_scaling_factor": 1.5,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
# Matrices stored as FP8 in the quantized copy (the attention and shared-expert projections).
FP8_SUFFIXES = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
                "attn.wo_b.weight", "attn.indexer.wq_b.weight", "shared_experts.w1.weight",
                "shared_experts.w2.weight", "shared_experts.w3.weight")


def tiny_dsv4_dir() -> Path:
    return paths.models_dir() / "tiny-dsv4"


def _recipe_of(target: Path) -> int | None:
    try:
        return json.loads((target / "config.json").read_text()).get(RECIPE_KEY)
    except (OSError, ValueError):
        return None


def tiny_config() -> Dsv4Config:
    return Dsv4Config.from_hf(CONFIG)


def random_tensors(cfg: Dsv4Config, seed: int = SEED) -> dict[str, torch.Tensor]:
    """Canonical-name float32 tensors (tid2eid int64), scaled to keep activations O(1)."""
    gen = torch.Generator().manual_seed(seed)
    shapes, _ = expected_shapes(cfg)
    out: dict[str, torch.Tensor] = {}

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("tid2eid"):
            rows = [torch.randperm(cfg.n_routed_experts, generator=gen)[: shape[1]] for _ in range(shape[0])]
            out[name] = torch.stack(rows).to(torch.int64)  # distinct experts per token
        elif name.endswith(("norm.weight",)):
            out[name] = 1.0 + 0.1 * randn(*shape)
        elif name.endswith("_base"):
            out[name] = 0.1 * randn(*shape)
        elif name.endswith(("_scale",)):
            out[name] = 1.0 + 0.1 * randn(*shape)
        elif name.endswith(("attn_sink", "ape")):
            out[name] = 0.5 * randn(*shape)
        elif name.endswith("gate.bias"):
            out[name] = 0.1 * randn(*shape)
        elif name == "embed.weight":
            out[name] = randn(*shape)
        else:  # projections [out, in]: unit-variance outputs for unit-variance inputs
            out[name] = randn(*shape) / shape[-1] ** 0.5
            if ".experts." in name:  # snap to FP4 so the FP4 and float copies are the same model
                out[name] = quant.dequant_fp4_weight(*quant.quant_fp4_weight(out[name]))
    return out


def to_stored(tensors: dict[str, torch.Tensor], names: str = "official", fp8: bool = False) -> dict[str, torch.Tensor]:
    """The stored form: official names (FP4 experts) or HF names (fused float experts);
    fp8=True stores FP8_SUFFIXES matrices as E4M3 + E8M0 block scales."""
    out: dict[str, torch.Tensor] = {}
    to_hf, top = official_to_hf(), hf_top_names()
    experts: dict[str, dict[str, list[torch.Tensor]]] = {}
    for name, t in tensors.items():
        if fp8 and name.endswith(FP8_SUFFIXES):
            w, s = quant.quant_fp8_weight(t)
            base = name[: -len(".weight")]
            scale_name = base + (".scale" if names == "official" else ".weight_scale_inv")
            stored = {name: w, scale_name: s}
        elif ".experts." in name and names == "official":
            w, s = quant.quant_fp4_weight(t)
            stored = {name: w, name[: -len(".weight")] + ".scale": s}
        else:
            stored = {name: t}
        for sname, st in stored.items():
            if names == "official":
                out[sname] = st.contiguous()
                continue
            if ".experts." in sname:  # layers.L.ffn.experts.E.wK.weight -> fused per layer
                parts = sname.split(".")
                experts.setdefault(parts[1], {}).setdefault(parts[5], []).append((int(parts[4]), st))
                continue
            out[_hf_name(sname, to_hf, top)] = st.contiguous()
    for layer, ws in experts.items():
        stack = {k: torch.stack([t for _, t in sorted(v, key=lambda p: p[0])]) for k, v in ws.items()}
        out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.cat([stack["w1"], stack["w3"]], dim=1)
        out[f"model.layers.{layer}.mlp.experts.down_proj"] = stack["w2"].contiguous()
    return out


def _hf_name(name: str, to_hf: dict[str, str], top: dict[str, str]) -> str:
    if name in top:
        return top[name]
    _, layer, rest = name.split(".", 2)
    for suffix in (".weight_scale_inv",):
        if rest.endswith(suffix):  # scale partner of an FP8 weight: follow the weight's HF name
            weight = to_hf[rest[: -len(suffix)] + ".weight"]
            return f"model.layers.{layer}.{weight[: -len('.weight')]}{suffix}"
    return f"model.layers.{layer}.{to_hf[rest]}"


def write_checkpoint(out_dir: Path, tensors: dict[str, torch.Tensor], names: str = "official", fp8: bool = False,
                     config: dict | None = None) -> Path:
    """Write config.json, two safetensors shards and tokenizer.json into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stored = to_stored(tensors, names, fp8)
    keys = sorted(stored)
    half = len(keys) // 2  # two shards: the loader must merge files
    for i, part in enumerate((keys[:half], keys[half:])):
        save_file({k: stored[k] for k in part}, str(out_dir / f"model-{i + 1:05d}-of-00002.safetensors"))
    config = dict(config or CONFIG, **{RECIPE_KEY: RECIPE_VERSION})
    (out_dir / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    train_tiny_tokenizer(SPECIAL_TOKENS, VOCAB).save(str(out_dir / "tokenizer.json"))
    return out_dir


def ensure_tiny_dsv4() -> Path:
    """The tiny checkpoint's directory, written once (seeded, deterministic)."""
    target = tiny_dsv4_dir()
    if _recipe_of(target) == RECIPE_VERSION:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-dsv4-", dir=target.parent))
    old = None
    try:
        write_checkpoint(tmp, random_tensors(tiny_config()))
        if target.exists() and _recipe_of(target) != RECIPE_VERSION:
            old = Path(tempfile.mkdtemp(prefix=".tiny-dsv4-old-", dir=target.parent))
            os.rename(target, old / "model")  # an older recipe: move it aside, then replace
        try:
            os.rename(tmp, target)
        except OSError:
            if _recipe_of(target) != RECIPE_VERSION:
                raise  # not a lost race with another builder: a real failure
    finally:
        for leftover in (tmp, old):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return target
