"""DeepSeek V4 attention block: query/KV projections, the lightning indexer, sink attention.

Owns the attention half of one layer for a chunk of n tokens at absolute
positions p0..p0+n-1 (n = 1 is decode):
1. low-rank query c = q_norm(wq_a.a), q = wq_b.c per head, unweighted RMSNorm,
   RoPE on the last rope dims; one shared KV row kv = kv_norm(wkv.a), roped,
   QAT-rounded and stored: it is both key and value;
2. the raw ring is appended BEFORE attention (token t sees raw rows
   max(0, t-W+1)..t), and the compressors run over the whole chunk, so a row
   completed by token t is visible to t itself;
3. per query: one softmax over raw rows, compressed rows c < (t+1)//R (on
   ratio-4 layers only the indexer's top-k of them) and the per-head sink
   logit, which joins the denominator with no value; scale 1/sqrt(head_dim);
4. inverse RoPE on the output (V carried the rotation), then the grouped
   output projection wo_a (per group of heads) and wo_b.
Queries are processed in blocks so a long chunk never builds an n x n matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ds4tui.engine import quant
from ds4tui.engine.dsv4.cache import LayerCache
from ds4tui.engine.dsv4.compressor import CompressorWeights, compress
from ds4tui.engine.dsv4.config import CSA_RATIO, Dsv4Config
from ds4tui.engine.dsv4.hc import rms_norm
from ds4tui.engine.dsv4.linear import grouped_linear, linear
from ds4tui.engine.dsv4.rope import Rope, apply_rope
from ds4tui.format.swa_policy import QUERY_BLOCK  # score blocks: [64, heads, W + 64 + compressed rows] at most


# on_select(layer, positions [q], mask [q, rows]): the indexer's choice per query (traces).
SelectHook = Callable[[int, torch.Tensor, torch.Tensor], None]


@dataclass
class IndexerWeights:
    wq_b: torch.Tensor  # [index_heads * index_dim, q_lora]
    weights_proj: torch.Tensor  # [index_heads, D]
    comp: CompressorWeights  # the indexer's own compressor (index_dim rows)


@dataclass
class AttnWeights:
    wq_a: torch.Tensor  # [q_lora, D]
    q_norm: torch.Tensor  # [q_lora]
    wq_b: torch.Tensor  # [H * d, q_lora]
    wkv: torch.Tensor  # [d, D]
    kv_norm: torch.Tensor  # [d]
    sink: torch.Tensor  # [H]
    wo_a: torch.Tensor  # [groups * o_rank, H * d / groups]
    wo_b: torch.Tensor  # [D, groups * o_rank]
    comp: CompressorWeights | None
    indexer: IndexerWeights | None


def finish_kv(cfg: Dsv4Config) -> Callable[[torch.Tensor], torch.Tensor]:
    """Storage rounding of 512-style KV rows (raw and compressed): FP8 QAT, f16, then f32."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        if cfg.qat_kv_fp8:
            x = quant.fp8_kv_qat(x, cfg.rope_head_dim, cfg.kv_fp8_block)
        if cfg.cache_f16:
            x = quant.f16_round(x)
        return x.to(torch.float32).to(x.dtype)

    return fn


def finish_index(cfg: Dsv4Config) -> Callable[[torch.Tensor], torch.Tensor]:
    """Storage rounding of indexer rows: Hadamard + FP4 QAT, f16, then f32."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        if cfg.qat_indexer_fp4:
            x = quant.indexer_qat(x)
        if cfg.cache_f16:
            x = quant.f16_round(x)
        return x.to(torch.float32).to(x.dtype)

    return fn


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    key_pos0: int,
    p0: int,
    window: int,
    sink: torch.Tensor,
    comp: torch.Tensor | None = None,
    ratio: int = 0,
    select: Callable[[int, int, int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Sink attention for queries q [n, H, d] at positions p0.. over K = V rows.

    keys [K, d]: raw rows of positions key_pos0.. (must cover p0-W+1..p0+n-1);
    comp [Nc, d]: compressed rows (ratio R), row c visible to t iff c < (t+1)//R;
    select(b0, b1, nvis) -> bool [b1-b0, nvis]: the indexer's extra restriction.
    """
    n, heads, d = q.shape
    scale = d**-0.5
    out = torch.empty_like(q)
    for b0 in range(0, n, QUERY_BLOCK):
        b1 = min(n, b0 + QUERY_BLOCK)
        t = torch.arange(p0 + b0, p0 + b1)  # absolute query positions [qb]
        lo, hi = max(key_pos0, p0 + b0 - window + 1), p0 + b1
        kv = keys[lo - key_pos0 : hi - key_pos0]  # [k, d]
        kpos = torch.arange(lo, hi)
        mask = (kpos[None, :] <= t[:, None]) & (kpos[None, :] > t[:, None] - window)  # [qb, k]
        if comp is not None:
            nvis = (p0 + b1) // ratio  # rows visible to the block's last query
            cmask = torch.arange(nvis)[None, :] < ((t + 1) // ratio)[:, None]  # [qb, nvis]
            if select is not None:
                cmask = cmask & select(b0, b1, nvis)
            kv = torch.cat([kv, comp[:nvis]])
            mask = torch.cat([mask, cmask], dim=1)
        s = (q[b0:b1] @ kv.T) * scale  # [qb, H, k]
        s = s.masked_fill(~mask[:, None, :], float("-inf"))
        top = torch.maximum(s.amax(dim=-1), sink[None, :])  # [qb, H]; own raw row keeps it finite
        e = torch.exp(s - top[..., None])
        den = e.sum(dim=-1) + torch.exp(sink[None, :] - top)
        out[b0:b1] = (e @ kv) / den[..., None]  # [qb, H, d]
    return out


def index_selector(
    cfg: Dsv4Config,
    w: IndexerWeights,
    rows: torch.Tensor,
    c: torch.Tensor,
    a: torch.Tensor,
    p0: int,
    rope: Rope,
    on_select: Callable[[torch.Tensor, torch.Tensor], None] | None,
) -> Callable[[int, int, int], torch.Tensor]:
    """The lightning indexer for one chunk: returns select(b0, b1, nvis) for `attend`.

    score[t, c] = sum_h w_h(t) * relu(qI_h(t) . kI_c) over visible rows; a query sees all
    rows when it has at most index_topk of them, else the top index_topk (ties to the
    lower row, like ds4's strict `>`).
    """
    n, heads, dim = a.shape[0], cfg.index_n_heads, cfg.index_head_dim
    k = cfg.index_topk
    state: dict[str, torch.Tensor] = {}

    def project() -> tuple[torch.Tensor, torch.Tensor]:
        # Lazily: a chunk whose queries all see <= k rows never needs the indexer scores.
        if not state:
            cos, sin = rope.cos_sin(torch.arange(p0, p0 + n), a.dtype)
            qi = apply_rope(linear(c, w.wq_b).reshape(n, heads, dim), cos, sin)  # [n, IH, Id]
            if cfg.qat_indexer_fp4:
                qi = quant.indexer_qat(qi)
            state["q"] = qi
            state["w"] = linear(a, w.weights_proj) * (dim * heads) ** -0.5  # [n, IH]
        return state["q"], state["w"]

    def select(b0: int, b1: int, nvis: int) -> torch.Tensor:
        t = torch.arange(p0 + b0, p0 + b1)
        visible = torch.arange(nvis)[None, :] < ((t + 1) // CSA_RATIO)[:, None]
        if nvis <= k:
            chosen = visible
        else:
            qi, wts = project()
            krows = rows[:nvis].to(a.dtype)
            s = torch.relu(qi[b0:b1] @ krows.T)  # [qb, IH, rows]
            score = (wts[b0:b1, None, :] @ s)[:, 0].masked_fill(~visible, float("-inf"))  # [qb, rows]
            order = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :k]
            chosen = torch.zeros_like(visible).scatter_(1, order, True) & visible
        if on_select is not None:
            on_select(t, chosen)
        return chosen

    return select


def attention(
    cfg: Dsv4Config,
    layer: int,
    w: AttnWeights,
    cache: LayerCache,
    a: torch.Tensor,
    p0: int,
    rope: Rope,
    on_select: SelectHook | None = None,
) -> torch.Tensor:
    """a [n, D] (attn-normed) at positions p0.. -> [n, D]; updates `cache`."""
    n, dtype, eps = a.shape[0], a.dtype, cfg.rms_norm_eps
    heads, d = cfg.num_attention_heads, cfg.head_dim
    cos, sin = rope.cos_sin(torch.arange(p0, p0 + n), dtype)
    c = rms_norm(linear(a, w.wq_a), w.q_norm, eps)  # [n, q_lora]
    q = rms_norm(linear(c, w.wq_b).reshape(n, heads, d), None, eps)  # [n, H, d]
    q = apply_rope(q, cos, sin)
    fin_kv = finish_kv(cfg)
    kv = fin_kv(apply_rope(rms_norm(linear(a, w.wkv), w.kv_norm, eps), cos, sin))  # [n, d]

    past = cache.raw_logical(p0, cfg.sliding_window).to(dtype)  # [live, d], oldest first
    keys = torch.cat([past, kv])
    key_pos0 = p0 - past.shape[0]
    cache.write_raw(kv, p0)

    comp_rows, select = None, None
    if cache.attn is not None and w.comp is not None:
        compress(cache.attn, w.comp, a, p0, rope, fin_kv, eps)
        comp_rows = cache.attn.rows[: cache.attn.n_rows].to(dtype)
        if cache.index is not None and w.indexer is not None:
            compress(cache.index, w.indexer.comp, a, p0, rope, finish_index(cfg), eps)
            hook = None if on_select is None else (lambda t, m: on_select(layer, t, m))
            select = index_selector(cfg, w.indexer, cache.index.rows, c, a, p0, rope, hook)
    out = attend(q, keys, key_pos0, p0, cfg.sliding_window, w.sink, comp_rows, cache.ratio, select)

    out = apply_rope(out, cos, sin, inverse=True)
    groups = cfg.o_groups
    grouped = out.reshape(n, groups, heads * d // groups)  # [n, G, heads/G * d]
    low = grouped_linear(grouped, w.wo_a, groups)  # [n, G*rank]: wo_a is [G*rank, heads/G * d]
    return linear(low, w.wo_b)
