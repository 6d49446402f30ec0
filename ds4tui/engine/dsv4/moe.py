"""DeepSeek V4 mixture-of-experts FFN: hash or biased top-k routing, routed + shared experts.

Owns the FFN half of a layer. Router scores are sqrt(softplus(gate . f)).
Hash layers (the first `num_hash_layers`) take their experts from the fixed
table tid2eid[token]; the others take the top-k of score + bias, where the bias
only chooses (the weights are the unbiased scores). Weights are renormalized
and scaled by `routed_scaling_factor`. Every expert, the shared one included,
is a SwiGLU whose gate is clamped from above and whose up is clamped on both
sides at `swiglu_limit` (0: no clamp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ds4tui.engine.dsv4.linear import ExpertBank, Weight, linear

# ds4 divides by max(sum, this) rather than adding an epsilon: a fixed floor keeps the
# normalization finite even if every selected score underflows.
WEIGHT_SUM_FLOOR = 2.0**-14  # 6.1035e-5, ds4's value


@dataclass
class MoeWeights:
    gate: Weight  # [E, D] router
    bias: torch.Tensor | None  # [E] selection-only bias (top-k layers)
    tid2eid: torch.Tensor | None  # int64 [V, k] (hash layers)
    # Routed experts, indexed by expert id: stacked tensors [E, F, D] / [E, D, F], or a GGUF's
    # ExpertBank (each expert's rows read from the file's blocks, none copied).
    w1: torch.Tensor | ExpertBank  # gate projections
    w3: torch.Tensor | ExpertBank  # up projections
    w2: torch.Tensor | ExpertBank  # down projections
    shared: tuple[Weight, Weight, Weight] | None  # (w1 [F, D], w3 [F, D], w2 [D, F])


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(gate) * up with both clamped at `limit`; a limit of 0 (or less) means no clamp,
    as in the official inference code (`Expert.forward`: `if self.swiglu_limit > 0:`)."""
    if limit <= 0:
        return F.silu(gate) * up
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def route(
    f: torch.Tensor, token_ids: torch.Tensor, w: MoeWeights, top_k: int, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """f [n, D] -> (expert ids int64 [n, k], weights [n, k])."""
    scores = torch.sqrt(F.softplus(linear(f, w.gate)))  # [n, E]
    if w.tid2eid is not None:
        ids = w.tid2eid[token_ids]
    else:
        biased = scores if w.bias is None else scores + w.bias
        # A stable descending sort breaks ties toward the lower expert id, like ds4's strict `>`.
        ids = torch.sort(biased, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=WEIGHT_SUM_FLOOR) * scaling
    return ids, weights


def moe_forward(
    f: torch.Tensor,
    token_ids: torch.Tensor,
    w: MoeWeights,
    top_k: int,
    scaling: float,
    limit: float,
    on_route: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """f [n, D] (the ffn-normed input) -> routed + shared expert output [n, D]."""
    ids, weights = route(f, token_ids, w, top_k, scaling)
    if on_route is not None:
        on_route(ids)
    out = torch.zeros_like(f)
    # Experts in ascending id order: each token accumulates its experts in the same order
    # whether it runs alone (decode) or in a batch (prefill).
    if f.shape[0] == 1:  # decode: no grouping needed (fewer, cheaper ops than the batch path)
        for slot, e in sorted(enumerate(ids[0].tolist()), key=lambda p: p[1]):
            h = swiglu(linear(f, w.w1[e]), linear(f, w.w3[e]), limit)
            out += linear(h, w.w2[e]) * weights[:, slot, None]
        ids = ids[:0]  # nothing left for the grouped loop
    for e in torch.unique(ids).tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)
        x = f[rows]  # [m, D]
        h = swiglu(linear(x, w.w1[e]), linear(x, w.w3[e]), limit)  # [m, F]
        out.index_add_(0, rows, linear(h, w.w2[e]) * weights[rows, slot, None])
    if w.shared is not None:
        s1, s3, s2 = w.shared
        out = out + linear(swiglu(linear(f, s1), linear(f, s3), limit), s2)
    return out
