"""A yes/no modal: `ConfirmDialog(question) -> bool` through `push_screen(..., callback)`.

Owns: the question box, its buttons and keys, and `confirm_delete`: the one sequence of
questions before `.kv` files go, for the cache browser's delete (F4) and the chat's (the
palette, the sidebar): what goes, then, when a pinned file is among it, a second question
that says so (a pinned file is never deleted on one "yes"). The question is a rich `Text`
(or plain str shown literally, never parsed as markup), because it often
quotes a title that came out of a file.
Leaves to callers: what happens on yes.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
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


def pinned_question(pinned: int) -> Text:
    """The second question, for `pinned` (>= 1) pinned files among those a delete removes."""
    if pinned == 1:
        return Text.assemble(("This file is PINNED", "bold magenta"),
                             ": it was kept on purpose and eviction never removes it. Delete it anyway?")
    return Text.assemble((f"{pinned} of these files are PINNED", "bold magenta"),
                         ": they were kept on purpose and eviction never removes them. Delete them anyway?")


def confirm_delete(app: App, question: str | Text, then: Callable[[], None], *, pinned: int = 0,
                   yes_label: str = "Delete") -> None:
    """Ask `question`; on yes, when `pinned` files are among what goes, ask again about them;
    `then()` runs only after every yes (any no, or escape, deletes nothing)."""

    def second(yes: bool | None) -> None:
        if yes:
            then()

    def first(yes: bool | None) -> None:
        if not yes:
            return
        if pinned:
            app.push_screen(ConfirmDialog(pinned_question(pinned), yes_label="Delete pinned"), second)
        else:
            then()

    app.push_screen(ConfirmDialog(question, yes_label=yes_label), first)
