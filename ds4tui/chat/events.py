"""What the chat controller reports while it works: plain frozen records, no UI types.

Owns: the controller's own events. The cache's events (`ds4tui.cache.events`:
Saved, SaveFailed, Hit, Miss, Rejected, Evicted) are passed through unchanged,
so one callback sees both kinds; `ChatEvent` is their union. Every event carries
nothing but numbers and strings, so a worker thread can hand it to the UI as is.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds4tui.cache.events import Evicted, Hit, Miss, Rejected, Saved, SaveFailed


@dataclass(frozen=True)
class PrefillStarted:
    """The prompt needs `total` new tokens; `cached` tokens came from the live session or disk."""

    total: int
    cached: int
    source: str  # "live", "disk" or "cold"


@dataclass(frozen=True)
class PrefillProgress:
    done: int
    total: int
    tok_s: float
    eta_s: float | None  # None until a rate is known


@dataclass(frozen=True)
class TokenText:
    """Newly decoded reply text (whole characters only; may hold several tokens' worth)."""

    text: str


@dataclass(frozen=True)
class Done:
    """The assistant turn ended. `stop` is eos, stop-string, max-tokens, cancelled or context-full."""

    tokens: int  # tokens generated this turn
    tok_s: float  # decode speed
    prompt_tokens: int  # tokens prefilled this turn
    prefill_tok_s: float
    ttft_ms: float  # time from send to the first generated token (or to the end of prefill)
    context_tokens: int  # tokens in the session now
    stop: str
    cached_tokens: int | None = None  # prompt tokens a remote server reported it reused (None: not told)


@dataclass(frozen=True)
class Waiting:
    """A remote server has not answered yet and sends no progress: `elapsed_s` since the send."""

    elapsed_s: float


@dataclass(frozen=True)
class Cancelled:
    """The prefill was stopped before any token was generated; the user message was withdrawn."""

    prefilled: int  # tokens of this turn that made it into the session anyway


@dataclass(frozen=True)
class SessionFreed:
    """A live session left memory (reason `evict`: the live-session cap); the conversation stays."""

    conversation: str
    reason: str


@dataclass(frozen=True)
class ChatError:
    """Something failed; the conversation goes on. `where` says which step (prefill, save, ...)."""

    where: str
    message: str


ChatEvent = (
    PrefillStarted | PrefillProgress | TokenText | Done | Waiting | Cancelled | SessionFreed | ChatError
    | Saved | SaveFailed | Hit | Miss | Rejected | Evicted
)

__all__ = [
    "Cancelled", "ChatError", "ChatEvent", "Done", "Evicted", "Hit", "Miss", "PrefillProgress",
    "PrefillStarted", "Rejected", "SaveFailed", "Saved", "SessionFreed", "TokenText", "Waiting",
]
