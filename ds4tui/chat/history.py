"""A chat's history in the conversation store: what is committed, when, and how a stored
chat opens again.

Owns the link between an in-memory `Conversation` and its row in the store
(`conv.store_id`, made at the chat's first message), the commit of everything a user
would miss after a restart (the shown messages, every version of its replies, title,
system prompt, sampling overrides, the model and engine it ran on, its titled `.kv`
file), and the failure of a write as one `ChatError` line: the chat goes on, only the
store's copy lags. A chat with no user message yet is never stored (ctrl+n adds no row).
Leaves to the controller when to commit (after each change, and when a reply ends or is
cancelled) and to the turn pipeline how a chat's KV is found again (its titled file, the
longest cached prefix, or a prefill from the text: the cache is only a cache).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ds4tui.chat.conversation import Conversation
from ds4tui.chat.events import ChatError, ChatEvent
from ds4tui.chat.settings import CHAT_KEYS
from ds4tui.store import ConversationStore, StoredChat, StoreError

EventFn = Callable[[ChatEvent], None]


def _ignore(_: ChatEvent) -> None:
    pass


@dataclass(frozen=True)
class ChatHit:
    """A stored chat that matches a search (ctrl+f): where it matched and how it would open."""

    chat_id: str
    title: str
    role: str  # "title", or the role of the first matching message
    line: str  # the match in its context, one line
    how: str  # e.g. "load 1,234 tok from disk, no prefill", "text only: re-prefills"


class History:
    """One controller's view of the store: its model spec and engine are what new chats record."""

    def __init__(self, store: ConversationStore, *, model_spec: str, engine: str = "local") -> None:
        self.store = store
        self.model_spec = model_spec
        self.engine = engine
        self._failed_once = False  # the first failed write is an error line; later ones stay quiet

    @property
    def notice(self) -> str | None:
        """Why the store lives in memory this session (None when it is the file)."""
        return self.store.notice

    def commit(self, conv: Conversation, on_event: EventFn = _ignore, **extra) -> bool:
        """Write conv's current state; False (and one ChatError) when the store cannot.
        `extra`: fields to set along, such as forked_from for a new fork."""
        if conv.store_id is None and not any(m.get("role") == "user" for m in conv.messages):
            return True  # nothing a user would miss yet
        try:
            if conv.store_id is None:
                conv.store_id = self.store.create(title=conv.title, model=conv.model_spec or self.model_spec,
                                                  engine=self.engine, created_at=conv.created_at, **extra)
                extra = {}
            self.store.commit(conv.store_id, conv.messages, conv.alternatives, title=conv.title,
                              system_prompt=conv.system_prompt, settings=_settings(conv),
                              kv_sha=conv.saved_sha, kv_tokens=conv.stored_tokens,
                              **extra)
        except (StoreError, LookupError) as exc:
            if not self._failed_once:
                self._failed_once = True
                on_event(ChatError("history", f"{exc} (the chat goes on; this turn is only in memory)"))
            return False
        self._failed_once = False
        conv.updated_at = time.time()
        return True

    def delete_version(self, conv: Conversation, index: int, content: str, on_event: EventFn = _ignore) -> bool:
        """Remove a deleted reply version from the store, then commit the chat as it now shows."""
        if conv.store_id is not None:
            try:
                self.store.delete_version(conv.store_id, index, content)
            except (StoreError, LookupError) as exc:
                on_event(ChatError("history", f"{exc} (the version is gone here; the store still has it)"))
                return False
        return self.commit(conv, on_event)

    def record_model(self, conv: Conversation) -> None:
        """conv now continues on this controller's model (a chat of another model, re-prefilled)."""
        conv.model_spec = self.model_spec
        if conv.store_id is not None:
            try:
                self.store.update(conv.store_id, model=self.model_spec, engine=self.engine)
            except (StoreError, LookupError):
                pass  # the next commit says it

    def forget(self, chat_id: str) -> StoredChat | None:
        """Delete a stored chat (its tree and row); returns what it was. StoreError when it cannot."""
        return self.store.delete(chat_id)

    def listing(self, open_ids: set[str], archived: bool = False) -> list[StoredChat]:
        """Stored chats that are not open now, most recently used first."""
        return [c for c in self.store.list(archived=archived) if c.id not in open_ids]

    def conversation(self, stored: StoredChat, key: str) -> Conversation:
        """A Conversation holding a loaded stored chat (no session: its next turn finds its KV).
        A trailing user message with no reply (the app stopped while it was being answered)
        comes back as `draft`, for the message box, not as a message."""
        conv = Conversation(key=key, title=stored.title, created_at=int(stored.created_at))
        conv.messages = [dict(m) for m in stored.messages]
        conv.alternatives = {i: list(v) for i, v in stored.alternatives.items()}
        if conv.messages and conv.messages[-1]["role"] == "user":
            conv.draft = conv.messages.pop()["content"]
        conv.overrides = {k: v for k, v in stored.settings.items() if k in CHAT_KEYS}
        conv.store_id = stored.id
        conv.updated_at = stored.updated_at
        conv.model_spec = stored.model or None
        conv.saved_sha = stored.kv_sha
        conv.saved_upto = stored.kv_tokens if stored.kv_sha else 0
        conv.parked_tokens = conv.saved_upto
        return conv


def _settings(conv: Conversation) -> dict:
    return {k: v for k, v in conv.overrides.items() if k in CHAT_KEYS}
