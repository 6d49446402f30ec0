"""SWA storage policies of llama-family sessions with sliding-window layers (Gemma 3).

Owns, per session (`LlamaSwa`, `session.swa`): the policy a save uses, the copy of
the sliding rings at the last periodic frontier, and what the last load recomputed;
per payload: which window a save stores and where a load's replay starts
(`layout_for_save`, `layout_from_header`, on the `SwaLayout` shared with DSV4).

Global (full-attention) layers are always stored whole: they are the exact state
every later token reads. Sliding layers are stored under the policy:
- full: the ring as of T; nothing is recomputed.
- periodic:K: the ring as of P = floor(T/K')K' (K' = K rounded up to the prefill
  chunk); a load re-runs P..T-1, the very chunks a cold prefill ran, on the same
  inputs: bit-exact.
- zero: no sliding rows. A sliding layer's row at t depends on tokens t-(W-1)..t of
  the layer below, and global layers add no look-back because the replay reads
  their stored rows and writes none (`frozen_global`), so the last window of the top
  sliding layer needs the last n_sliding*(W-1)+1 tokens. The start moves back to a
  multiple of the prefill chunk, so the replay runs the cold prefill's chunks with
  the same shapes: rows that converged are computed from identical inputs, bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ds4tui.engine.swa_layout import RestoreInfo, SwaLayout, header_policy
from ds4tui.format.payload import Dsv4Header
from ds4tui.format.swa_policy import FULL_POLICY, PERIODIC, ZERO, SwaPolicy, stored_window_at, zero_replay_start


@dataclass
class LlamaSwa:
    policy: SwaPolicy = FULL_POLICY
    snapshot_at: int | None = None  # position of the periodic snapshot
    snapshot: list[torch.Tensor] | None = None  # per sliding layer [min(P, W), 2, Hkv, D], oldest first
    replaying: bool = False
    last_restore: RestoreInfo | None = None

    def forget(self) -> None:
        self.snapshot_at = self.snapshot = self.last_restore = None


def zero_start(tokens: int, n_sliding: int, window: int, chunk: int) -> int:
    """First token a zero-policy load re-runs: the receptive field of the last window,
    moved back to a chunk boundary (see the module docstring)."""
    return zero_replay_start(tokens, n_sliding, window, chunk, block=chunk)


def layout_for_save(swa: LlamaSwa, tokens: int, chunk: int, n_sliding: int, window: int) -> SwaLayout:
    """The layout a save writes now. A periodic session with no snapshot at its last frontier
    (restored from a file, or its policy just changed) writes a full payload instead."""
    pol = swa.policy
    if pol.kind == PERIODIC:
        k = pol.effective_period(chunk)
        p = tokens // k * k
        if p in (0, tokens) or swa.snapshot_at == p:
            return SwaLayout(SwaPolicy(PERIODIC, k), tokens, p, p)
    elif pol.kind == ZERO:
        return SwaLayout(pol, tokens, 0, zero_start(tokens, n_sliding, window, chunk))
    return SwaLayout(FULL_POLICY, tokens, tokens, tokens)


def layout_from_header(h: Dsv4Header, n_sliding: int, window: int) -> SwaLayout:
    pol = header_policy(h)
    t, chunk = h.token_count, max(h.prefill_chunk, 1)
    if pol.kind == ZERO:
        return SwaLayout(pol, t, 0, zero_start(t, n_sliding, window, chunk))
    raw_at = stored_window_at(pol, t, chunk)
    return SwaLayout(pol, t, raw_at, raw_at)
