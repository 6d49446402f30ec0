"""The DeepSeek V4 network: one forward over a chunk of tokens, layer by layer.

Owns the decoder loop (embedding -> hyper-connection streams -> per layer:
HC pre, attention, HC post, HC pre, MoE, HC post -> HC head, norm, logits) and
the optional trace of discrete decisions that tests compare between paths.
Weights come in as `Dsv4Weights` (weights.py); state as the session's
`LayerCache` list (cache.py), which the forward updates in place.
"""

from __future__ import annotations

import time
from typing import Callable
from dataclasses import dataclass, field

import torch

from ds4tui.engine.dsv4.attention import attention
from ds4tui.engine.dsv4.cache import LayerCache
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.dsv4.hc import hc_head, hc_post, hc_pre, rms_norm
from ds4tui.engine.dsv4.linear import linear
from ds4tui.engine.dsv4.moe import moe_forward
from ds4tui.engine.dsv4.rope import layer_ropes
from ds4tui.engine.dsv4.weights import Dsv4Weights


@dataclass
class Dsv4Trace:
    """Discrete choices per (layer, position), and optionally every position's logits.

    Attach one to a session (`session.trace = Dsv4Trace()`) to compare decode,
    batched and chunked prefill: identical traces mean identical indexer sets
    and expert ids, whatever the floating-point differences.
    """

    all_logits: bool = False
    indexer: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    experts: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    logits: dict[int, torch.Tensor] = field(default_factory=dict)

    def on_select(self, layer: int, positions: torch.Tensor, mask: torch.Tensor) -> None:
        for pos, row in zip(positions.tolist(), mask):
            self.indexer[(layer, pos)] = tuple(row.nonzero().flatten().tolist())

    def on_route(self, layer: int, positions: list[int], ids: torch.Tensor) -> None:
        for pos, row in zip(positions, ids.tolist()):
            self.experts[(layer, pos)] = tuple(row)


class Dsv4Net:
    """Weights plus the math; stateless (all state is in the caches passed to forward)."""

    def __init__(self, cfg: Dsv4Config, weights: Dsv4Weights) -> None:
        self.cfg = cfg
        self.w = weights
        self.dtype = weights.norm.dtype  # the compute dtype (a GGUF's embedding rows are f16)
        self.rope_main, self.rope_comp = layer_ropes(cfg)
        # paging.LayerObserver hooks around every layer (an expert pager, a per-layer clock)
        self.observers: list = []

    def forward(
        self,
        caches: list[LayerCache],
        tokens: list[int],
        p0: int,
        want_logits: bool,
        trace: Dsv4Trace | None = None,
        before_layer: Callable[[int], None] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Run tokens at positions p0..; returns (float32 logits [V] of the last position
        or None, the last position's HC streams [1, hc, D] for logits later). before_layer(i),
        when given, is called before layer i touches its cache (a prefill's cancel check: it
        may raise, and the session puts the caches back)."""
        cfg = self.cfg
        ids = torch.tensor(tokens, dtype=torch.long)
        n, hc = ids.shape[0], cfg.hc_mult
        x = self.w.embed[ids].to(self.dtype)  # [n, D]
        streams = x[:, None, :].expand(n, hc, x.shape[1]).contiguous()  # [n, hc, D]: all copies
        positions = list(range(p0, p0 + n))
        on_select = None if trace is None else trace.on_select
        observers = self.observers
        for li, lw in enumerate(self.w.layers):
            if before_layer is not None:
                before_layer(li)
            for o in observers:
                o.layer_start(li, ids)
            t_layer = time.perf_counter()
            rope = self.rope_comp if cfg.ratio(li) else self.rope_main
            h, post, comb = hc_pre(streams, lw.hc_attn, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)
            a = rms_norm(h, lw.attn_norm, cfg.rms_norm_eps)
            y = attention(cfg, li, lw.attn, caches[li], a, p0, rope, on_select)
            streams = hc_post(y, streams, post, comb)

            h, post, comb = hc_pre(streams, lw.hc_ffn, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)
            f = rms_norm(h, lw.ffn_norm, cfg.rms_norm_eps)
            on_route = None
            if trace is not None or observers:
                def on_route(e, li=li):
                    if trace is not None:
                        trace.on_route(li, positions, e)
                    for o in observers:
                        o.routed(li, e)
            z = moe_forward(
                f, ids, lw.moe, cfg.num_experts_per_tok, cfg.routed_scaling_factor, cfg.swiglu_limit, on_route
            )
            streams = hc_post(z, streams, post, comb)
            for o in observers:
                o.layer_done(li, time.perf_counter() - t_layer, n)
        if trace is not None and trace.all_logits:
            for pos, row in zip(positions, self.logits_of(streams)):
                trace.logits[pos] = row
        last = streams[-1:]
        return (self.logits_of(last)[0] if want_logits else None), last

    def logits_of(self, streams: torch.Tensor) -> torch.Tensor:
        """HC streams [m, hc, D] -> float32 logits [m, V]."""
        cfg = self.cfg
        h = hc_head(streams, self.w.hc_head, cfg.hc_eps, cfg.rms_norm_eps)
        return linear(rms_norm(h, self.w.norm, cfg.rms_norm_eps), self.w.head).to(torch.float32)
