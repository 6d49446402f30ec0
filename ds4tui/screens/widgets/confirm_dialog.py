"""A yes/no modal: `ConfirmDialog(question) -> bool` through `push_screen(..., callback)`.

Owns: the question box, its buttons and keys. The question is a rich `Text`
(or plain str shown literally, never parsed as markup), because it often
quotes a title that came out of a file.
Leaves to callers: what happens on yes.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmDialog(ModalScreen[bool]):
    """Asks one question; dismisses with True (yes) or False (no / escape)."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", show=False),
        Binding("n,escape", "answer(False)", "No", show=False),
        # The buttons sit side by side: the arrows move between them as Tab does.
        Binding("left", "app.focus_previous", "Previous button", show=False),
        Binding("right", "app.focus_next", "Next button", show=False),
    ]
    """
    | Key | Description |
    | :- | :- |
    | y | Answer yes. |
    | n, escape | Answer no. |
    | left / right | Move between the buttons. |
    """

    DEFAULT_CSS = """
    ConfirmDialog {
        align: center middle;
        & > Vertical {
            width: 64; height: auto; padding: 1 2;
            border: thick $warning; background: $surface;
        }
        & .question { width: 1fr; margin-bottom: 1; }
        & Horizontal { height: auto; align-horizontal: right; }
        & Button { margin-left: 2; }
    }
    """

    def __init__(self, question: str | Text, *, yes_label: str = "Yes", danger: bool = True,
                 name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        """
        Args:
            question: shown verbatim (a str is not read as markup).
            yes_label: the confirming button's label, e.g. "Delete".
            danger: style the confirming button as destructive.
        """
        super().__init__(name=name, id=id, classes=classes)
        self._question = question if isinstance(question, Text) else Text(question)
        self._yes_label = yes_label
        self._danger = danger

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self._question, classes="question", markup=False)
            with Horizontal():
                yield Button("No", id="no")
                yield Button(self._yes_label, id="yes", variant="error" if self._danger else "primary")

    def on_mount(self) -> None:
        # Focus starts on "No": a stray Enter must not destroy anything.
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def _on_button(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
