"""One chat: its messages, its title and (while in memory) its live engine session.

Owns: the Conversation record and the small rules about it (the default
title, what the UI shows). The controller owns every change to the session.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ds4tui.engine.session import Session

MAX_TITLE_CHARS = 200  # a title is a trailer in every save: keep it a line, not a document
TITLE_CHARS = 48  # sidebar width minus its border and marker: a title fits one line


def default_title(text: str, limit: int = TITLE_CHARS) -> str:
    """The first user message, whitespace collapsed, clipped to `limit` characters with an ellipsis."""
    title = re.sub(r"\s+", " ", text).strip()
    if not title:
        return "New chat"
    if len(title) > limit:
        title = title[: limit - 1].rstrip() + "…"
    return title


@dataclass(eq=False)
class Conversation:
    """Messages plus at most one live session whose tokens cover a prefix of their rendering.

    `session_text` is always the exact bytes of `session.tokens` (the rendered
    text they decode to): it is what a checkpoint of the session stores, and
    the next prompt reuses the session when it starts with these bytes.
    """

    key: str  # stable in-memory id; the titled file name changes on rename, this does not
    title: str | None = None  # None until the first user message
    created_at: int = field(default_factory=lambda: int(time.time()))
    messages: list[dict] = field(default_factory=list)
    session: Session | None = None
    session_text: bytes = b""
    last_active: float = field(default_factory=time.monotonic)
    saved_sha: str | None = None  # name (without .kv) of this chat's titled-session file
    saved_upto: int = 0  # tokens that titled file holds: the session's state is on disk when equal
    stored_upto: int = 0  # tokens covered by the last cold/continued checkpoint (frontier bookkeeping)
    busy: bool = False  # a worker is using the session right now
    parked_tokens: int = 0  # tokens of the state it had when its session was freed (parked on disk)
    overrides: dict = field(default_factory=dict)  # this chat's own sampling settings (settings.CHAT_KEYS)
    # Regenerated replies: message index -> every version of that reply; the message shows one.
    alternatives: dict[int, list[str]] = field(default_factory=dict)
    forked_from: tuple[str, int] | None = None  # (parent's title, messages kept) of a fork
    # How the last reply of a resumed chat ended, as far as its file tells: "context-full" when
    # its tokens filled the context it was written with; None otherwise (a stop by the user or
    # by max_tokens is not stored, and a reply that ended on its own reads the same).
    resumed_stop: str | None = None
    # What a chat template's date (strftime_now) says for this chat: fixed when the chat starts
    # (a fork keeps its parent's, a resumed chat the one its text holds), so every turn renders
    # the same header, its cached text stays a prefix of the next prompt, and a chat resumed
    # another day still hits its cache.
    template_now: datetime = field(default_factory=datetime.now)
    updated_at: float | None = None  # when its history was last written to the store (export's "last used")
    store_id: str | None = None  # its row in the conversation store (None until its first message)
    model_spec: str | None = None  # the model it was made with, when not this controller's
    draft: str | None = None  # an unanswered message from before a restart, for the message box

    def alternative_index(self, index: int) -> tuple[int, int]:
        """(shown version, versions) of the reply at message `index`; (0, 1) without alternatives."""
        versions = self.alternatives.get(index)
        if not versions:
            return 0, 1
        content = self.messages[index]["content"]
        shown = max((i for i, v in enumerate(versions) if v == content), default=len(versions) - 1)
        return shown, len(versions)

    @property
    def system_prompt(self) -> str | None:
        first = self.messages[0] if self.messages else None
        return first["content"] if first is not None and first.get("role") == "system" else None

    @property
    def display_title(self) -> str:
        return self.title or "New chat"

    @property
    def live(self) -> bool:
        return self.session is not None

    @property
    def context_tokens(self) -> int:
        """Tokens of its context: the live session's, or while parked the state it left on disk."""
        return len(self.session.tokens) if self.session is not None else self.parked_tokens

    @property
    def stored_tokens(self) -> int:
        """The token count the store keeps with the chat (`kv_tokens`): its titled file's."""
        return self.saved_upto if self.saved_sha else 0

    def visible_messages(self) -> list[dict]:
        """What the chat view shows: user and assistant turns (the system prompt stays hidden)."""
        return [m for m in self.messages if m.get("role") in ("user", "assistant")]

    def touch(self) -> None:
        self.last_active = time.monotonic()
