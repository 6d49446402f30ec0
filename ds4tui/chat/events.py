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
    source: str  # "live", "fork" (another chat's live session), "disk" or "cold"


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
class ReasoningText:
    """Newly decoded reasoning of the reply (a `<think>` block's text, or a server's
    `reasoning_content`): shown folded above the answer, not as part of it."""

    text: str


@dataclass(frozen=True)
class ToolCallShown:
    """A tool call the reply made, parsed when the reply ended: its function's name and its
    arguments (a JSON object's text)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class CacheReport:
    """Where one turn's prompt prefix came from and what was computed.

    source: "live" (this chat's session in memory, rewound if the prompt changed),
    "disk" (a .kv file: `sha`, `ms`), "fork" (a copy of another chat's state) or "cold"
    (nothing reused: `reason` says why). `replayed`: tokens a rewind re-ran to get back
    to the reused point (0 on the llama family except the last token inside a chunk).
    """

    source: str
    reused: int  # tokens of the prompt that were not prefilled this turn
    prefilled: int  # tokens prefilled this turn
    replayed: int = 0
    sha: str | None = None
    ms: float | None = None
    reason: str | None = None


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
    cache: CacheReport | None = None
    regenerated: bool = False  # the reply replaced an earlier one (kept as an alternative)
    forward_before_first_token: bool = True  # False: the first token came from kept logits
    sampled: bool | None = None  # True: drawn with temperature > 0; False: greedy; None: not known (remote)
    sampler_ms: float = 0.0  # CPU time spent choosing tokens from logits, within the decode time


@dataclass(frozen=True)
class Waiting:
    """A remote server has not answered yet and sends no progress: `elapsed_s` since the send."""

    elapsed_s: float


@dataclass(frozen=True)
class ContextWontFit:
    """The message was not sent: the prompt and room for a reply exceed the context.
    Nothing was changed; `check` lists the caller's choices (controller.check_fit)."""

    check: "FitCheck"


@dataclass(frozen=True)
class FitCheck:
    """Will the next message fit? `prompt_tokens` + `reserve` (room for the reply) against `ctx`.

    When it does not: `drop_turns` oldest user/assistant exchanges dropped (system prompt
    kept) make it fit, re-prefilling `drop_prefill` tokens (None: even one exchange with
    nothing before it is too long); a fresh chat with the system prompt needs `fresh_tokens`.
    """

    fits: bool
    prompt_tokens: int
    reserve: int
    ctx: int
    drop_turns: int | None = None
    drop_prefill: int | None = None
    fresh_tokens: int | None = None


@dataclass(frozen=True)
class Forked:
    """A new chat branched off another: `tokens` of state copied with no prefill (source
    "memory": the parent's live session; "disk": the parent's .kv; "none": nothing to copy,
    the first message prefills), `replayed` re-run to land on the branch point."""

    conversation: str
    parent: str
    at_message: int
    tokens: int
    source: str
    replayed: int
    ms: float


@dataclass(frozen=True)
class HistoryOpened:
    """A chat was opened from the conversation store. Its KV is on disk (`kv_tokens` in its
    titled file) or only its text is kept (`prefill_tokens` to prefill at the next message);
    `made_with`: the other model it was written with (its history continues on this one)."""

    conversation: str
    kv_tokens: int
    prefill_tokens: int
    made_with: str | None = None
    remote: bool = False
    kv_problem: str | None = None  # why its titled file, still on disk, could not be restored


@dataclass(frozen=True)
class Cancelled:
    """The prefill was stopped before any token was generated; the user message was withdrawn."""

    prefilled: int  # tokens of this turn that made it into the session anyway


@dataclass(frozen=True)
class SessionFreed:
    """A live session left memory (reason `evict`: the live-session cap); the conversation stays."""

    conversation: str
    reason: str
    # True when a checkpoint was written; False when the chat's titled file already held the
    # state (nothing written), or when the disk cache is off or the save failed.
    written: bool = True


@dataclass(frozen=True)
class ChatError:
    """Something failed; the conversation goes on. `where` says which step (prefill, save, ...)."""

    where: str
    message: str


ChatEvent = (
    PrefillStarted | PrefillProgress | TokenText | ReasoningText | ToolCallShown | Done | Waiting | Cancelled | SessionFreed | ChatError
    | ContextWontFit | Forked | Saved | SaveFailed | Hit | Miss | Rejected | Evicted | HistoryOpened
)

__all__ = [
    "CacheReport", "Cancelled", "ChatError", "ChatEvent", "ContextWontFit", "Done", "Evicted", "FitCheck",
    "Forked", "HistoryOpened", "Hit", "Miss", "PrefillProgress", "PrefillStarted", "ReasoningText", "Rejected", "SaveFailed", "Saved",
    "SessionFreed", "TokenText", "ToolCallShown", "Waiting",
]
