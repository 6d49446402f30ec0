"""Session: one conversation's live engine state (tokens, KV rows, next-token logits).

The base class owns what every family shares: chunked prefill aligned to
absolute multiples of the chunk size (so a restored session finalizes
compressed rows at the same points as a cold prefill: bit-exactness),
progress and cancellation between chunks, context accounting and the payload
entry points. A family implements `_forward` and the payload sections.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import BinaryIO, Callable, Sequence

import torch

from ds4tui.engine.errors import ContextFullError
from ds4tui.format.swa_policy import SwaPolicy

# on_progress(done, total): tokens of this prefill call finished so far, and its total.
ProgressFn = Callable[[int, int], None]
StopFn = Callable[[], bool]



class Session(ABC):
    """Live state of one conversation. Not thread-safe: one worker at a time."""

    def __init__(self, ctx_size: int, chunk_size: int) -> None:
        if ctx_size <= 0 or chunk_size <= 0:
            raise ValueError("ctx_size and chunk_size must be positive")
        self.ctx_size = ctx_size
        self.chunk_size = chunk_size
        self.tokens: list[int] = []
        self.logits: torch.Tensor | None = None  # float32 [vocab], for the token after self.tokens

    # -- running ---------------------------------------------------------------------------

    def prefill(
        self,
        tokens: Sequence[int],
        on_progress: ProgressFn | None = None,
        should_stop: StopFn | None = None,
    ) -> bool:
        """Append `tokens`, in chunks that end on absolute multiples of `chunk_size`.

        Returns True when all tokens were consumed, False when `should_stop()`
        asked to stop between chunks; the session then holds a consistent state
        covering the tokens done so far (`self.tokens`).
        """
        tokens = list(tokens)
        self._check_room(len(tokens))
        total, done = len(tokens), 0
        while done < total:
            if should_stop is not None and should_stop():
                return False
            pos = len(self.tokens)
            boundary = (pos // self.chunk_size + 1) * self.chunk_size
            step = min(total - done, boundary - pos)
            chunk = tokens[done : done + step]
            last = done + step == total
            logits = self._forward(chunk, want_logits=last)
            self.tokens.extend(chunk)
            done += step
            if last:
                self.logits = logits
            else:
                self.logits = None
            if on_progress is not None:
                on_progress(done, total)
        return True

    def decode(self, token: int) -> torch.Tensor:
        """Feed one token; returns (and keeps in `self.logits`) the next-token logits."""
        self._check_room(1)
        logits = self._forward([token], want_logits=True)
        self.tokens.append(token)
        self.logits = logits
        return logits

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
        """Forget everything: an empty session of the same size."""

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


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """(result, milliseconds) of fn(); for benchmarks and events."""
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1000.0
