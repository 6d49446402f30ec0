"""The message box: a TextArea where Enter sends and ctrl+j (or shift+enter) starts a new line.

Owns: those keys and the `Submitted` message. Leaves to the screen: what
sending means, and whether a send is allowed right now.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

# Keys that insert a newline instead of sending. Terminals send LF for ctrl+j;
# shift+enter and alt+enter arrive as their own keys only where the terminal
# reports them (kitty keyboard protocol, some xterm modes).
NEWLINE_KEYS = frozenset({"ctrl+j", "newline", "shift+enter", "alt+enter"})


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
        super().__init__(text, soft_wrap=True, tab_behavior="focus", show_line_numbers=False,
                         name=name, id=id, classes=classes, disabled=disabled, placeholder=placeholder)
        self.cursor_blink = cursor_blink

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
