"""The live engine sessions of a controller: at most `config.live_sessions` in memory.

Owns creating a conversation's session (with the current storage policy), giving a
conversation another one's shared prefix (a fork, or the session itself when it leaves), the
least-recently-used cap (the one going out is saved with reason `evict`),
freeing on close and on quit (`shutdown`), handing a freed session's memory back to the
engine for the next one and asking it to get the next one ready (`prepare_next`), and
the context size of the controller's sessions. Leaves to checkpoints.py how a save is written.
"""

from __future__ import annotations

from typing import Callable

from ds4tui.chat.checkpoints import Checkpoints
from ds4tui.chat.conversation import Conversation
from ds4tui.chat.events import ChatEvent, SessionFreed
from ds4tui.chat.registry import Conversations
from ds4tui.chat.settings import Settings
from ds4tui.engine.model import Model
from ds4tui.engine.session import Session

EventFn = Callable[[ChatEvent], None]


class SessionPool:
    def __init__(self, model: Model, settings: Settings, conversations: Conversations,
                 checkpoints: Checkpoints | None) -> None:
        self.model = model
        self.settings = settings
        self.conversations = conversations
        self.checkpoints = checkpoints
        self._ctx_size: int | None = None
        self._sliding_window = False

    def ctx_size(self) -> int:
        """Context size of these sessions (the engine's default unless config.ctx is set)."""
        if self._ctx_size is None:
            live = next((c.session for c in self.conversations.live()), None)
            if live is None:
                # The engine picks its default (memory-friendly, below n_ctx); ask it once
                # with a throwaway session rather than guess. Call off the UI thread.
                live = self.model.new_session(self.settings.config.ctx, kv_dtype=self.settings.config.kv_dtype)
            self._ctx_size = live.ctx_size
            # Same probe: only families with sliding-window layers take a storage policy.
            self._sliding_window = bool(live.set_storage_policy(self.settings.config.swa_policy))
        return self._ctx_size

    def sliding_window(self) -> bool:
        """Whether these sessions have sliding-window layers (the SWA storage policy applies)."""
        self.ctx_size()
        return self._sliding_window

    def live_count(self) -> int:
        return len(self.conversations.live())

    def ensure(self, conv: Conversation, on_event: EventFn) -> Session:
        """conv's session, creating it; over the cap the least recently used other one goes to disk."""
        if conv.session is None:
            self._make_room(conv, on_event)
            conv.session = self.model.new_session(self.settings.config.ctx, kv_dtype=self.settings.config.kv_dtype)
            conv.session.set_storage_policy(self.settings.config.swa_policy)  # False (ignored) without SWA layers
            conv.session_text = b""
        return conv.session

    def adopt(self, conv: Conversation, session: Session, on_event: EventFn) -> None:
        """Make `session` (a fork of another chat's) conv's live session, within the cap."""
        self._make_room(conv, on_event)
        session.set_storage_policy(self.settings.config.swa_policy)
        conv.session, conv.session_text = session, b""

    def share(self, conv: Conversation, donor: Conversation, at: int, on_event: EventFn, *,
              logits: bool = True) -> Session:
        """Make donor's state after its first `at` tokens conv's live session, within the cap:
        a fork (Session.fork; `logits` as there) when the cap leaves room for one more beside
        the donor, once the least recently used others are out; else the donor is the one to
        go, and its own session moves over: saved to disk first (reason evict, as any session
        leaving memory), then rewound to `at`. So a shared prefix never holds more buffers
        than the cap allows, and is never copied when its owner leaves anyway."""
        source = donor.session
        assert source is not None and conv.session is None
        self._make_room(conv, on_event, keep=donor)
        if self.live_count() < self.settings.config.live_sessions:
            session = source.fork(at, logits=logits)
        else:
            session = self._park(donor, "evict", on_event)
            session.rewind(at, logits=logits)
        session.set_storage_policy(self.settings.config.swa_policy)
        conv.session, conv.session_text = session, b""
        return session

    def _make_room(self, conv: Conversation, on_event: EventFn, keep: Conversation | None = None) -> None:
        others = sorted((c for c in self.conversations.live() if c is not conv and c is not keep and not c.busy),
                        key=lambda c: c.last_active)
        while others and self.live_count() >= self.settings.config.live_sessions:
            self.free(others.pop(0), "evict", on_event)

    def apply_storage_policy(self) -> None:
        """The configured SWA policy on every idle live session (a busy one takes it next turn)."""
        for conv in self.conversations.live():
            if conv.session is not None and not conv.busy:
                conv.session.set_storage_policy(self.settings.config.swa_policy)

    def free(self, conv: Conversation, reason: str, on_event: EventFn) -> None:
        """Save a live session (reason evict/shutdown) and drop it from memory. Nothing is
        written when the chat's titled file already holds this exact state: one copy of a
        state on disk (a later prompt finds it there by its text, see KvStore.lookup)."""
        if conv.session is None:
            return
        busy = conv.busy
        session = self._park(conv, reason, on_event)
        if not busy and reason != "shutdown":
            # Nothing runs on it (a busy chat's turn might still): the next session takes its memory.
            self.model.release_session(session)

    def _park(self, conv: Conversation, reason: str, on_event: EventFn) -> Session:
        """Save conv's live session (unless its titled file holds this state), take it out of
        conv and say so; the session itself, still holding its state, is returned."""
        session = conv.session
        assert session is not None
        on_disk = (conv.saved_sha is not None and conv.saved_upto == len(session.tokens)
                   and self.checkpoints is not None and self.checkpoints.store.path_for(conv.saved_sha).exists())
        written = False
        if session.tokens and self.checkpoints is not None and not on_disk:
            written = self.checkpoints.save(session, conv.session_text, reason, on_event) is not None
        conv.parked_tokens = len(session.tokens)
        conv.session, conv.session_text, conv.stored_upto = None, b"", 0
        on_event(SessionFreed(conversation=conv.key, reason=reason, written=written))
        return session

    def discard(self, conv: Conversation) -> None:
        """Drop conv's session without saving it (the chat is being deleted)."""
        session = conv.session
        conv.session, conv.session_text, conv.stored_upto = None, b"", 0
        if session is not None and not conv.busy:
            self.model.release_session(session)

    def prepare_next(self) -> None:
        """While the cap leaves room for another live session, have the engine get one ready
        in the background (Model.prepare_session): the next chat opened or resumed then does
        not wait for fresh memory. Within the cap, so never more memory than the cap allows."""
        if self.live_count() < self.settings.config.live_sessions:
            self.model.prepare_session(self.settings.config.ctx, kv_dtype=self.settings.config.kv_dtype)

    def free_all(self, reason: str, on_event: EventFn) -> None:
        for conv in self.conversations.live():
            if not conv.busy:
                self.free(conv, reason, on_event)
