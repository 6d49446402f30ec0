"""The message box: a TextArea where Enter sends and ctrl+j (or shift+enter) starts a new line.

Owns: those keys, the `Submitted` message, and keeping terminal controls out of the
box: a TextArea draws its text to the terminal as it is, so a pasted ESC sequence
would recolour or move the screen's cursor. Text that enters the box (typed, pasted,
loaded for an edit) passes `format.display.safe_lines` first (the rule every screen
uses), so what the box shows is what is sent. Leaves to the screen: what sending
means, and whether a send is allowed right now.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea
from textual.widgets.text_area import Edit

from ds4tui.format.display import safe_lines

# Keys that insert a newline instead of sending. Terminals send LF for ctrl+j;
# shift+enter and alt+enter arrive as their own keys only where the terminal
# reports them (kitty keyboard protocol, some xterm modes).
NEWLINE_KEYS = frozenset({"ctrl+j", "newline", "shift+enter", "alt+enter"})


def box_text(text: str) -> str:
    """Text as the message box holds it: line breaks of any platform as newlines, every other
    control (ESC, BEL, bidi overrides...) as its visible escape (`\\e`, `\\x07`, `\\u202e`)."""
    return safe_lines(text.replace("\r\n", "\n").replace("\r", "\n"))


class PromptInput(TextArea):
    """A multi-line prompt; Enter posts `PromptInput.Submitted` with the text."""

    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        min-height: 3;
        max-height: 10;
    }
    """

    @dataclass
    class Submitted(Message):
        """Enter was pressed; handle with `on_prompt_input_submitted`."""

        prompt_input: PromptInput
        text: str

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    def __init__(self, text: str = "", *, placeholder: str = "", cursor_blink: bool = True,
                 name: str | None = None, id: str | None = None, classes: str | None = None,
                 disabled: bool = False) -> None:
        """
        Args:
            text: Initial text.
            placeholder: Shown while the box is empty.
            cursor_blink: False keeps the cursor still (snapshot tests).
        """
        super().__init__(box_text(text), soft_wrap=True, tab_behavior="focus", show_line_numbers=False,
                         name=name, id=id, classes=classes, disabled=disabled, placeholder=placeholder)
        self.cursor_blink = cursor_blink

    def edit(self, edit: Edit):
        """Every insert, paste and replace comes through here: keep controls out."""
        edit.text = box_text(edit.text)
        return super().edit(edit)

    def load_text(self, text: str) -> None:
        super().load_text(box_text(text))

    async def _on_key(self, event: events.Key) -> None:
        keys = {event.key, *event.aliases}
        if "enter" in keys and event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if keys & NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)
