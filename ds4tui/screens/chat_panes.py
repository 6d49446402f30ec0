"""Which chat is on screen: a pane per open chat, switching between them, and the sidebar.

Owns: `ChatPanes`, mixed into `ChatScreen`: adding a chat's pane, switching the
active chat (ctrl+n, ctrl+pageup/pagedown, the sidebar), scrolling the active
transcript (pageup/pagedown), the sidebar's width and visibility (ctrl+b), and
drawing it from the open chats plus the last scan of saved sessions; also the
lookups every other part uses (`_pane`, `_pane_or_none`, `_conversation`) and the
status bar's context gauge for the active chat.
Leaves to `ChatScreen` the state these read (`_active`, `_busy`, `_saved`,
`_quitting`, `_sidebar_by_user`) and the `ChatChosen` message.
"""

from __future__ import annotations

from textual.widgets import ContentSwitcher

from ds4tui.screens.widgets.chat_pane import ChatPane
from ds4tui.screens.widgets.conversation_list import ChatEntry, ConversationList
from ds4tui.screens.widgets.prompt_input import PromptInput
from ds4tui.screens.widgets.status_bar import StatusBar

SIDEBAR_HIDE_BELOW = 60  # columns: narrower, the transcript needs them all


def sidebar_width(columns: int) -> int:
    return max(20, min(48, int(columns * 0.3)))


class ChatPanes:
    """The `ChatScreen` side of open chats: panes, switching, scrolling and the sidebar."""

    async def action_new_chat(self) -> None:
        if not self._model_ready_or_say():
            return
        conv = self.controller.new_conversation()
        await self._add_pane(conv.key)
        self._switch(conv.key)

    async def _add_pane(self, key: str) -> ChatPane:
        pane = ChatPane(key)
        await self.query_one(ContentSwitcher).add_content(pane)
        return pane

    def _switch(self, key: str) -> None:
        if self._editing is not None and self._editing[0] != key:
            self._stop_editing()  # an edit belongs to the chat it started in
        self._active = key
        self.query_one(ContentSwitcher).current = f"pane-{key}"
        conv = self._conversation(key)
        if conv is not None:
            conv.touch()
        self.query_one(StatusBar).show_chat(key)  # this chat's own activity, speed and cache line
        self._refresh_sidebar()
        self._update_context()
        self.query_one("#prompt", PromptInput).focus()

    def action_cycle_chat(self, step: int) -> None:
        if self.controller is None or self._active is None:
            return
        keys = [c.key for c in self.controller.list()]
        if len(keys) > 1:
            self._switch(keys[(keys.index(self._active) + step) % len(keys)])

    def _fit_sidebar(self, width: int) -> None:
        """The chat list takes 30% of the width (20..48 columns), so titles use what the
        terminal has; below 60 columns it folds away (ctrl+b shows it), and comes back when
        the terminal is widened again, unless ctrl+b was pressed in between."""
        sidebar = self.query_one(ConversationList)
        sidebar.styles.width = sidebar_width(width)
        if not self._sidebar_by_user:
            sidebar.display = width >= SIDEBAR_HIDE_BELOW

    def action_scroll_transcript(self, pages: int) -> None:
        """PageUp/PageDown: scroll the active chat's transcript, wherever the focus is."""
        pane = self._pane_or_none(self._active) if self._active else None
        if pane is None:
            return
        if pages < 0:
            pane.log.scroll_page_up(animate=False)
        else:
            pane.log.scroll_page_down(animate=False)

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one(ConversationList)
        sidebar.display = not sidebar.display
        self._sidebar_by_user = True  # the user's choice from now on, whatever the width

    def _shown(self, messages: list[dict]) -> list[dict]:
        """Stored messages as the log shows them: each reply split by the chat layer
        (controller.reply_view) into its answer, its reasoning (folded) and its tool calls."""
        out = []
        for m in messages:
            if m.get("role") == "assistant":
                view = self.controller.reply_view(str(m.get("content", "")))
                m = {**m, "content": view.content, "reasoning": view.reasoning,
                     "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in view.calls]}
            out.append(m)
        return out

    def _show_reply(self, widget, text: str) -> None:
        """One reply replaced by another version of it, split as `_shown` does."""
        view = self.controller.reply_view(text)
        widget.set_parts(view.content, view.reasoning, tuple((c.name, c.arguments) for c in view.calls))

    def _refresh_sidebar(self) -> None:
        """Redraw the chat list from memory (open chats) and the last disk scan (saved ones)."""
        if self.controller is None or self._quitting:
            return
        # A chat with no state yet (a new one) has nothing parked on disk: not ○.
        entries = [ChatEntry(c.display_title, key=c.key, live=c.live or not c.context_tokens,
                             busy=c.key == self._busy, when=c.updated_at or c.created_at)
                   for c in self.controller.list()]
        open_ids = {c.store_id for c in self.controller.list() if c.store_id}
        here = self.config.model
        entries += [ChatEntry(chat.display_title, chat_id=chat.id, text_only=not on_disk,
                              model=chat.model if chat.model and chat.model != here and not chat.remote else "",
                              when=chat.updated_at)
                    for chat, on_disk in self._saved if chat.id not in open_ids]
        # exit_on_error=False: a redraw racing the app's exit must not end in a traceback.
        self.run_worker(self.query_one(ConversationList).show_entries(entries, self._active),
                        group="sidebar", exclusive=False, exit_on_error=False)

    def _saved_scanned(self, saved: list) -> None:
        """The stored chats, each with whether its KV is on disk (EngineWorkers._scan_saved):
        shown below the open chats."""
        self._saved = saved
        self._refresh_sidebar()

    def _update_context(self) -> None:
        status = self.query_one(StatusBar)
        conv = self._conversation(self._active) if self._active else None
        status.ctx_used = conv.context_tokens if conv is not None else 0
        if self.controller is not None:
            status.ctx_total = self.controller.ctx_size()

    # -- lookups --------------------------------------------------------------------------------

    def _pane(self, key: str) -> ChatPane:
        return self.query_one(f"#pane-{key}", ChatPane)

    def _pane_or_none(self, key: str) -> ChatPane | None:
        found = self.query(f"#pane-{key}") if key else None
        return found.first(ChatPane) if found else None

    def _conversation(self, key: str):
        if self.controller is None:
            return None
        return self.controller.find(key)
