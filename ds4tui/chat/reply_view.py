"""What the chat shows of a reply: its reasoning, its answer and the tool calls it made.

Owns: `ReplyView` (the three parts of one assistant message, for a reply read back from
the history), `view_of` (a stored reply's text split into them), and `ReplySplitter`,
which sits between a turn and the screen: the turn streams the model's raw text
(`TokenText`, `<think>` tags and call markup included, as the session and the history
keep it), and the splitter hands on `ReasoningText` and `TokenText` for the answer as they
come, and one `ToolCallShown` per call when the reply ends. The parsing is the server's
(engine/text/reply_parts.py: the same syntax per template, the same rule that text that
does not parse as a call stays in the answer). Leaves to the screen how each part looks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds4tui.chat.events import Cancelled, ChatError, ChatEvent, Done, ReasoningText, TokenText, ToolCallShown
from ds4tui.engine.text.reply_parts import ReplyParser, opens_think, syntax_of


@dataclass(frozen=True)
class ReplyView:
    content: str
    reasoning: str = ""
    calls: tuple[ToolCallShown, ...] = ()


@dataclass(frozen=True)
class ReplyFormat:
    """How a model's replies are split: its template's tool-call syntax (None: calls are not
    looked for) and whether its generation prompt opens a think block."""

    syntax: str | None = None
    in_think: bool = False

    @classmethod
    def of(cls, template) -> ReplyFormat:
        return cls(syntax_of(getattr(template, "source", None)), opens_think(template))

    def parser(self) -> ReplyParser:
        return ReplyParser(self.syntax, in_think=self.in_think)


def view_of(text: str, fmt: ReplyFormat = ReplyFormat()) -> ReplyView:
    """A whole reply's text split into reasoning, answer and calls."""
    parser = fmt.parser()
    pieces = parser.feed(text) + parser.finish()
    reasoning = "".join(t for k, t in pieces if k == "reasoning")
    content = "".join(t for k, t in pieces if k == "content")
    calls = tuple(ToolCallShown(c.name, c.arguments) for c in parser.calls)
    return ReplyView(content, reasoning.strip("\n"), calls)


class ReplySplitter:
    """Wraps a turn's event callback: reply text goes through a ReplyParser; every other event
    passes as it is, after what the parser still held when the reply ends (Done, a cancel,
    an error)."""

    def __init__(self, on_event, fmt: ReplyFormat) -> None:
        self._on_event = on_event
        self._fmt = fmt
        self._parser: ReplyParser | None = None

    def __call__(self, event: ChatEvent) -> None:
        if isinstance(event, TokenText):
            if self._parser is None:
                self._parser = self._fmt.parser()
            self._pass(self._parser.feed(event.text))
            return
        if isinstance(event, (Done, Cancelled, ChatError)):
            self.finish()
        self._on_event(event)

    def finish(self) -> None:
        """The reply ended: release the rest and the calls."""
        if self._parser is None:
            return
        parser, self._parser = self._parser, None
        self._pass(parser.finish())
        for call in parser.calls:
            self._on_event(ToolCallShown(call.name, call.arguments))

    def _pass(self, pieces: list[tuple[str, str]]) -> None:
        for kind, text in pieces:
            if text:
                self._on_event(ReasoningText(text) if kind == "reasoning" else TokenText(text))
