"""transformers' DeepseekV4ForCausalLM as the independent reference for the DSV4 engine.

Builds seeded tiny reference models, saves them with `save_pretrained` (the
tensor names and config.json keys transformers really writes, plus the two
ds4tui keys that turn our QAT and f16 cache roundings off) and loads that
directory through `load_model`, so the comparison also covers our name and
config mapping. transformers' own random init (std 0.02) makes every logit
nearly equal, so the weights are redrawn at scales that keep activations O(1):
sinks, compressor position biases and router biases large enough to matter.

Indexer ties: the official code and transformers pick the top-k with
`torch.topk`, whose order among equal scores is unspecified (transformers'
full and cached paths break the same tie differently); ds4 and ds4tui keep the
lower row. A score is exactly 0 when every index head's ReLU is 0, so with few
index heads ties at the top-k boundary are common and make the comparison
meaningless. The configs use 16 index heads, and `boundary_ties` lets a test
assert that its prompts hit none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, DynamicCache
from transformers.utils import logging as hf_logging

from ds4tui.engine.text.dsv4_chat import SPECIAL_TOKENS
from ds4tui.engine.text.tiny_tokenizer import train_tiny_tokenizer

hf_logging.set_verbosity_error()  # YaRN's "factor does not match max_position" note on tiny configs

VOCAB = 512  # the tiny tokenizer needs the 256 bytes, the specials and some merges
SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"


@dataclass(frozen=True)
class RefSpec:
    """One reference configuration: the DeepseekV4Config keyword arguments and a seed."""

    name: str
    seed: int
    kwargs: dict = field(hash=False)

    @property
    def window(self) -> int:
        return self.kwargs["sliding_window"]


SPECS = (
    # Every layer type, HCA at ratio 8 (many rows early), top-8 of up to 250 CSA rows at
    # 1000 tokens; YaRN on 16 rotary dims (ramp lo 0, hi 3: plain, mixed and scaled pairs).
    RefSpec("mixed", 11, dict(
        hidden_size=32, num_attention_heads=4, head_dim=32, partial_rotary_factor=0.5,
        q_lora_rank=16, o_groups=2, o_lora_rank=8, sliding_window=16,
        layer_types=[SLIDING, CSA, HCA, CSA],
        compress_rates={CSA: 4, HCA: 8},
        index_n_heads=16, index_head_dim=16, index_topk=8,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                         "beta_fast": 32, "beta_slow": 1},
    )),
    # Another shape everywhere: window 8, HCA first and at ratio 16, top-4, two HC streams with
    # 5 Sinkhorn rounds, 8 heads in 4 output groups, 4 rotary dims, two hash layers, top-3 of
    # 6 experts with a SwiGLU clamp that binds (limit 1).
    RefSpec("other", 23, dict(
        hidden_size=48, num_attention_heads=8, head_dim=16, partial_rotary_factor=0.25,
        q_lora_rank=24, o_groups=4, o_lora_rank=8, sliding_window=8,
        layer_types=[HCA, CSA, SLIDING, CSA, HCA],
        compress_rates={CSA: 4, HCA: 16},
        index_n_heads=16, index_head_dim=8, index_topk=4,
        n_routed_experts=6, num_experts_per_tok=3, moe_intermediate_size=24,
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
        hc_mult=2, hc_sinkhorn_iters=5, swiglu_limit=1.0, routed_scaling_factor=2.0,
        rope_theta=5000.0, compress_rope_theta=40000.0,
        rope_parameters={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 128,
                         "beta_fast": 32, "beta_slow": 1},
    )),
)


def build_reference(spec: RefSpec) -> DeepseekV4ForCausalLM:
    """A seeded DeepseekV4ForCausalLM (float32, eval) with O(1)-scaled random weights."""
    kw = dict(spec.kwargs)
    n = len(kw["layer_types"])
    cfg = DeepseekV4Config(vocab_size=VOCAB, num_hidden_layers=n, max_position_embeddings=4096, **kw)
    torch.manual_seed(spec.seed)  # transformers' init, overwritten below but drawn from torch's RNG
    model = DeepseekV4ForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if "inv_freq" in name:
                continue
            if name.endswith("tid2eid"):
                k, e = p.shape[1], cfg.n_routed_experts
                p.copy_(torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(p.shape[0])]))
                continue
            r = torch.randn(p.shape, generator=gen)
            if "norm" in name or name.endswith("scale"):
                p.copy_(1.0 + 0.1 * r)
            elif name.endswith("base") or name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * r)
            elif name.endswith(("sinks", "position_bias")):
                p.copy_(0.5 * r)
            elif "embed_tokens" in name:
                p.copy_(r)
            else:  # projections [.., out, in]: unit-variance outputs for unit-variance inputs
                p.copy_(r / p.shape[-1] ** 0.5)
    return model


def save_reference(model: DeepseekV4ForCausalLM, out_dir: Path) -> Path:
    """save_pretrained, plus the ds4tui keys for a float comparison and a tokenizer.json."""
    model.save_pretrained(out_dir)
    config_file = out_dir / "config.json"
    config = json.loads(config_file.read_text())
    config.update({"ds4tui_qat": False, "ds4tui_cache_f16": False})
    config_file.write_text(json.dumps(config, indent=1) + "\n")
    train_tiny_tokenizer(SPECIAL_TOKENS, VOCAB).save(str(out_dir / "tokenizer.json"))
    return out_dir


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(len(SPECIAL_TOKENS), VOCAB, (n,), generator=g).tolist()


class Recorder:
    """Forward hooks on every CSA layer's indexer: its top-k output and its scores, per call."""

    def __init__(self, model: DeepseekV4ForCausalLM) -> None:
        self.selected: dict[int, list[torch.Tensor]] = {}
        self.scores: dict[int, list[torch.Tensor]] = {}
        self.handles = []
        for li, layer in enumerate(model.model.layers):
            comp = layer.self_attn.compressor
            indexer = getattr(comp, "indexer", None)
            if indexer is None:
                continue
            self.handles.append(indexer.register_forward_hook(
                lambda _m, _i, out, li=li: self.selected.setdefault(li, []).append(out[0].clone())))
            self.handles.append(indexer.scorer.register_forward_hook(
                lambda _m, _i, out, li=li: self.scores.setdefault(li, []).append(out[0].clone())))

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def hf_logits(model: DeepseekV4ForCausalLM, toks: list[int]) -> tuple[torch.Tensor, DynamicCache]:
    """One full-sequence forward: logits [n, V] and the cache it filled."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(torch.tensor([toks]), cache=cache, use_cache=True)
    return out.logits[0], cache


def hf_decode(model: DeepseekV4ForCausalLM, cache: DynamicCache, toks: list[int]) -> torch.Tensor:
    """Feed toks one at a time through the cache: logits [n, V]."""
    rows = []
    with torch.no_grad():
        for t in toks:
            rows.append(model(torch.tensor([[t]]), cache=cache, use_cache=True).logits[0, -1])
    return torch.stack(rows)


def rel_diff(ours: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per position: max |ours - ref| over the vocab, relative to the reference's logit scale."""
    return (ours - ref).abs().amax(dim=-1) / ref.std()


def boundary_ties(scores: torch.Tensor, k: int, ratio: int, first_pos: int = 0) -> list[int]:
    """Positions whose k-th and (k+1)-th visible index scores are equal (scores [n, rows])."""
    ties = []
    for i, row in enumerate(scores):
        visible = (first_pos + i + 1) // ratio
        if visible > k:
            top = torch.sort(row[:visible], descending=True).values
            if top[k - 1] == top[k]:
                ties.append(first_pos + i)
    return ties
