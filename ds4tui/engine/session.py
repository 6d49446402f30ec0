"""Session: one conversation's live engine state (tokens, KV rows, next-token logits).

The base class owns what every family shares: chunked prefill aligned to
absolute multiples of the chunk size (so a restored session finalizes
compressed rows at the same points as a cold prefill: bit-exactness),
progress and cancellation between chunks (and, where the family can undo a
half-run chunk, between its layers), context accounting and the payload entry
points. A family implements `_forward` and the payload sections.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import BinaryIO, Callable, Sequence

import torch

from ds4tui.engine.errors import ContextFullError
from ds4tui.errors import Ds4tuiError
from ds4tui.format.swa_policy import SwaPolicy

# on_progress(done, total): tokens of this prefill call finished so far, and its total.
ProgressFn = Callable[[int, int], None]
StopFn = Callable[[], bool]


class ForwardInterrupted(Ds4tuiError):
    """A prefill chunk stopped between two layers because the prefill's `interrupt` asked.
    Raised by a family's `_forward` once every buffer it wrote that the session reads is as
    it was before the chunk; `_feed` catches it (it never leaves `prefill`)."""


@dataclass(frozen=True)
class RewindCost:
    """What `Session.rewind(target)` will do, known before doing it (the UI shows it).

    The session returns to an in-memory state at `restore_from` tokens (a kept mark, the
    untouched prefix of a full-KV layer, or the empty session) and re-runs `replay` tokens
    from there. `replay == 0`: free, and the next-token logits are the kept ones, so the
    next token needs no forward pass.
    """

    target: int
    restore_from: int
    replay: int
    # "none" (already there), "kept" (kept logits), "recompute" (last token), "truncate" (rows
    # kept, logits dropped: the caller prefills next), "mark", "start"
    how: str

    @property
    def free(self) -> bool:
        return self.replay == 0


class Session(ABC):
    """Live state of one conversation. Not thread-safe: one worker at a time.

    Marks: at the end of every prefill (a prompt end, where a reply starts) the session
    keeps what it needs to come back to that point (`_capture_mark`: the next-token logits
    on a full-KV family, also the window and compressor frontiers on DSV4), the newest
    `max_marks` of them. `rewind` returns to a mark for free or re-runs the tokens after
    the nearest one.
    """

    max_marks = 32

    def __init__(self, ctx_size: int, chunk_size: int) -> None:
        if ctx_size <= 0 or chunk_size <= 0:
            raise ValueError("ctx_size and chunk_size must be positive")
        self.ctx_size = ctx_size
        self.chunk_size = chunk_size
        self.tokens: list[int] = []
        self.logits: torch.Tensor | None = None  # float32 [vocab], for the token after self.tokens
        self._marks: dict[int, object] = {}  # token count -> what _capture_mark kept there
        self._ends: list[int] = []  # token counts where a prefill or decode call ended, ascending
        self._interrupt: StopFn | None = None  # the running prefill's between-layers check

    # -- running ---------------------------------------------------------------------------

    def prefill(
        self,
        tokens: Sequence[int],
        on_progress: ProgressFn | None = None,
        should_stop: StopFn | None = None,
        interrupt: StopFn | None = None,
    ) -> bool:
        """Append `tokens`, in chunks that end on absolute multiples of `chunk_size`.

        Returns True when all tokens were consumed, False when `should_stop()`
        asked to stop between chunks, or `interrupt()` between two layers of a chunk
        (a family that can undo a half-run chunk checks it there: `_layer_check`; the
        others only between chunks, as should_stop). The session then holds a consistent
        state covering the tokens done so far (`self.tokens`: whole chunks only).
        `interrupt` must be cheap and side-effect free (it runs once per layer).
        A completed prefill keeps a mark.
        """
        done = self._feed(list(tokens), on_progress, should_stop, interrupt)
        if done and tokens:
            self.keep_mark()
        return done

    def _feed(self, tokens: list[int], on_progress: ProgressFn | None = None,
              should_stop: StopFn | None = None, interrupt: StopFn | None = None) -> bool:
        self._check_room(len(tokens))
        total, done = len(tokens), 0
        try:
            while done < total:
                if (should_stop is not None and should_stop()) or (interrupt is not None and interrupt()):
                    return False
                pos = len(self.tokens)
                boundary = (pos // self.chunk_size + 1) * self.chunk_size
                step = min(total - done, boundary - pos)
                chunk = tokens[done : done + step]
                last = done + step == total
                self._interrupt = interrupt
                try:
                    logits = self._forward(chunk, want_logits=last)
                except ForwardInterrupted:
                    return False
                finally:
                    self._interrupt = None
                self.tokens.extend(chunk)
                done += step
                if last:
                    self.logits = logits
                else:
                    self.logits = None
                if on_progress is not None:
                    on_progress(done, total)
            return True
        finally:
            self._note_call_end()

    def _layer_check(self) -> Callable[[int], None] | None:
        """For a family's forward to call before each layer (its `before_layer`): raises
        ForwardInterrupted once the running prefill's `interrupt` says so; None outside
        such a prefill. The family undoes what the layers before wrote, then re-raises."""
        interrupt = self._interrupt
        if interrupt is None:
            return None

        def check(_layer: int) -> None:
            if interrupt():
                raise ForwardInterrupted

        return check

    def decode(self, token: int) -> torch.Tensor:
        """Feed one token; returns (and keeps in `self.logits`) the next-token logits."""
        self._check_room(1)
        logits = self._forward([token], want_logits=True)
        self._decoded(token, logits)
        return logits

    def _decoded(self, token: int, logits: torch.Tensor) -> None:
        self.tokens.append(token)
        self.logits = logits
        self._note_call_end()

    def _forward_together(self, others: Sequence["Session"], tokens: Sequence[int]) -> list[torch.Tensor] | None:
        """One decode step of this session and `others` (its first token is this session's):
        the next-token logits of each, in one forward, or None where the family cannot (then
        each decodes on its own). Must not touch self.tokens."""
        return None

    def _note_call_end(self) -> None:
        """Remember where a prefill or decode call ended: a replay after a rewind feeds the
        tokens between two such points the way they came (one prefill, or one decode step)."""
        n = len(self.tokens)
        if n and (not self._ends or self._ends[-1] < n):
            self._ends.append(n)

    def _check_room(self, n: int) -> None:
        if len(self.tokens) + n > self.ctx_size:
            raise ContextFullError(
                f"context full: {len(self.tokens)} + {n} tokens exceeds ctx {self.ctx_size}"
            )

    @abstractmethod
    def _forward(self, tokens: list[int], want_logits: bool) -> torch.Tensor | None:
        """Run `tokens` at positions len(self.tokens)...; update KV state; return float32
        logits [vocab] of the last position when asked (else None). Must not touch self.tokens."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything: an empty session of the same size (marks included)."""

    # -- rewind and fork -------------------------------------------------------------------

    def marks(self) -> list[int]:
        """Token counts this session can return to without re-running anything before them."""
        return sorted(self._marks)

    def keep_mark(self) -> None:
        """Keep the current point as a mark (prefill does it at its end). Needs the logits."""
        n = len(self.tokens)
        if n == 0 or self.logits is None or not self._can_mark():
            return
        self._marks[n] = self._capture_mark()
        while len(self._marks) > self.max_marks:
            del self._marks[min(self._marks)]

    def drop_mark(self, n_tokens: int) -> None:
        """Forget the mark at `n_tokens`, if there is one (a mark kept only for a while)."""
        self._marks.pop(n_tokens, None)

    def rewind_cost(self, n_tokens: int) -> RewindCost:
        """What `rewind(n_tokens)` would re-run, without changing anything."""
        t = len(self.tokens)
        if not 0 <= n_tokens <= t:
            raise ValueError(f"cannot rewind to {n_tokens} tokens: the session holds {t}")
        if n_tokens == t and (t == 0 or self.logits is not None):
            return RewindCost(t, t, 0, "none")
        if n_tokens == 0:
            return RewindCost(0, 0, 0, "start")
        return self._rewind_plan(n_tokens)

    def rewind(self, n_tokens: int, on_progress: ProgressFn | None = None, *, logits: bool = True) -> RewindCost:
        """Return to the state this session had after its first `n_tokens` tokens.

        Exact (the same KV state, logits and saved bytes, bit for bit) at a mark, and
        wherever the tokens after the restore point had been fed by one prefill or by
        decode steps; inside an earlier prefill chunk the last position's logits are
        recomputed alone, which agrees to rounding. Returns what it cost.

        logits=False: the caller prefills at once, so where only the logits are missing
        ("recompute") they are not computed: the rows stay exactly as the prefill that wrote
        them left them (a recompute writes the last row again with a one-token forward,
        which differs from the chunk's in the last bits) and `self.logits` is None.
        """
        plan = self.rewind_cost(n_tokens)
        if not logits and plan.how == "recompute":
            plan = RewindCost(n_tokens, n_tokens, 0, "truncate")
        if plan.how == "none":
            return plan
        if n_tokens == 0:
            self.reset()
            return plan
        ends = [e for e in self._ends if e < n_tokens]
        self._rewind_to(plan, on_progress)
        self._marks = {k: v for k, v in self._marks.items() if k <= n_tokens}
        self._ends = ends + [n_tokens]
        return plan

    def _replay(self, start: int, tokens: list[int], on_progress: ProgressFn | None) -> None:
        """Feed tokens[start:] after the state at `start` was restored, split where the
        original calls ended (those ends are still in self._ends)."""
        cuts = [e for e in self._ends if start < e < len(tokens)] + [len(tokens)]
        total, a = len(tokens) - start, start
        for b in cuts:
            self._feed(tokens[a:b])
            a = b
            if on_progress is not None:
                on_progress(b - start, total)

    def fork(self, n_tokens: int | None = None, *, logits: bool = True) -> "Session":
        """A new, independent session holding this one's state after `n_tokens` tokens (all of
        them by default), its marks up to there included: a branch with no prefill.
        logits=False: as for rewind (the caller prefills the fork next)."""
        n = len(self.tokens) if n_tokens is None else n_tokens
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"cannot fork at {n} tokens: the session holds {len(self.tokens)}")
        other = self._copy(n)
        other._marks = {k: v for k, v in self._marks.items() if k <= len(other.tokens)}
        other._ends = [e for e in self._ends if e <= len(other.tokens)]
        other.rewind(n, logits=logits)
        return other

    def _can_mark(self) -> bool:
        return True

    def _capture_mark(self) -> object:
        """What coming back to this point needs; the default keeps the logits (full-KV layers
        keep every earlier row untouched, so they need nothing else)."""
        return self.logits

    @abstractmethod
    def _rewind_plan(self, n_tokens: int) -> RewindCost:
        """The cost of a rewind to 0 < n_tokens <= len(self.tokens) (not already there)."""

    @abstractmethod
    def _rewind_to(self, plan: RewindCost, on_progress: ProgressFn | None) -> None:
        """Carry out `plan`: afterwards tokens, logits and state are those after plan.target."""

    @abstractmethod
    def _copy(self, n_tokens: int) -> "Session":
        """A new session of the same size and settings holding a copy of this one's state
        over at least its first n_tokens (tokens, logits where known, KV rows); `fork` then
        copies the marks and rewinds it to n_tokens."""

    # -- storage policy ----------------------------------------------------------------------

    def set_storage_policy(self, policy: SwaPolicy | str) -> bool:
        """Use this SWA storage policy (`full`, `periodic:K`, `zero`) for the next saves.

        Returns False, and changes nothing, for a session without sliding-window layers:
        there every policy stores the same bytes. Families with such layers override it.
        """
        return False

    # -- persistence (the DSV4 payload, see ds4tui/format/payload.py) ---------------------------------------

    @abstractmethod
    def payload_bytes(self) -> int:
        """Exact size in bytes that save_payload will write now."""

    @abstractmethod
    def save_payload(self, fp: BinaryIO) -> None:
        """Write the full session state (tokens, logits, KV rows, frontiers)."""

    @abstractmethod
    def load_payload(self, fp: BinaryIO, nbytes: int) -> None:
        """Replace the state with the payload of exactly `nbytes` bytes read from fp.

        Raises PayloadError naming the mismatch (fingerprint, config, truncation,
        trailing bytes); the session is then left empty and usable.
        """

    def load_payload_ahead(self, fp: BinaryIO, nbytes: int, ahead: Sequence[int]) -> None:
        """load_payload, told the tokens the caller will prefill next (`ahead`, the new message
        after a restored prefix), so that a family able to may run their first chunk while
        the payload is still being read; that prefill is then as fast as the work left.
        The default ignores them: the prefill does all of it."""
        self.load_payload(fp, nbytes)


def decode_together(sessions: Sequence[Session], tokens: Sequence[int]) -> list[torch.Tensor]:
    """`sessions[i].decode(tokens[i])` for every i, as one step over the batch where the
    family runs one (LlamaSession: one forward, each weight read once for all of them), else
    one after another. Each session's own state moves as its decode would move it."""
    if len(sessions) != len(tokens):
        raise ValueError("one token per session")
    if len(sessions) > 1:
        for s in sessions:
            s._check_room(1)
        first = sessions[0]
        logits = first._forward_together(sessions[1:], tokens)
        if logits is not None:
            for s, t, out in zip(sessions, tokens, logits):
                s._decoded(t, out)
            return logits
    return [s.decode(t) for s, t in zip(sessions, tokens)]


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """(result, milliseconds) of fn(); for benchmarks and events."""
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1000.0
