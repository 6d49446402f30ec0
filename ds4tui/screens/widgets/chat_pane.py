"""One conversation's view: its log and its own prefill bar.

Owns the pair and the reply being streamed, so switching chats keeps a
hidden chat's progress and text exactly where they were. The chat screen
keeps one pane per open conversation in a ContentSwitcher.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from ds4tui.screens.widgets.chat_log import AssistantMessage, ChatLog
from ds4tui.screens.widgets.prefill_bar import PrefillBar


class ChatPane(Vertical):
    """One conversation's view: its log and its own prefill bar (so switching away keeps both)."""

    DEFAULT_CSS = """
    ChatPane { height: 1fr; }
    """

    def __init__(self, key: str) -> None:
        super().__init__(id=f"pane-{key}")
        self.key = key
        self.reply: AssistantMessage | None = None  # the reply being streamed

    def compose(self) -> ComposeResult:
        yield ChatLog()
        yield PrefillBar()

    @property
    def log(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def prefill(self) -> PrefillBar:
        return self.query_one(PrefillBar)
