"""How the chat screen shows what the controller reports: one handler per event type.

Owns: `EngineEventView`, mixed into `ChatScreen`: `_EVENT_HANDLERS` maps each
`ds4tui.chat.events` type to its handler, which updates the chat's pane, the
status bar, toasts and the sidebar. A new event type is one handler and one
entry (a test checks that every `ChatEvent` type has one). Wording and severity
of the cache and error notices: chat_notices.py.
Leaves to `ChatScreen`: receiving the `EngineEvent` message (Textual collects
`@on` handlers only from the Screen class itself), the state the handlers set
(`_prefill_tok_s`) and `_toast`; to the status bar what each chat shows there (its activity,
speed and cache line: StatusBar keeps them per chat); to its other mixins the helpers they call (chat_panes.py: `_pane_or_none`,
`_conversation`, `_refresh_sidebar`, `_update_context`; chat_workers.py: `_scan_saved`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ds4tui.chat import events as ev
from ds4tui.screens.chat_notices import notice_for, stats_line
from ds4tui.screens.widgets import fmt
from ds4tui.screens.widgets.title_fit import short_title
from ds4tui.screens.widgets.chat_pane import ChatPane
from ds4tui.screens.widgets.status_bar import StatusBar

PREFILL_SAMPLE_TOKENS = 256  # a shorter prefill's speed is mostly fixed overhead, not a rate


class EngineEventView:
    """The `ChatScreen` methods that show engine, cache and error events."""

    def _show_event(self, key: str, event: ev.ChatEvent) -> None:
        """Route `event` of chat `key` to its handler (`pane` is None when that chat is not on screen)."""
        handler = self._EVENT_HANDLERS.get(type(event))
        if handler is not None:
            self._event_key = key
            handler(self, event, self._pane_or_none(key))
        if key == self._active:
            self._update_context()

    def _set_cache_line(self, line: str) -> None:
        """The status bar's cache slot belongs to a chat: remember it for the chat the event
        is about, and show it only when that chat is the one on screen. Events of no chat
        (a resume before its chat exists, the shutdown saves) show at once; a resumed chat
        then takes the line over (`ChatTurns._show_resumed`)."""
        self.query_one(StatusBar).set_cache(self._event_key, line)

    def _on_token_text(self, event: ev.TokenText, pane: ChatPane | None) -> None:
        if pane is not None and pane.reply is not None:
            pane.reply.append(event.text)
            pane.text_arrived()
        status = self.query_one(StatusBar)
        if status.activity_of(self._event_key).startswith("prefill") or \
                status.activity_of(self._event_key) == "thinking…":
            status.set_activity(self._event_key, "generating…")

    def _on_reasoning_text(self, event: ev.ReasoningText, pane: ChatPane | None) -> None:
        if pane is not None and pane.reply is not None:
            pane.reply.append_reasoning(event.text)
            pane.text_arrived()
        status = self.query_one(StatusBar)
        now = status.activity_of(self._event_key)
        if now.startswith("prefill") or now == "generating…":
            status.set_activity(self._event_key, "thinking…")

    def _on_tool_call(self, event: ev.ToolCallShown, pane: ChatPane | None) -> None:
        if pane is not None and pane.reply is not None:
            pane.reply.add_tool_call(event.name, event.arguments)

    def _on_prefill_started(self, event: ev.PrefillStarted, pane: ChatPane | None) -> None:
        self._refresh_sidebar()  # a first message has just become the chat's title
        status = self.query_one(StatusBar)
        if event.source != "cold" and event.cached:
            self._set_cache_line(f"reused {fmt.tokens(event.cached)} tokens ({event.source})")
        if event.total == 0:
            status.set_activity(self._event_key, "generating…")

    def _on_prefill_progress(self, event: ev.PrefillProgress, pane: ChatPane | None) -> None:
        if event.done < event.total:
            if pane is not None:
                pane.prefill.show_progress(event.done, event.total, event.tok_s, event.eta_s)
        else:
            if pane is not None:
                pane.prefill.hide()
            self.query_one(StatusBar).set_activity(self._event_key, "generating…")

    def _on_done(self, event: ev.Done, pane: ChatPane | None) -> None:
        if pane is not None:
            pane.prefill.hide()
            if pane.reply is not None:
                pane.reply.set_stats(stats_line(event))
        if event.prompt_tokens >= PREFILL_SAMPLE_TOKENS:
            self._prefill_tok_s = event.prefill_tok_s
        self.query_one(StatusBar).set_speed(self._event_key, fmt.rate(event.tok_s))

    def _on_waiting(self, event: ev.Waiting, pane: ChatPane | None) -> None:
        """A remote server that sends no progress: count the seconds instead."""
        self.query_one(StatusBar).set_activity(self._event_key, f"waiting for the server… {event.elapsed_s:.0f} s")

    def _on_cancelled(self, event: ev.Cancelled, pane: ChatPane | None) -> None:
        if pane is not None:
            pane.prefill.hide()

    def _show_notice(self, event: object, pane: ChatPane | None = None) -> None:
        """Cache and error events: a status-bar line and a toast for the notable ones."""
        notice = notice_for(event)
        if notice.status is not None:
            self._set_cache_line(notice.status)
        if notice.toast is not None:
            self._toast(notice.toast, notice.title, notice.severity)

    def _on_evicted(self, event: ev.Evicted, pane: ChatPane | None) -> None:
        self._show_notice(event)
        if event.files:
            self._scan_saved()  # a saved session may be among them

    def _on_session_freed(self, event: ev.SessionFreed, pane: ChatPane | None) -> None:
        conv = self._conversation(event.conversation)
        title = conv.display_title if conv is not None else event.conversation
        where = f"saved to disk: {event.reason}" if event.written else "its saved session holds its state"
        self._toast(f"{short_title(title)} left memory ({where})", "Sessions")
        self._refresh_sidebar()

    def _on_chat_error(self, event: ev.ChatError, pane: ChatPane | None) -> None:
        self._show_notice(event)
        if pane is not None:
            pane.log.add_notice(f"Error ({event.where}): {event.message}", error=True)

    _EVENT_HANDLERS: ClassVar[dict[type, Callable[[Any, Any, ChatPane | None], None]]] = {
        ev.TokenText: _on_token_text,
        ev.ReasoningText: _on_reasoning_text,
        ev.ToolCallShown: _on_tool_call,
        ev.PrefillStarted: _on_prefill_started,
        ev.PrefillProgress: _on_prefill_progress,
        ev.Done: _on_done,
        ev.Waiting: _on_waiting,
        ev.Cancelled: _on_cancelled,
        ev.SessionFreed: _on_session_freed,
        ev.ChatError: _on_chat_error,
        ev.Evicted: _on_evicted,
        ev.Hit: _show_notice,
        ev.Miss: _show_notice,
        ev.Saved: _show_notice,
        ev.SaveFailed: _show_notice,
        ev.Rejected: _show_notice,
        ev.Forked: lambda self, event, pane: self._on_forked(event, pane),  # ChatMoves
        ev.HistoryOpened: lambda self, event, pane: self._opened.__setitem__(event.conversation, event),
        ev.ContextWontFit: lambda self, event, pane: self._on_context_wont_fit(event, pane),  # ChatMoves
    }
