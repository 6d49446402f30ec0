"""Saved (titled) sessions: write a chat's titled file after each reply, list, rename, reopen.

Owns the titled-session side of a controller: the `agent-session` save after a
reply (replacing the chat's previous titled file), the list of saved sessions
this model can load, renaming a chat's file, and opening a file as a chat with
its transcript and KV restored (no prefill). Leaves the bytes to checkpoints.py
and the live-session cap to pool.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Callable

from ds4tui.chat.checkpoints import Checkpoints, SavedSession
from ds4tui.chat.conversation import Conversation, default_title
from ds4tui.chat.events import ChatEvent
from ds4tui.chat.next_turn import without_open_turn
from ds4tui.chat.pool import SessionPool
from ds4tui.chat.registry import Conversations
from ds4tui.engine.errors import EngineError
from ds4tui.engine.model import Model

EventFn = Callable[[ChatEvent], None]


class SavedSessions:
    def __init__(self, model: Model, checkpoints: Checkpoints | None, pool: SessionPool,
                 conversations: Conversations) -> None:
        self.model = model
        self.checkpoints = checkpoints
        self.pool = pool
        self.conversations = conversations

    def listing(self, with_problems: bool = False) -> list[SavedSession]:
        """Titled sessions on disk that this model can load and that are not open already;
        `with_problems`: also those that cannot be resumed, each with its `problem`."""
        if self.checkpoints is None:
            return []
        open_shas = {c.saved_sha for c in self.conversations.all() if c.saved_sha}
        return [s for s in self.checkpoints.titled_sessions(with_problems=with_problems) if s.sha not in open_shas]

    def find(self, query: str) -> list[SavedSession]:
        """Titled sessions whose file name starts with `query` or whose title equals it."""
        if self.checkpoints is None:
            return []
        return self.checkpoints.find_titled(query)

    def save(self, conv: Conversation, on_event: EventFn) -> None:
        """conv's state as its titled file; the file of its previous state goes."""
        if self.checkpoints is None or conv.session is None or not conv.session.tokens:
            return
        saved = self.checkpoints.save_titled(conv.session, conv.session_text, on_event, title=conv.display_title,
                                             created_at=conv.created_at, owned_sha=conv.saved_sha)
        if saved:
            if conv.saved_sha and conv.saved_sha != saved.sha:
                self.checkpoints.delete(conv.saved_sha)
            conv.saved_sha, conv.created_at = saved.sha, saved.created_at  # bumped on a name collision
            conv.saved_upto = len(conv.session.tokens)

    def retitle(self, conv: Conversation, on_event: EventFn) -> None:
        """Move conv's titled file (if any) to the name of its current title."""
        if conv.saved_sha and self.checkpoints is not None and not conv.busy:
            new_sha = self.checkpoints.retitle(conv.saved_sha, conv.display_title, conv.created_at, on_event)
            if new_sha is not None:
                conv.saved_sha = new_sha

    def resume(self, query: str, on_event: EventFn) -> Conversation:
        """Open a titled session (file-name prefix or exact title): transcript and KV, no prefill.

        Raises LookupError when nothing (or more than one file) matches, EngineError
        when the file cannot be restored into this model.
        """
        if self.checkpoints is None:
            raise LookupError("the disk cache is off (--no-disk-cache): nothing to resume")
        already = self.conversations.by_saved_sha(query)
        if already is not None:
            already.touch()
            return already
        matches = self.checkpoints.find_titled(query)
        if not matches:
            broken = [s for s in self.checkpoints.find_titled(query, with_problems=True) if s.problem]
            if broken:
                raise LookupError(f"saved session {broken[0].title!r} ({broken[0].sha[:12]}) cannot be resumed:"
                                  f" {broken[0].problem}")
            from ds4tui.command import command

            raise LookupError(f"no saved session matches {query!r} (see `{command('kv ls')}`)")
        if len(matches) > 1:
            names = ", ".join(f"{m.sha[:12]} {m.title!r}" for m in matches[:5])
            raise LookupError(f"{query!r} matches {len(matches)} saved sessions: {names}")
        return self._open(matches[0], on_event)

    def open_file(self, sha: str, on_event: EventFn) -> Conversation:
        """Open any checkpoint this model wrote (the cache browser's resume), titled or not.

        An untitled checkpoint is a prompt prefix: its transcript may end inside a
        message, and its next turn continues from exactly that KV state.
        """
        if self.checkpoints is None:
            raise LookupError("the disk cache is off (--no-disk-cache): nothing to resume")
        for conv in self.conversations.all():
            if conv.saved_sha == sha:
                conv.touch()
                return conv
        return self._open(self.checkpoints.describe(sha), on_event)

    def restore(self, conv: Conversation, on_event: EventFn) -> str | None:
        """Load conv's titled file (conv.saved_sha) into a live session when its text is the
        chat's own (a stored chat being opened): the next message then prefills only itself.
        Returns why not (conv then has no session) when the file is gone, is not loadable by
        this model or holds another text; the next turn then finds the longest cached prefix."""
        if self.checkpoints is None or conv.saved_sha is None:
            return "no .kv file"
        conv.busy = True
        try:
            saved = self.checkpoints.describe(conv.saved_sha)
            session = self.pool.ensure(conv, on_event)
            text = self.checkpoints.load_saved(saved, session, on_event)
            transcript = text.decode("utf-8", errors="replace")
            messages = _without_stop_string(without_open_turn(self.model.chat.parse(transcript)),
                                            self.model.chat.stop_strings)
            when = self.model.chat.written_on(transcript) or datetime.fromtimestamp(saved.created_at)
            # Equal as the model sees them (a template's default system prompt is in the
            # file's text, not among the chat's messages).
            render = self.model.chat.render
            if render(messages, False, now=when) != render(conv.messages, False, now=when):
                raise ValueError("the file holds another text")
            conv.template_now = when
            conv.session_text = text
            conv.saved_upto = conv.stored_upto = len(session.tokens)
            return None
        except (LookupError, EngineError, ValueError) as exc:
            self.pool.discard(conv)
            return str(exc) or type(exc).__name__
        finally:
            conv.busy = False

    def _open(self, saved: SavedSession, on_event: EventFn) -> Conversation:
        assert self.checkpoints is not None
        conv = Conversation(key=self.conversations.new_key(), title=saved.title, created_at=saved.created_at)
        conv.busy = True
        try:
            session = self.pool.ensure(conv, on_event)
            text = self.checkpoints.load_saved(saved, session, on_event)
            transcript = text.decode("utf-8", errors="replace")
            try:
                conv.messages = _without_stop_string(without_open_turn(self.model.chat.parse(transcript)),
                                                     self.model.chat.stop_strings)
            except ValueError as exc:
                raise EngineError(f"{saved.sha[:12]}: the text is not a transcript of this chat template ({exc})") from None
            # Render the date the stored text holds (else the file's creation day), not today's:
            # the next prompt then starts with the stored text, whatever day it is resumed.
            conv.template_now = self.model.chat.written_on(transcript) or datetime.fromtimestamp(saved.created_at)
            conv.session_text = text
            if saved.ctx_size and saved.tokens >= saved.ctx_size and conv.messages \
                    and conv.messages[-1].get("role") == "assistant":
                conv.resumed_stop = "context-full"  # the reply ran into the context's end
            conv.saved_sha = saved.sha if saved.titled else None
            conv.saved_upto = len(session.tokens) if saved.titled else 0
            conv.stored_upto = len(session.tokens)
            if conv.title is None:
                first = next((m["content"] for m in conv.messages if m.get("role") == "user"), "")
                conv.title = default_title(first) if first else f"checkpoint {saved.sha[:12]}"
        except BaseException:
            conv.session = None
            raise
        finally:
            conv.busy = False
        added = self.conversations.add(conv)
        self.pool.prepare_next()  # counted with this one live
        return added


def _without_stop_string(messages: list[dict], stop_strings) -> list[dict]:
    """The stored text of a reply that ended on a stop string holds it (its token is in the
    state), the live chat's message does not (the stream cut it): cut it here too, so the
    resumed chat renders its next prompt as the live one would."""
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "assistant":
        for stop in stop_strings:
            if stop and last["content"].endswith(stop):
                return messages[:-1] + [{**last, "content": last["content"][: -len(stop)]}]
    return messages
