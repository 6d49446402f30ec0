"""Dsv4Session: one conversation on a DeepSeek V4 model.

Owns the live state (tokens, next-token logits, the per-layer `LayerCache`
list of cache.py) and ties it to the network (net.py) and the
payload (payload.py).

Chunk size: prefill chunks end on absolute multiples of `chunk_size` (the base
class does it), and chunk_size must be a multiple of every compression ratio
(128 for Flash). Then every chunk boundary is also a compressor window
boundary: a chunk never closes a window that an earlier chunk opened, so a
cold prefill and a restored session that resumes on a chunk boundary emit
every compressed row from the same batched computation, bit for bit. (Between
a chunk of n tokens and n single-token decodes the math is the same but the
matmul shapes differ, so results agree to rounding, with identical discrete
choices; tests check both.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

import torch

from ds4tui.engine.dsv4.cache import new_layer_caches
from ds4tui.engine.dsv4.net import Dsv4Net, Dsv4Trace
from ds4tui.engine.dsv4.payload import payload_size, read_payload, write_payload
from ds4tui.engine.dsv4.state import SwaState
from ds4tui.engine.dsv4.swa import after_forward, set_policy
from ds4tui.engine.model import ModelInfo
from ds4tui.engine.session import ForwardInterrupted, ProgressFn, RewindCost, Session
from ds4tui.format.swa_policy import PERIODIC, SwaPolicy


@dataclass(frozen=True)
class Dsv4Mark:
    """Everything of a session at one point that later tokens overwrite: the raw rings, the
    compressor frontiers and row counts (rows below the count are final, never rewritten),
    the last position's streams and logits, and the periodic SWA snapshot then current.
    About L x W x head_dim floats plus the frontiers: 11 MB for V4 Flash, kilobytes here."""

    logits: torch.Tensor
    streams: torch.Tensor | None
    raw: tuple[torch.Tensor, ...]
    compressors: tuple[tuple[int, torch.Tensor, torch.Tensor], ...]  # n_rows, state_kv, state_score
    swa_snapshot_at: int | None
    swa_snapshot: list[torch.Tensor] | None


class Dsv4Session(Session):
    max_marks = 8  # each holds every layer's window: see Dsv4Mark

    def __init__(self, net: Dsv4Net, info: ModelInfo, ctx_size: int, chunk_size: int) -> None:
        """net: the model's network (shared by its sessions); info: the model's identity,
        whose fingerprint every payload carries."""
        super().__init__(ctx_size, chunk_size)
        cfg = net.cfg
        if chunk_size % cfg.ratio_lcm:
            raise ValueError(f"chunk size {chunk_size} is not a multiple of the compression ratios ({cfg.ratio_lcm})")
        self.net = net
        self.info = info
        self.cfg = cfg
        self.layers = new_layer_caches(
            cfg.compress_ratios, cfg.head_dim, cfg.index_head_dim, cfg.sliding_window, ctx_size
        )
        self.trace: Dsv4Trace | None = None  # set to record discrete choices (tests, debugging)
        self._last_streams: torch.Tensor | None = None  # HC streams of the last position [1, hc, D]
        self.swa = SwaState()  # SWA storage policy of saves, periodic snapshots (swa.py)

    def _forward(self, tokens: list[int], want_logits: bool) -> torch.Tensor | None:
        vocab = self.cfg.vocab_size
        for tok in tokens:
            if not 0 <= tok < vocab:
                raise ValueError(f"token id {tok} outside vocab of {vocab}")
        # A chat's prefill may stop between two layers (Session.prefill's interrupt): the layers
        # before have written window rows and compressor state, so what they hold now is kept
        # as a mark would keep it, and put back if the chunk stops half-way.
        check = self._layer_check() if len(tokens) > 1 and not self.swa.replaying else None
        undo = self._capture_mark() if check is not None else None
        try:
            with torch.no_grad():
                logits, last = self.net.forward(self.layers, tokens, len(self.tokens), want_logits, self.trace,
                                                before_layer=check)
        except ForwardInterrupted:
            if undo is not None:
                self._restore_mark(len(self.tokens), undo)
            raise
        self._last_streams = last
        after_forward(self, len(self.tokens) + len(tokens))  # periodic SWA snapshots
        return logits

    def next_logits(self) -> torch.Tensor | None:
        """The next-token logits, computed from the last position's streams when a prefill
        was stopped between chunks (self.logits is then None). None for an empty session."""
        if self.logits is None and self.tokens and self._last_streams is not None:
            with torch.no_grad():
                self.logits = self.net.logits_of(self._last_streams)[0]
        return self.logits

    def reset(self) -> None:
        self.tokens = []
        self.logits = None
        self._last_streams = None
        self._marks = {}
        self._ends = []
        self.swa.forget()
        for lc in self.layers:
            lc.reset()

    # -- rewind and fork: from the nearest mark, re-running the tokens after it -------------

    def _compressors(self) -> list:
        return [st for lc in self.layers for st in (lc.attn, lc.index) if st is not None]

    def _can_mark(self) -> bool:
        return not self.swa.replaying  # a load marks once it has finished (load_payload)

    def _capture_mark(self) -> Dsv4Mark:
        return Dsv4Mark(
            logits=self.logits,
            streams=self._last_streams,
            raw=tuple(lc.raw.clone() for lc in self.layers),
            compressors=tuple((st.n_rows, st.state_kv.clone(), st.state_score.clone()) for st in self._compressors()),
            swa_snapshot_at=self.swa.snapshot_at,
            swa_snapshot=self.swa.snapshot,
        )

    def _rewind_plan(self, n_tokens: int) -> RewindCost:
        start = max((k for k in self._marks if k <= n_tokens), default=0)
        return RewindCost(n_tokens, start, n_tokens - start, "kept" if start == n_tokens else "mark" if start else "start")

    def _rewind_to(self, plan: RewindCost, on_progress: ProgressFn | None) -> None:
        tokens = self.tokens[: plan.target]
        m = plan.restore_from
        ends = self._ends
        if m == 0:
            self.reset()
            self._ends = ends
        else:
            self._restore_mark(m, self._marks[m])
            self.tokens = tokens[:m]
        if plan.replay:
            # Fed as they first came (each prefill call in chunks on absolute multiples, each
            # decode step alone): the same computations, so the same bits.
            self._replay(m, tokens, on_progress)

    def _restore_mark(self, m: int, mark: Dsv4Mark) -> None:
        for lc, raw in zip(self.layers, mark.raw):
            lc.raw.copy_(raw)
        for st, (n_rows, kv, score) in zip(self._compressors(), mark.compressors):
            st.rows[n_rows : st.n_rows] = 0.0  # never read past n_rows; zeroed as a fresh session has it
            st.n_rows = n_rows
            st.state_kv.copy_(kv)
            st.state_score.copy_(score)
        self.logits, self._last_streams = mark.logits, mark.streams
        periodic = self.swa.policy.kind == PERIODIC
        self.swa.snapshot_at = mark.swa_snapshot_at if periodic else None
        self.swa.snapshot = mark.swa_snapshot if periodic else None

    def _copy(self, n_tokens: int) -> "Dsv4Session":
        other = Dsv4Session(self.net, self.info, self.ctx_size, self.chunk_size)
        for mine, theirs in zip(self.layers, other.layers):
            theirs.raw.copy_(mine.raw)
        for mine, theirs in zip(self._compressors(), other._compressors()):
            theirs.rows[: mine.n_rows] = mine.rows[: mine.n_rows]
            theirs.n_rows = mine.n_rows
            theirs.state_kv.copy_(mine.state_kv)
            theirs.state_score.copy_(mine.state_score)
        other.tokens = list(self.tokens)
        other.logits, other._last_streams = self.logits, self._last_streams
        other.swa.policy = self.swa.policy
        other.swa.snapshot_at, other.swa.snapshot = self.swa.snapshot_at, self.swa.snapshot
        return other

    def set_storage_policy(self, policy: SwaPolicy | str) -> bool:
        set_policy(self, policy)
        return True

    # -- payload (payload.py) -----------------------------------------------------------

    def payload_bytes(self) -> int:
        return payload_size(self)

    def save_payload(self, fp: BinaryIO) -> None:
        write_payload(self, fp)

    def load_payload(self, fp: BinaryIO, nbytes: int) -> None:
        """A payload rejected by its header, fingerprint, counts or size leaves the session as
        it was; a failure while reading the sections (a short file, non-finite values) leaves
        it empty. Never half-restored."""
        touched = False

        def begin() -> None:
            nonlocal touched
            touched = True
            self.reset()

        try:
            read_payload(self, fp, nbytes, begin)
        except BaseException:
            if touched:
                self.reset()
            raise
        self.next_logits()
        self._ends = [len(self.tokens)] if self.tokens else []
        self.keep_mark()
