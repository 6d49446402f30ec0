"""The rename dialog: one line with the chat's title; Enter renames, Escape cancels.

Owns: the dialog only. The title is file-derived text, so it is put into the
Input as a plain value (never markup); the controller does the renaming.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

MAX_TITLE_CHARS = 200  # a title is a trailer in every save; keep it a line, not a document


class RenameScreen(ModalScreen[str | None]):
    """Dismisses with the new title, or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    """
    | Key | Description |
    | :- | :- |
    | escape | Close without renaming. |
    """

    def __init__(self, title: str) -> None:
        super().__init__()
        self._title = title

    def compose(self) -> ComposeResult:
        with Vertical(id="rename-dialog", classes="dialog"):
            yield Label(Text("Rename chat"), classes="dialog-title")
            yield Input(value=self._title, max_length=MAX_TITLE_CHARS, id="rename-input")
            yield Label(Text("Enter renames · Escape cancels"), classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        title = " ".join(event.value.split())
        self.dismiss(title or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
