"""One conversation's view: its log and its own prefill bar.

Owns the pair and the reply being streamed, so switching chats keeps a
hidden chat's progress and text exactly where they were. The chat screen
keeps one pane per open conversation in a ContentSwitcher.
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ds4tui.screens.widgets.chat_log import AssistantMessage, ChatLog
from ds4tui.screens.widgets.prefill_bar import PrefillBar


NEW_REPLY = "↓ new reply · PageDown"


class ChatPane(Vertical):
    """One conversation's view: its log and its own prefill bar (so switching away keeps both),
    and a "↓ new reply" marker shown while text arrives below what the user is reading."""

    DEFAULT_CSS = """
    ChatPane {
        height: 1fr;
        & > #new-reply {
            dock: bottom; offset: 0 -1; width: auto; margin: 0 0 0 2; padding: 0 1;
            background: $accent; color: $text; display: none;
        }
        & > #new-reply.-shown { display: block; }
    }
    """

    def __init__(self, key: str) -> None:
        super().__init__(id=f"pane-{key}")
        self.key = key
        self.reply: AssistantMessage | None = None  # the reply being streamed

    def compose(self) -> ComposeResult:
        yield ChatLog()
        yield PrefillBar()
        yield Static(NEW_REPLY, id="new-reply", markup=False)

    def text_arrived(self) -> None:
        """New reply text was added: mark it when the user is reading above."""
        if self.log.reading_above:
            self.query_one("#new-reply").add_class("-shown")

    def follow(self) -> None:
        """Back to the newest text (the user sent a message, or clicked the marker)."""
        self.log.follow()
        self.query_one("#new-reply").remove_class("-shown")

    @property
    def new_reply_marked(self) -> bool:
        return self.query_one("#new-reply").has_class("-shown")

    @on(ChatLog.AtBottom)
    def _at_bottom(self) -> None:
        self.query_one("#new-reply").remove_class("-shown")

    def on_click(self, event) -> None:
        if event.widget is not None and event.widget.id == "new-reply":
            self.follow()

    @property
    def log(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def prefill(self) -> PrefillBar:
        return self.query_one(PrefillBar)
