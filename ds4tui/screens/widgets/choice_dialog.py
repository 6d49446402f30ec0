"""A modal question with several answers, one button each; dismisses with the chosen id
(None on Escape). Used for the full-context choices."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ChoiceDialog(ModalScreen[str | None]):
    DEFAULT_CSS = """
    ChoiceDialog { align: center middle; }
    ChoiceDialog > Vertical {
        width: 80; height: auto; padding: 1 2; border: thick $warning; background: $surface;
        & > .question { margin-bottom: 1; }
        & > Horizontal { height: auto; align-horizontal: right; }
        & Button { margin-left: 1; }
    }
    """
    BINDINGS = [Binding("escape", "dismiss_none", "Cancel")]

    def __init__(self, question: str, choices: list[tuple[str, str]]) -> None:
        """choices: (id, label), in button order; the last one gets the focus."""
        super().__init__()
        self._question = question
        self._choices = choices

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self._question), classes="question")
            with Horizontal():
                for cid, label in self._choices:
                    yield Button(label, id=f"choice-{cid}")

    def on_mount(self) -> None:
        self.query(Button).last().focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss((event.button.id or "").removeprefix("choice-"))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
