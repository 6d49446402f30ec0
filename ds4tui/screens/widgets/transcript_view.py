"""A read-only modal showing the whole rendered text of a `.kv` file.

Owns: the scrolling view and its heading (why the file cannot be resumed).
The text is shown through `kv_format.file_text`: escaped, never markup, every
control code made visible. Leaves to callers: reading the file.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ds4tui.screens.widgets.kv_format import file_text, safe_cell


class TranscriptView(ModalScreen[None]):
    """The transcript of a checkpoint, read-only; escape or q closes it."""

    BINDINGS = [Binding("escape,q", "close", "Close")]
    """
    | Key | Description |
    | :- | :- |
    | escape, q | Close the transcript. |
    """

    DEFAULT_CSS = """
    TranscriptView {
        align: center middle;
        & > Vertical {
            width: 90%; height: 90%;
            border: thick $primary; background: $surface;
        }
        & .heading { padding: 0 1; background: $boost; height: auto; }
        & VerticalScroll { padding: 0 1; }
    }
    """

    def __init__(self, title: str | None, text: bytes | str, *, note: str = "",
                 name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        """
        Args:
            title: the session title or None; shown escaped.
            text: the rendered text stored in the file.
            note: why this is read-only (e.g. "not loadable here: ...").
        """
        super().__init__(name=name, id=id, classes=classes)
        self._title = title
        self._text = text
        self._note = note

    def compose(self) -> ComposeResult:
        heading = Text.assemble(("Transcript (read-only)", "bold"), "  ")
        if self._title:
            heading.append_text(safe_cell(self._title, 60, "italic"))
        if self._note:
            heading.append("\n")
            heading.append(self._note, "yellow")
        with Vertical():
            yield Static(heading, classes="heading", markup=False)
            with VerticalScroll():
                yield Static(file_text(self._text), id="transcript-text", markup=False)

    def action_close(self) -> None:
        self.dismiss(None)
