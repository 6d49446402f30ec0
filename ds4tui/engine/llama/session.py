"""LlamaSession: one conversation on a llama-family model.

Owns the session state (tokens, next-token logits, the KV buffers of kv_buffers.py), the
forward over them (one chunk, or one decode step for several sessions together), the SWA
storage policy and its snapshots, marks, rewinds and forks. A model with sliding-window
layers (Gemma 3) keeps, per sliding layer, a ring of its last W rows only (the row of
position p at slot p % W); global layers keep every row. The buffers are head-major: each
head's keys are contiguous rows, which attention reads without a copy (a token-major
layout, [ctx, 2, Hkv, D], made long-context decode slower: strided K/V).

Leaves to session_payload.py the payload (save, load, the load that runs the next chunk
alongside its reads).
"""

from __future__ import annotations

import os
from typing import BinaryIO, Callable, Protocol, Sequence

import numpy as np
import torch

from ds4tui.engine.llama import session_payload
from ds4tui.engine.llama.config import LlamaConfig
from ds4tui.engine.llama.kv_buffers import DEFAULT_KV_DTYPE, KvBuffers, fits, kv_bytes, kv_shapes, kv_torch_dtype, new_kv
from ds4tui.engine.llama.session_payload import _Ahead
from ds4tui.engine.llama.swa import LlamaSwa, zero_start
from ds4tui.engine.model import ModelInfo
from ds4tui.engine.session import ForwardInterrupted, ProgressFn, RewindCost, Session
from ds4tui.format.swa_policy import PERIODIC, SwaPolicy, parse_policy


# One decode step for several sessions at once (LlamaModel.decode_batch); DS4TUI_BATCH_DECODE=0
# decodes each on its own (the fused C step), one after another.
def batch_decode_enabled() -> bool:
    return os.environ.get("DS4TUI_BATCH_DECODE", "1") != "0"


# Memory the marks of a session with sliding layers may hold in ring copies.
MARK_BYTES = 64 << 20

class LlamaForward(Protocol):
    """What a session needs of its model (LlamaModel): the shapes, the identity its payloads
    carry, one forward over the session's KV buffers, and its spare buffers for a copy."""

    cfg: LlamaConfig
    info: ModelInfo

    def forward(self, kv: KvBuffers, tokens: list[int], pos: int, want_logits: bool,
                frozen_global: bool = False, before_layer: Callable[[int], None] | None = None
                ) -> torch.Tensor | None: ...

    def take_spare(self, ctx: int, kv_dtype: str) -> KvBuffers | None: ...


class LlamaSession(Session):
    def __init__(self, model: LlamaForward, ctx_size: int, chunk_size: int,
                 kv: KvBuffers | None = None, kv_dtype: str = DEFAULT_KV_DTYPE) -> None:
        """kv: buffers of this session's shapes and kv_dtype ("f16" or "f32") to adopt (the
        model's pre-touched spare, see LlamaModel.warm_up); their content is irrelevant."""
        super().__init__(ctx_size, chunk_size)
        self.model = model
        cfg = model.cfg
        self.kv_dtype = kv_dtype
        dtype = kv_torch_dtype(kv_dtype)
        self.swa = LlamaSwa()
        if kv is not None:
            if not fits(kv, cfg, ctx_size, dtype):
                raise ValueError(f"kv buffers do not fit {kv_shapes(cfg, ctx_size)} {kv_dtype}")
            if cfg.sliding_layers:
                for t in kv:
                    t.zero_()
        # Rows of global layers >= len(self.tokens) are never read, so they need no zeroing.
        self.kv = kv if kv is not None else new_kv(cfg, ctx_size, kv_dtype)
        # The first chunk of the next prefill, when a restore ran it already (load_payload_ahead).
        self._ahead: _Ahead | None = None

    @property
    def kv_bytes(self) -> int:
        """Bytes of K/V this session holds in memory (sliding layers: their rings only)."""
        return 0 if self.kv is None else kv_bytes(self.kv)

    def release(self) -> KvBuffers | None:
        """Hand over this session's KV buffers (for another session to adopt: the model's
        spare, LlamaModel.release_session) and with them its state; None when already
        released. Anything that would read or write them afterwards raises."""
        kv, self.kv = self.kv, None
        self.reset()
        return kv

    def _check_live(self) -> None:
        if self.kv is None:
            raise RuntimeError("this session was released: its KV buffers belong to another session now")

    def _forward(self, tokens: list[int], want_logits: bool) -> torch.Tensor | None:
        self._check_live()
        vocab = self.model.cfg.vocab_size
        for t in tokens:
            if not 0 <= t < vocab:
                raise ValueError(f"token id {t} outside vocab of {vocab}")
        # A chunk a restore already ran is taken as it is (the same call with the same inputs);
        # any other forward may overwrite its rows or the rows it read: it is dropped.
        ahead, self._ahead = self._ahead, None
        if (ahead is not None and ahead.pos == len(self.tokens) and ahead.tokens == tokens
                and (ahead.logits is not None or not want_logits) and not self.swa.replaying):
            return ahead.logits if want_logits else None
        # A chat's prefill may stop between two layers of a chunk (Session.prefill's interrupt):
        # a global layer's rows of the chunk lie beyond self.tokens, never read; a sliding
        # layer's ring slots are put back as they were (the one-token fused step has no layers
        # to stop between).
        check = self._layer_check() if len(tokens) > 1 and not self.swa.replaying else None
        undo = self._ring_slots(len(self.tokens), len(tokens)) if check is not None else None
        try:
            with torch.inference_mode():
                out = self.model.forward(self.kv, tokens, len(self.tokens), want_logits, self.swa.replaying,
                                         before_layer=check)
        except ForwardInterrupted:
            if undo is not None:
                slots, rows = undo
                with torch.inference_mode():
                    for i, saved in zip(self.model.cfg.sliding_layers, rows):
                        self.kv[i].index_copy_(2, slots, saved)
            raise
        if not self.swa.replaying:
            self._maybe_snapshot(len(self.tokens) + len(tokens))
        return out

    def _ring_slots(self, pos: int, n: int) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """The ring slots a chunk of n tokens at pos overwrites in each sliding layer, and a copy
        of what they hold now (None without sliding layers): what undoes a half-run chunk."""
        cfg = self.model.cfg
        if not cfg.sliding_layers:
            return None
        ring = self.kv[cfg.sliding_layers[0]].shape[2]
        slots = torch.arange(pos, pos + min(n, ring)) % ring
        return slots, [self.kv[i].index_select(2, slots) for i in cfg.sliding_layers]

    def _forward_together(self, others: Sequence[Session], tokens: Sequence[int]) -> list[torch.Tensor] | None:
        batch = [self, *others]
        model = self.model
        if (not hasattr(model, "decode_batch") or not batch_decode_enabled()
                or any(not isinstance(s, LlamaSession) or s.model is not model or s.swa.replaying for s in batch)):
            return None
        vocab = model.cfg.vocab_size
        for s, t in zip(batch, tokens):
            s._check_live()
            if not 0 <= t < vocab:
                raise ValueError(f"token id {t} outside vocab of {vocab}")
            s._ahead = None  # as any forward of its own would
        with torch.inference_mode():
            logits = model.decode_batch([s.kv for s in batch], list(tokens), [len(s.tokens) for s in batch])
        for s in batch:
            s._maybe_snapshot(len(s.tokens) + 1)
        return logits

    def reset(self) -> None:
        self._ahead = None
        self.tokens = []
        self.logits = None
        self._marks = {}
        self._ends = []
        self.swa.forget()
        if self.model.cfg.sliding_layers and self.kv is not None:
            for t in self.kv:
                t.zero_()

    # -- SWA storage policy ---------------------------------------------------------------

    def set_storage_policy(self, policy: SwaPolicy | str) -> bool:
        if not self.model.cfg.sliding_layers:
            return False
        self.swa.policy = parse_policy(policy) if isinstance(policy, str) else policy
        if self.swa.policy.kind != PERIODIC:
            self.swa.snapshot_at = self.swa.snapshot = None  # only periodic saves read it
        else:
            self._maybe_snapshot(len(self.tokens))
        return True

    def _maybe_snapshot(self, end: int) -> None:
        # Prefill chunks end on multiples of the chunk size, and the effective period is one,
        # so every frontier is the end of some forward (or a decode step).
        k = self.swa.policy.effective_period(self.chunk_size)
        if k and end and end % k == 0:
            self.swa.snapshot = [self._window_rows(i, end) for i in self.model.cfg.sliding_layers]
            self.swa.snapshot_at = end

    def _window_rows(self, layer: int, at: int) -> torch.Tensor:
        """A copy of a sliding layer's live ring as [2, Hkv, min(at, W), D], oldest first (the
        payload's head-major order); `at` is the number of tokens the ring has seen."""
        ring = self.kv[layer]
        m = min(at, self.model.cfg.sliding_window, ring.shape[2])
        slots = torch.arange(at - m, at) % ring.shape[2]
        return ring.index_select(2, slots)

    # -- rewind and fork ----------------------------------------------------------------------
    # Global layers keep full KV: the rows of a prefix never change. A sliding layer's ring
    # only holds its last W rows, so a mark also keeps a copy of the rings, and a rewind to a
    # point without one rebuilds them like a zero-policy load (swa.py): re-run the tokens of
    # the receptive field with the global layers frozen.

    def _capture_mark(self) -> object:
        if not self.model.cfg.sliding_layers:
            return self.logits
        return self.logits, [self.kv[i].clone() for i in self.model.cfg.sliding_layers]

    @property
    def max_marks(self) -> int:  # type: ignore[override]
        """Full attention: the base class's count (a mark is the logits). Sliding layers: as
        many ring copies as fit in MARK_BYTES (at least 2)."""
        cfg = self.model.cfg
        if not cfg.sliding_layers:
            return Session.max_marks
        ring = sum(t.numel() * t.element_size() for i, t in enumerate(self.kv) if cfg.is_sliding(i))
        return max(2, min(Session.max_marks, MARK_BYTES // max(ring, 1)))

    def _rewind_plan(self, n_tokens: int) -> RewindCost:
        if n_tokens in self._marks:
            return RewindCost(n_tokens, n_tokens, 0, "kept")
        cfg = self.model.cfg
        if not cfg.sliding_layers:
            # The rows before n are intact; only the logits at n are missing: run the last token
            # again (a decode step: exactly what produced them if that token was decoded).
            return RewindCost(n_tokens, n_tokens - 1, 1, "recompute")
        below = [m for m in self._marks if m < n_tokens]
        start = zero_start(n_tokens, len(cfg.sliding_layers), cfg.sliding_window, self.chunk_size)
        if below and max(below) >= start:
            m = max(below)
            return RewindCost(n_tokens, m, n_tokens - m, "mark")
        return RewindCost(n_tokens, start, n_tokens - start, "rebuild")

    def _rewind_to(self, plan: RewindCost, on_progress: ProgressFn | None) -> None:
        self._ahead = None
        n = plan.target
        sliding = self.model.cfg.sliding_layers
        if plan.how == "kept":
            self.tokens = self.tokens[:n]
            mark = self._marks[n]
            if sliding:
                mark, rings = mark
                for i, ring in zip(sliding, rings):
                    self.kv[i].copy_(ring)
            self.logits = mark
        elif plan.how == "truncate":  # rows before n stay as written; the caller prefills next
            self.tokens, self.logits = self.tokens[:n], None
        elif plan.how == "recompute":
            last = self.tokens[n - 1]
            self.tokens = self.tokens[: n - 1]
            self.logits = self._forward([last], want_logits=True)
            self.tokens.append(last)
            if on_progress is not None:
                on_progress(1, 1)
        else:  # "mark" or "rebuild": the rings as of plan.restore_from, then the tokens up to n again
            tokens = self.tokens[:n]
            if plan.how == "mark":
                for i, ring in zip(sliding, self._marks[plan.restore_from][1]):
                    self.kv[i].copy_(ring)
            else:
                for i in sliding:
                    self.kv[i].zero_()
            self.tokens, self.logits = tokens[: plan.restore_from], None
            self.swa.replaying = True  # global layers read their rows and write none
            try:
                self._replay(plan.restore_from, tokens, on_progress)
            finally:
                self.swa.replaying = False
        if self.swa.snapshot_at is not None and self.swa.snapshot_at > n:
            self.swa.snapshot_at = self.swa.snapshot = None

    def _copy(self, n_tokens: int) -> "LlamaSession":
        self._check_live()
        # Into the model's spare when it has one (memory already faulted in: a fork of a 4K chat
        # copies 92 MB, and into fresh memory the faults cost more than the copy).
        other = LlamaSession(self.model, self.ctx_size, self.chunk_size, kv_dtype=self.kv_dtype,
                             kv=self.model.take_spare(self.ctx_size, self.kv_dtype))
        n = n_tokens
        # One numpy copy of the prefix's rows (see the module docstring on torch's copy_);
        # a sliding layer's whole ring (rewind then restores or rebuilds it for n).
        for i, (src, dst) in enumerate(zip(self.kv, other.kv)):
            rows = src.shape[2] if self.model.cfg.is_sliding(i) else n
            np.copyto(dst.numpy()[:, :, :rows], src.numpy()[:, :, :rows])
        other.tokens = self.tokens[:n]
        other.logits = self.logits if n == len(self.tokens) else None
        other.swa.policy = self.swa.policy
        return other

    # -- payload (session_payload.py) -----------------------------------------------------

    def payload_bytes(self) -> int:
        return session_payload.payload_bytes(self)

    def save_payload(self, fp: BinaryIO) -> None:
        session_payload.save(self, fp)

    def load_payload(self, fp: BinaryIO, nbytes: int) -> None:
        self.load_payload_ahead(fp, nbytes, ())

    def load_payload_ahead(self, fp: BinaryIO, nbytes: int, ahead: Sequence[int]) -> None:
        """load_payload, running the first prefill chunk of `ahead` (the tokens the caller
        will prefill next) while the rows are still coming from disk; the next prefill of
        those tokens then takes that chunk as done. See the module docstring for when."""
        try:
            session_payload.load(self, fp, nbytes, list(ahead))
        except BaseException:
            self.reset()  # never half-restored: an empty, usable session
            raise
