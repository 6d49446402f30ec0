"""The KV state of a DeepSeek V4 session, per layer: explicit, static, float32.

Owns the buffers and their invariants (the math that fills them lives in
compressor.py and attention.py; their bytes on disk in payload.py):

- `LayerCache.raw`: the raw sliding-window ring, [raw_cap, head_dim], the row of
  absolute position p in slot p % raw_cap; after T tokens the live rows are
  positions max(0, T - window)..T-1 (`raw_positions`).
- `CompressorState` (the attention compressor of every ratio != 0 layer, and
  the indexer's own compressor on ratio-4 layers): the emitted rows
  [n_rows, dim] (n_rows = T // ratio) and the frontier (state_kv, state_score),
  each [coff * ratio, coff * dim].

Frontier canonical form (kept after every forward, so saved bytes depend only on
the tokens): slot rows of the current window not yet written hold kv 0 and score
EMPTY_SCORE; with ratio 4, rows 0..3 hold the previous complete window (its lane A
is the overlap input of the next row), rows 4..7 the current partial window.

Everything is float32 whatever the compute dtype: the payload is f32, so a
restored session holds exactly the numbers the saving one held.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# ds4's "minus infinity" for compressor scores; anything <= EMPTY_THRESHOLD is an empty slot.
# A finite sentinel keeps the payload free of infinities and exp(EMPTY - m) an exact 0.
EMPTY_SCORE = -1.0e30
EMPTY_THRESHOLD = -5.0e29


class CompressorState:
    """Rows and frontier of one compressor (attention rows at head_dim, or indexer rows)."""

    def __init__(self, ratio: int, dim: int, capacity: int) -> None:
        self.ratio = ratio
        self.coff = 2 if ratio == 4 else 1
        self.dim = dim
        self.width = self.coff * dim  # projection width: lane A | lane B at ratio 4
        self.rows = torch.zeros((capacity, dim), dtype=torch.float32)
        self.n_rows = 0
        self.state_kv = torch.zeros((self.coff * ratio, self.width), dtype=torch.float32)
        self.state_score = torch.full((self.coff * ratio, self.width), EMPTY_SCORE, dtype=torch.float32)
        # True while a load re-runs tokens whose rows and frontier were restored (swa.py):
        # `compress` then emits nothing and the rows are inputs only.
        self.frozen = False

    @property
    def capacity(self) -> int:
        return self.rows.shape[0]

    @property
    def current_offset(self) -> int:
        """First frontier row of the current window (ratio 4 keeps the previous one in front)."""
        return self.ratio if self.coff == 2 else 0

    def state_bytes(self) -> int:
        return 2 * self.state_kv.numel() * 4

    def reset(self) -> None:
        self.rows.zero_()
        self.n_rows = 0
        self.state_kv.zero_()
        self.state_score.fill_(EMPTY_SCORE)


@dataclass
class LayerCache:
    """All state of one layer: raw ring, optional attention compressor and indexer."""

    ratio: int
    raw: torch.Tensor  # [raw_cap, head_dim] ring
    attn: CompressorState | None  # ratio != 0
    index: CompressorState | None  # ratio == 4

    @property
    def raw_cap(self) -> int:
        return self.raw.shape[0]

    def raw_positions(self, n_tokens: int, window: int) -> range:
        """Absolute positions of the live raw rows after n_tokens, oldest first."""
        live = min(n_tokens, window, self.raw_cap)
        return range(n_tokens - live, n_tokens)

    def raw_slots(self, positions: range) -> torch.Tensor:
        return torch.arange(positions.start, positions.stop) % self.raw_cap

    def raw_logical(self, n_tokens: int, window: int) -> torch.Tensor:
        """The live raw rows in logical order (oldest first): [live, head_dim] (a copy)."""
        return self.raw[self.raw_slots(self.raw_positions(n_tokens, window))]

    def write_raw(self, rows: torch.Tensor, first_pos: int) -> None:
        """Store rows [n, head_dim] of positions first_pos..; only the last raw_cap survive."""
        n = rows.shape[0]
        keep = min(n, self.raw_cap)
        positions = range(first_pos + n - keep, first_pos + n)
        self.raw[self.raw_slots(positions)] = rows[n - keep :].to(torch.float32)

    def reset(self) -> None:
        self.raw.zero_()
        for st in (self.attn, self.index):
            if st is not None:
                st.reset()


def new_layer_caches(
    ratios: list[int], head_dim: int, index_head_dim: int, window: int, ctx_size: int
) -> list[LayerCache]:
    """Static buffers for a session of ctx_size tokens: nothing grows afterwards."""
    raw_cap = min(window, ctx_size)
    caches = []
    for r in ratios:
        attn = CompressorState(r, head_dim, ctx_size // r) if r else None
        index = CompressorState(r, index_head_dim, ctx_size // r) if r == 4 else None
        caches.append(LayerCache(r, torch.zeros((raw_cap, head_dim), dtype=torch.float32), attn, index))
    return caches
