"""A reply's reasoning and tool calls on screen, beside its answer.

Owns: `ReasoningFold` (the model's reasoning, folded by default: a one-line title that says
how long it is, opened with Enter or a click) and `ToolCallsBlock` (each call the reply
made as a framed block: the function's name on the frame, its arguments as indented JSON).
Both are given text already split by the chat layer (chat/reply_view.py, through the
`ReasoningText` and `ToolCallShown` events or a stored reply's `ReplyView`): nothing here
parses the model's output. Text reaches the screen as `rich.text.Text` after
`format.display.safe_lines`, never as markup.
"""

from __future__ import annotations

import json

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import Collapsible, Static

from ds4tui.format.display import one_line, safe_lines


def _words(text: str) -> int:
    return len(text.split())


class ReasoningFold(Collapsible):
    """The reply's reasoning, collapsed; hidden while there is none."""

    DEFAULT_CSS = """
    ReasoningFold {
        border: none;
        padding: 0;
        margin: 0 0 1 0;  /* a blank line before the answer; aligned with it */
        background: transparent;
        &.-empty { display: none; }
        & > Contents { padding: 0 1 0 2; }
        & > Contents > Static { color: $text-muted; text-style: italic; }
        & > CollapsibleTitle { color: $text-muted; padding: 0; }
    }
    """

    def __init__(self, text: str = "") -> None:
        self._body = Static(Text(safe_lines(text)), classes="reasoning-text")
        super().__init__(self._body, title=self._heading(text, streaming=False), collapsed=True,
                         classes="" if text else "-empty")
        self.text = text
        self._streaming = False

    @staticmethod
    def _heading(text: str, streaming: bool) -> str:
        n = _words(text)
        return f"{'Thinking…' if streaming else 'Reasoning'} ({n:,} word{'s' if n != 1 else ''})"

    def append(self, text: str) -> None:
        """More reasoning streamed in (the title counts it; the fold stays as the user left it)."""
        self._streaming = True
        self.set_text(self.text + text, streaming=True)

    def set_text(self, text: str, streaming: bool = False) -> None:
        self.text = text
        self._streaming = streaming
        self._body.update(Text(safe_lines(text.strip("\n"))))
        self.title = self._heading(text, streaming)
        self.set_class(not text.strip(), "-empty")

    def finish(self) -> None:
        if self._streaming:
            self.set_text(self.text)


def call_text(name: str, arguments: str) -> Text:
    """A call's arguments as indented JSON (as the model wrote them when they are not JSON)."""
    try:
        shown = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        shown = arguments
    return Text(safe_lines(shown))


class ToolCallsBlock(Vertical):
    """The tool calls a reply made: one framed block each. Hidden while there are none."""

    DEFAULT_CSS = """
    ToolCallsBlock {
        height: auto;
        margin: 0;
        &.-empty { display: none; }
    }
    ToolCallsBlock > .call {
        border: round $secondary;
        border-title-align: left;
        border-title-color: $secondary;
        padding: 0 1;
        height: auto;
    }
    """

    def __init__(self, calls: tuple = ()) -> None:
        super().__init__(classes="-empty")
        self.calls: list[tuple[str, str]] = []
        self._initial = tuple(calls)

    def on_mount(self) -> None:
        for name, arguments in self._initial:
            self.add_call(name, arguments)

    def add_call(self, name: str, arguments: str) -> None:
        self.calls.append((name, arguments))
        block = Static(call_text(name, arguments), classes="call")
        block.border_title = Text(f"tool call: {one_line(name, 48)}")
        self.mount(block)
        self.remove_class("-empty")

    def set_calls(self, calls) -> None:
        self.calls = []
        self.remove_children()
        self.add_class("-empty")
        for name, arguments in calls:
            self.add_call(name, arguments)
