"""SWA storage policies of DSV4 sessions (full, periodic:K, zero): what a save stores, how a load rebuilds.

Owns, per session (`SwaState`, `session.swa`): the policy a save uses, the
snapshot of the raw windows at the last periodic frontier, and what the last
load recomputed; per payload: which raw window is stored and where the replay
starts (`SwaLayout` and the marker block are shared with the llama family:
ds4tui/engine/swa_layout.py); and the replay itself. The policy's text form and header tag are
ds4tui/format/swa_policy.py's; the framing and sections payload.py's.

Why a replay is exact. Every policy stores the compressed and indexer rows of
the whole prefix and the compressor frontiers as of T. A load restores them,
then re-runs the tokens whose raw rows are missing with the compressors
*frozen* (`CompressorState.frozen`): they emit nothing and their rows are
inputs only, exactly the rows a cold prefill had at each position (row c is
visible to t iff c < (t+1)//R, and those rows are final once their block is
complete). What the replay recomputes is the raw window:
- periodic: the windows at P (a chunk boundary) are stored, so the replay
  P..T runs the same chunks, on the same inputs, as a cold prefill: bit-exact.
- zero: nothing is stored. Layer l's raw row at t depends on tokens
  t - l*(W-1)..t only, so re-running the last L*(W-1)+1 tokens makes the last
  window of every layer exact in exact arithmetic (the first replayed positions
  see empty rows and are wrong, but their influence ends within the receptive
  field). In floating point one coupling is left: a chunk's MoE experts run on
  the group of its tokens that picked them, and the not-yet-converged tokens may
  pick differently from a cold run, which changes the matmul shapes. Results then
  agree to rounding with the same discrete choices (docs/swa_policies.md).
"""

from __future__ import annotations


import torch

from ds4tui.format.payload import Dsv4Header
from ds4tui.engine.dsv4.state import Dsv4State
from ds4tui.engine.swa_layout import RestoreInfo, SwaLayout, header_policy, replay_tail
from ds4tui.format.swa_policy import (
    FULL_POLICY,
    PERIODIC,
    QUERY_BLOCK,
    ZERO,
    SwaPolicy,
    parse_policy,
    stored_window_at,
    zero_replay_start,
)


# -- the session side -------------------------------------------------------------------------


def set_policy(session: Dsv4State, policy: SwaPolicy | str) -> None:
    """Use `policy` for this session's next saves. A periodic policy snapshots at once when the
    session stands on one of its frontiers; otherwise saves are full until the next one."""
    swa = session.swa
    swa.policy = parse_policy(policy) if isinstance(policy, str) else policy
    if swa.policy.kind != PERIODIC:
        swa.snapshot_at = swa.snapshot = None  # only periodic saves read it
    else:
        _maybe_snapshot(session, len(session.tokens))


def after_forward(s: Dsv4State, end: int) -> None:
    """Called by the session after every forward that ends at absolute position `end`."""
    if not s.swa.replaying:
        _maybe_snapshot(s, end)


def _maybe_snapshot(s: Dsv4State, end: int) -> None:
    # Prefill chunks end on multiples of the chunk size, and the effective period is one,
    # so every frontier is the end of some forward (or a decode step).
    k = s.swa.policy.effective_period(s.chunk_size)
    if k and end and end % k == 0:
        w = s.cfg.sliding_window
        s.swa.snapshot = [lc.raw_logical(end, w) for lc in s.layers]  # copies (index gather)
        s.swa.snapshot_at = end


def layout_for_save(s: Dsv4State) -> SwaLayout:
    """The layout a save writes now. A periodic session that has no snapshot at its last
    frontier (restored from a file, or its policy just changed) writes a full payload:
    the same bytes as the periodic one would have, and nothing to recompute."""
    t, chunk, pol = len(s.tokens), s.chunk_size, s.swa.policy
    if pol.kind == PERIODIC:
        k = pol.effective_period(chunk)
        p = t // k * k
        if p in (0, t) or s.swa.snapshot_at == p:
            return SwaLayout(SwaPolicy(PERIODIC, k), t, p, p)
        return SwaLayout(FULL_POLICY, t, t, t)
    if pol.kind == ZERO:
        start = zero_replay_start(t, s.cfg.num_hidden_layers, s.cfg.sliding_window, chunk, QUERY_BLOCK)
        return SwaLayout(pol, t, 0, start)
    return SwaLayout(FULL_POLICY, t, t, t)


def raw_rows_for_save(s: Dsv4State, layout: SwaLayout, layer: int) -> torch.Tensor:
    """The raw rows a save writes for one layer: [min(raw_at, W), head_dim], oldest first."""
    lc = s.layers[layer]
    if layout.raw_at == len(s.tokens):
        return lc.raw_logical(layout.raw_at, s.cfg.sliding_window)
    if layout.raw_at == 0:
        return lc.raw.new_zeros((0, lc.raw.shape[1]))
    assert s.swa.snapshot is not None and s.swa.snapshot_at == layout.raw_at
    return s.swa.snapshot[layer]


# -- the payload side -------------------------------------------------------------------------


def layout_from_header(h: Dsv4Header) -> SwaLayout:
    """The layout a payload announces in its header; PayloadError for unknown versions."""
    pol = header_policy(h)
    t, chunk = h.token_count, h.prefill_chunk
    raw_at = stored_window_at(pol, t, max(chunk, 1))
    if pol.kind == ZERO:
        replay_from = zero_replay_start(t, h.layer_count, max(h.raw_window, 1), max(chunk, 1), QUERY_BLOCK)
    else:
        replay_from = raw_at
    return SwaLayout(pol, t, raw_at, replay_from)


def finish_load(s: Dsv4State, layout: SwaLayout) -> None:
    """After the sections are read: keep a periodic window as the snapshot, then rebuild the
    raw windows by re-running the tokens the file did not store."""
    t = layout.tokens
    if layout.policy.kind == PERIODIC and s.swa.policy.kind == PERIODIC and 0 < layout.raw_at < t:
        w = s.cfg.sliding_window
        s.swa.snapshot = [lc.raw_logical(layout.raw_at, w) for lc in s.layers]
        s.swa.snapshot_at = layout.raw_at
    info = RestoreInfo(str(layout.policy), t, 0, 0.0, None)
    if layout.replay_from < t:
        info = _replay(s, layout)
    s.swa.last_restore = info
    _maybe_snapshot(s, t)


def _replay(s: Dsv4State, layout: SwaLayout) -> RestoreInfo:
    # The compressed and indexer rows and frontiers were restored whole: the replay only
    # rebuilds the raw windows, so the compressor states stay frozen meanwhile.
    states = [st for lc in s.layers for st in (lc.attn, lc.index) if st is not None]
    return replay_tail(s, s.swa, layout, states)
