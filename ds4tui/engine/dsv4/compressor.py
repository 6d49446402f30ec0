"""DeepSeek V4 KV compressor: pools every `ratio` tokens into one compressed row.

Owns the frontier update and the pooling, shared by the attention compressor
(rows of head_dim) and the indexer's compressor (rows of index_head_dim).
Decode (one token) and prefill (a chunk) call the same `compress` with the same
`pool`: only the number of closed windows differs, never the reduction order
within a window.

Per token p: kv_p = wkv.a and score_p = wgate.a + ape[p mod R] (width coff*dim).
When (p+1) mod R == 0 the window closes and, per channel j < dim, a softmax over
the window's scores weights its kv values. At ratio 4 (coff = 2) there are 8
candidates: lane A (columns :dim) of the previous window's 4 tokens and lane B
(columns dim:) of the current window's 4, so row c pools tokens 4c-4..4c+3; row
0's lane A is empty (weight 0). The pooled row is RMS-normed, rotated at the
window's first position, QAT-rounded and stored. Row c is visible to token t
iff c < (t+1) // R.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ds4tui.engine.dsv4.cache import EMPTY_SCORE, EMPTY_THRESHOLD, CompressorState
from ds4tui.engine.dsv4.hc import rms_norm
from ds4tui.engine.dsv4.linear import linear
from ds4tui.engine.dsv4.rope import Rope, apply_rope


@dataclass
class CompressorWeights:
    wkv: torch.Tensor  # [coff*dim, D]
    wgate: torch.Tensor  # [coff*dim, D]
    ape: torch.Tensor  # [ratio, coff*dim] per-slot score bias
    norm: torch.Tensor  # [dim]


def pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """Softmax-pool the candidates of closed windows: kv, score [m, C, dim] -> [m, dim].

    Channels whose candidates are all empty pool to 0."""
    top = score.amax(dim=1)  # [m, dim]
    e = torch.exp(score - top[:, None, :])  # empty slots: exp(-1e30 - top) == 0 exactly
    out = (e * kv).sum(dim=1) / e.sum(dim=1)
    return torch.where(top <= EMPTY_THRESHOLD, torch.zeros_like(out), out)


def advance_frontier(
    st: CompressorState, kv_new: torch.Tensor, score_new: torch.Tensor, first_pos: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Append the projections of positions first_pos.. ([n, width], float32) to the frontier.

    Returns the candidates of every window closed by them, (kv, score) each [m, C, dim]
    (C = coff * ratio), and the absolute position of the first closed window's first token.
    Leaves the frontier in canonical form.
    """
    r, off, dim = st.ratio, st.current_offset, st.dim
    pending = first_pos % r  # tokens of the current window already in the frontier
    cur_kv = torch.cat([st.state_kv[off : off + pending], kv_new])  # [pending + n, width]
    cur_sc = torch.cat([st.state_score[off : off + pending], score_new])
    m, rem = divmod(cur_kv.shape[0], r)
    win_kv = cur_kv[: m * r].reshape(m, r, st.width)  # [m windows, r slots, width]
    win_sc = cur_sc[: m * r].reshape(m, r, st.width)
    if st.coff == 2 and m:
        # Lane A comes from the window before each closed one: the frontier's rows 0..r-1
        # for the first, the previous closed window for the others.
        prev_kv = torch.cat([st.state_kv[None, :r], win_kv[:-1]])  # [m, r, width]
        prev_sc = torch.cat([st.state_score[None, :r], win_sc[:-1]])
        cand_kv = torch.cat([prev_kv[:, :, :dim], win_kv[:, :, dim:]], dim=1)  # [m, 2r, dim]
        cand_sc = torch.cat([prev_sc[:, :, :dim], win_sc[:, :, dim:]], dim=1)
        st.state_kv[:r] = win_kv[-1]
        st.state_score[:r] = win_sc[-1]
    elif st.coff == 2:
        cand_kv = cand_sc = cur_kv.new_zeros((0, 2 * r, dim))
    else:
        cand_kv, cand_sc = win_kv, win_sc
    st.state_kv[off:] = 0.0
    st.state_score[off:] = EMPTY_SCORE
    st.state_kv[off : off + rem] = cur_kv[m * r :]
    st.state_score[off : off + rem] = cur_sc[m * r :]
    return cand_kv, cand_sc, first_pos - pending


def compress(
    st: CompressorState,
    w: CompressorWeights,
    a: torch.Tensor,
    first_pos: int,
    rope: Rope,
    finish: Callable[[torch.Tensor], torch.Tensor],
    eps: float,
) -> int:
    """Run the compressor over a [n, D] (the attn-normed input of positions first_pos..).

    `finish` is the QAT/storage rounding of the emitted rows. Appends the rows of
    every window the chunk closes to st.rows; returns how many were emitted.
    """
    if st.frozen:  # rows and frontier restored ahead of an SWA replay (swa.py)
        return 0
    n = a.shape[0]
    slots = torch.arange(first_pos, first_pos + n) % st.ratio
    kv = linear(a, w.wkv).to(torch.float32)  # [n, width]
    score = (linear(a, w.wgate) + w.ape[slots]).to(torch.float32)
    cand_kv, cand_sc, win0 = advance_frontier(st, kv, score, first_pos)
    m = cand_kv.shape[0]
    if m == 0:
        return 0
    dtype = a.dtype
    pooled = rms_norm(pool(cand_kv.to(dtype), cand_sc.to(dtype)), w.norm, eps)  # [m, dim]
    positions = win0 + st.ratio * torch.arange(m)  # each row sits at its window's first token
    cos, sin = rope.cos_sin(positions, dtype)
    rows = finish(apply_rope(pooled, cos, sin))
    st.rows[st.n_rows : st.n_rows + m] = rows.to(torch.float32)
    st.n_rows += m
    return m
