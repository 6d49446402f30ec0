"""The open conversations of one controller: keys, lookup, and a lock for UI-thread reads.

Owns the dict of `Conversation`s and their in-memory keys. A worker thread changes a
conversation's contents during a turn; the UI thread only lists and looks up, under
the lock, so it never sees the dict mid-change.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

from ds4tui.chat import branches
from ds4tui.chat.conversation import Conversation, default_title
from ds4tui.chat.settings import CHAT_KEYS, Settings
from ds4tui.store import StoreError

if TYPE_CHECKING:
    from ds4tui.chat.history import History


class Conversations:
    def __init__(self) -> None:
        self._by_key: dict[str, Conversation] = {}
        self._keys = itertools.count(1)
        self._lock = threading.Lock()

    def new_key(self) -> str:
        return f"c{next(self._keys)}"

    def open_new(self, system_prompt: str | None, kind: type[Conversation] = Conversation) -> Conversation:
        """A new empty chat of `kind`, registered; a system prompt becomes its first message."""
        conv = kind(key=self.new_key())
        if system_prompt:
            conv.messages.append({"role": "system", "content": system_prompt})
        return self.add(conv)

    def add(self, conv: Conversation) -> Conversation:
        with self._lock:
            self._by_key[conv.key] = conv
        return conv

    def remove(self, key: str) -> None:
        with self._lock:
            del self._by_key[key]

    def get(self, key: str) -> Conversation:
        """KeyError when no open conversation has this key."""
        with self._lock:
            return self._by_key[key]

    def find(self, key: str) -> Conversation | None:
        with self._lock:
            return self._by_key.get(key)

    def all(self) -> list[Conversation]:
        with self._lock:
            return list(self._by_key.values())

    def live(self) -> list[Conversation]:
        """Conversations holding a live engine session."""
        return [c for c in self.all() if c.live]

    def by_saved_sha(self, query: str) -> Conversation | None:
        """The open conversation whose titled file starts with `query`, or whose title equals it."""
        for conv in self.all():
            if conv.saved_sha and (conv.saved_sha.startswith(query.lower()) or conv.title == query):
                return conv
        return None


class OpenChats:
    """The conversation methods both chat controllers offer the screens, over their
    `conversations` registry, `config` (whose system prompt a new chat starts with) and
    `history` (the conversation store, where an imported chat is committed)."""

    conversations: Conversations
    settings: Settings
    history: History
    conversation_kind: type[Conversation] = Conversation

    def new_conversation(self, system_prompt: str | None = None) -> Conversation:
        """An empty chat; the system prompt (argument, else config) is fixed for its lifetime."""
        prompt = system_prompt if system_prompt is not None else self.config.system_prompt
        return self.conversations.open_new(prompt, self.conversation_kind)

    def get(self, key: str) -> Conversation:
        return self.conversations.get(key)

    def find(self, key: str) -> Conversation | None:
        """The open conversation with this key, or None (it was closed meanwhile)."""
        return self.conversations.find(key)

    def list(self) -> list[Conversation]:
        return self.conversations.all()

    def _idle(self, key: str) -> Conversation:
        """The open chat `key`; RuntimeError while a turn runs on it."""
        conv = self.get(key)
        if conv.busy:
            raise RuntimeError(f"conversation {key} is busy")
        return conv

    def delete_version(self, key: str, index: int) -> str:
        """Delete the shown version of the last reply (store included); returns the text now
        shown. The next message continues from that one, as after ←/→."""
        conv = self._idle(key)
        deleted, text = branches.delete_alternative(conv, index)
        self.history.delete_version(conv, index, deleted)
        return text

    def fresh_like(self, key: str) -> Conversation:
        """A new, empty chat carrying this chat's system prompt and settings."""
        conv = self.get(key)
        fresh = self.new_conversation(conv.system_prompt or "")
        fresh.overrides = dict(conv.overrides)
        return fresh

    def _forget_unsent(self, conv: Conversation) -> None:
        """A chat's first message withdrawn (its prefill cancelled, or it failed) leaves no
        message of the user's: the chat is "New chat" again and its row leaves the store (it
        listed an empty chat under the withdrawn message's title). The text is in the box."""
        if any(m.get("role") == "user" for m in conv.messages):
            return
        conv.title = None
        if conv.store_id is not None:
            try:
                self.history.forget(conv.store_id)
            except (StoreError, LookupError):
                return  # the empty row stays; nothing is lost
            conv.store_id = None

    def keep_draft(self, key: str, text: str) -> None:
        """A message never sent (queued when the app quit): stored as the chat's last, unanswered
        message, which the store gives back as the chat's draft (the message box) when it is
        opened again, as after a crash mid-reply. The chat in memory is left as it was."""
        conv = self.get(key)
        conv.messages.append({"role": "user", "content": text})
        untitled = conv.title is None
        if untitled:
            conv.title = default_title(text)
        try:
            self.history.commit(conv)
        finally:
            conv.messages.pop()
            if untitled:
                conv.title = None

    def import_messages(self, messages: list[dict], title: str | None = None,
                        created_at: int | None = None) -> Conversation:
        """Open a transcript (OpenAI messages) as a new chat, committed to the history; its next
        message starts from it."""
        conv = self.conversation_kind(key=self.conversations.new_key(), title=title)
        if created_at:
            conv.created_at = created_at
        conv.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        if conv.title is None:
            first = next((m["content"] for m in conv.messages if m["role"] == "user"), "")
            conv.title = default_title(first) if first else None
        self.conversations.add(conv)
        self.history.commit(conv)
        return conv

    def chat_settings(self, key: str) -> dict:
        """The chat's system prompt and sampling, as its next turn (or request) will use them."""
        conv = self.get(key)
        out = {k: self.settings.value(k, conv) for k in CHAT_KEYS}
        out["system_prompt"] = conv.system_prompt
        return out
