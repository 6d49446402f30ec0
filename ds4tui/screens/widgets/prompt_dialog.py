"""A one-line text prompt: `PromptDialog(label, value) -> str | None` (None when cancelled).

Owns: the label, the input and its keys (enter accepts, escape cancels), and keeping
terminal controls out of the input: an Input draws its value as it is, and the value
is often a title read from a file, so it holds controls as their visible escapes
(format.display.safe_text). Leaves to callers: validating and applying the answer.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from ds4tui.format.display import safe_text


class OneLineInput(Input):
    """An Input whose value never holds a control character (ESC, BEL, bidi overrides, tabs)."""

    def validate_value(self, value: str) -> str:
        return safe_text(value)


class PromptDialog(ModalScreen[str | None]):
    """Asks for one line of text; dismisses with the text, or None on escape."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", show=False)]
    """
    | Key | Description |
    | :- | :- |
    | escape | Cancel (dismiss with None). |
    """

    DEFAULT_CSS = """
    PromptDialog {
        align: center middle;
        & > Vertical {
            width: 72; height: auto; padding: 1 2;
            border: thick $primary; background: $surface;
        }
        & .label { margin-bottom: 1; }
        & .hint { color: $text-muted; margin-top: 1; }
    }
    """

    def __init__(self, label: str | Text, value: str = "", *, placeholder: str = "",
                 max_length: int = 0,
                 name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        """
        Args:
            label: the question, shown verbatim (a str is not read as markup).
            value: the initial text, selected so that typing replaces it.
            placeholder: shown while the input is empty.
            max_length: the most characters the input takes (0: no limit).
        """
        super().__init__(name=name, id=id, classes=classes)
        self._label = label if isinstance(label, Text) else Text(label)
        self._value = value
        self._placeholder = placeholder
        self._max_length = max_length

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self._label, classes="label", markup=False)
            yield OneLineInput(self._value, placeholder=self._placeholder, select_on_focus=True,
                               max_length=self._max_length)
            yield Static(Text("Enter saves · Escape cancels"), classes="hint")

    @on(Input.Submitted)
    def _on_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
