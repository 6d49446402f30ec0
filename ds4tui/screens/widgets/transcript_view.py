"""A read-only modal showing the whole text of a `.kv` file: as messages, or raw.

Owns: the scrolling view, its heading (the file's name, and why it cannot be
resumed), and the toggle between the transcript parsed back into messages
(`engine.text.transcripts`: the template that wrote it, read in reverse) and
the raw stored text. Everything is shown through `kv_format.file_text` /
`safe_cell`: escaped, never markup, every control code made visible.
Leaves to callers: reading the file.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from ds4tui.engine.text.transcripts import parse_transcript
from ds4tui.screens.widgets.kv_format import file_text, safe_cell

_ROLE_STYLES = {"user": "bold cyan", "assistant": "bold green", "system": "bold magenta"}


def messages_text(messages: list[dict]) -> Text:
    """Each message under its role, a blank line between them."""
    out = Text()
    for i, m in enumerate(messages):
        if i:
            out.append("\n\n")
        role = str(m.get("role", "?"))
        out.append_text(safe_cell(role, 20, _ROLE_STYLES.get(role, "bold")))
        out.append("\n")
        if m.get("reasoning"):
            out.append_text(file_text(m["reasoning"], "dim italic"))
            out.append("\n")
        out.append_text(file_text(str(m.get("content", ""))))
    return out


class TranscriptView(ModalScreen[None]):
    """The transcript of a checkpoint, read-only: `r` switches messages/raw; escape or q closes."""

    BINDINGS = [
        Binding("r", "toggle_raw", "Raw / messages"),
        Binding("escape,q", "close", "Close"),
    ]
    """
    | Key | Description |
    | :- | :- |
    | r | Show the raw stored text / the messages. |
    | escape, q | Close the transcript. |
    """

    DEFAULT_CSS = """
    TranscriptView {
        align: center middle;
        & > Vertical {
            width: 90%; height: 90%; min-width: 40;
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
            title: what the file is called (its title, or the chat it belongs to); shown escaped.
            text: the rendered text stored in the file.
            note: why this is read-only (e.g. "not loadable here: ...").
        """
        super().__init__(name=name, id=id, classes=classes)
        self._title = title
        self._text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        self._note = note
        self._messages = parse_transcript(self._text)
        self.raw = self._messages is None  # messages when the template parses back

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("", classes="heading", markup=False, id="transcript-heading")
            with VerticalScroll():
                yield Static("", id="transcript-text", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self._show()

    def _show(self) -> None:
        heading = Text.assemble(("Transcript (read-only)", "bold"), "  ")
        if self._title:
            heading.append_text(safe_cell(self._title, 60, "italic"))
        heading.append("\n")
        if self._messages is None:
            heading.append("raw text (no chat template recognised)", "dim")
        else:
            count = len(self._messages)
            heading.append("raw stored text · r: messages" if self.raw
                           else f"{count} message{'s' if count != 1 else ''} · r: raw text", "dim")
        if self._note:
            heading.append("\n")
            heading.append(self._note, "yellow")
        self.query_one("#transcript-heading", Static).update(heading)
        body = file_text(self._text) if self.raw or self._messages is None else messages_text(self._messages)
        self.query_one("#transcript-text", Static).update(body)

    def action_toggle_raw(self) -> None:
        if self._messages is not None:
            self.raw = not self.raw
            self._show()

    def action_close(self) -> None:
        self.dismiss(None)
