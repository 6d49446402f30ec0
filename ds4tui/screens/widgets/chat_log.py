"""One conversation on screen: user turns as plain text, assistant turns as Markdown.

Owns: the message widgets, appending streamed text, the per-turn stats line
and inline errors. All text goes through `format.display.safe_lines` and reaches the
screen as `rich.text.Text` or Markdown source, never as Rich markup, so a
transcript read from a file cannot style or break the screen.
Leaves to the screen: which conversation is shown and when text arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownFence

from ds4tui.format.display import one_line, safe_lines
from ds4tui.screens.widgets.reply_parts import ReasoningFold, ToolCallsBlock
from ds4tui.screens.widgets.reply_tail import FenceHighlight, as_content, tail_text


@dataclass
class MessageAction(Message):
    """An action asked on a message (its key, or its menu): "menu", "copy", "code" (pick a
    code block), "code:N" (copy block N), "edit", "fork", "regenerate", "prev", "next"."""

    action: str
    widget: Widget


MENU_MARK = "⋯"  # at each message's top right: a click there opens its menu
SELECTED_HINT = "enter/⋯ actions · y copy · f fork"  # under the selected message, on its frame

# Every message has a frame; unselected it is blank (so selecting moves nothing), selected it
# is drawn in the warning colour: a selection seen at a glance, not one background shade.
_FRAME_CSS = """
    border: blank;
    border-title-align: right;
    border-title-color: $text-muted;
    border-subtitle-align: right;
    border-subtitle-color: $warning;
    &:focus, &.-menu-open { border: round $warning; border-title-color: $warning; }
"""


class SelectableMessage:
    """Tab or a click selects a message; its keys act on it (the screen does the work).
    Enter, a right-click or a click on its ⋯ opens its menu; ↑/↓ select the neighbours."""

    can_focus = True

    def _ask(self, action: str) -> None:
        self.post_message(MessageAction(action, self))  # type: ignore[arg-type]

    def action_ask(self, action: str) -> None:
        self._ask(action)

    def action_select_next(self, step: int) -> None:
        """Select the message `step` away (↑ -1, ↓ +1), if there is one."""
        siblings = [w for w in self.parent.children if isinstance(w, SelectableMessage)]  # type: ignore[attr-defined]
        i = siblings.index(self) + step
        if 0 <= i < len(siblings):
            siblings[i].focus()

    def on_focus(self) -> None:
        self.border_subtitle = SELECTED_HINT  # type: ignore[attr-defined]

    def on_blur(self) -> None:
        self.border_subtitle = ""  # type: ignore[attr-defined]

    def on_click(self, event) -> None:
        width = self.outer_size.width  # type: ignore[attr-defined]
        on_mark = event.y == 0 and event.x >= width - 5
        if event.button == 3 or on_mark:
            event.stop()
            self.focus()  # type: ignore[attr-defined]
            self._ask("menu")


_MESSAGE_KEYS = [Binding("enter", "ask('menu')", "Actions"), Binding("y", "ask('copy')", "Copy"),
                 Binding("f", "ask('fork')", "Fork here"),
                 Binding("up", "select_next(-1)", "Previous message", show=False),
                 Binding("down", "select_next(1)", "Next message", show=False)]


class UserMessage(SelectableMessage, Static):
    """What the user sent, verbatim."""

    DEFAULT_CSS = f"""
    UserMessage {{
        padding: 0 1;
        background: $boost;
        {_FRAME_CSS}
        border-left: thick $accent;
        &:focus, &.-menu-open {{ border-left: round $warning; }}
    }}
    """
    BINDINGS = [*_MESSAGE_KEYS, Binding("e", "ask('edit')", "Edit & resend")]

    def __init__(self, text: str) -> None:
        super().__init__(Text(safe_lines(text)))
        self.text = text
        self.border_title = MENU_MARK


class ReplyFence(MarkdownFence):
    """A code block in a reply: framed, its language on the frame, long lines wrapped (a cut
    line hides code; the fence's own sideways scroll has no bar and no key)."""

    DEFAULT_CSS = """
    ReplyFence {
        overflow: hidden hidden;
        border: round $foreground 25%;
        border-title-align: left;
        border-title-color: $text-muted;
        padding: 0;
        & > Label { width: 100%; padding: 0 1; text-wrap: wrap; }
    }
    """

    @property
    def allow_horizontal_scroll(self) -> bool:
        return False

    def on_mount(self) -> None:
        self._label_language()

    async def _update_from_block(self, block) -> None:
        await super()._update_from_block(block)
        self._label_language()

    def _label_language(self) -> None:
        self.border_title = Text(one_line(self.lexer, 24) or "code")


class ReplyMarkdown(Markdown):
    """Markdown with framed, labelled, wrapped code blocks."""

    BLOCKS = {**Markdown.BLOCKS, "fence": ReplyFence, "code_block": ReplyFence}


class FinishedBlocks:
    """Where a streaming reply's finished Markdown blocks end: after a blank line, or after
    the line that closes a code fence. Reads each line once (`end_of_finished` is called
    with the whole reply after every append)."""

    def __init__(self, start: int = 0) -> None:
        self._next_line = start  # where the first line not yet read starts
        self._fence = ""  # the open fence's marker ("```", "~~~"), "" outside one
        self.end = start  # the finished blocks are text[:end]

    def end_of_finished(self, text: str) -> int:
        while (newline := text.find("\n", self._next_line)) >= 0:
            line = text[self._next_line : newline]
            self._next_line = newline + 1
            marker = line.lstrip(" ")[:3] if len(line) - len(line.lstrip(" ")) <= 3 else ""
            if self._fence:
                if marker == self._fence:
                    self._fence, self.end = "", self._next_line
            elif marker in ("```", "~~~"):
                self._fence = marker
            elif not line.strip():
                self.end = self._next_line
        return self.end


class AssistantMessage(SelectableMessage, Vertical):
    """The model's reply: Markdown (code blocks highlighted) that grows as tokens stream in.

    While it streams, finished blocks go to the Markdown widget and the block still being
    written is drawn below it (`.tail`) as Markdown in one Static (widgets/reply_tail.py: an
    open fence framed and highlighted, a table as a table), then joins the Markdown widget
    once a blank line or a closing fence ends it, or the reply ends (`finish`). Why: Textual's
    `Markdown.append` rebuilds the last block's widgets (a whole list, every item) and the
    screen's layout on every append; at ten appends a second that kept one of the two cores
    busy and halved the decode beside it in a long reply (docs/perf-archive.md, "Streaming in
    the app"); the tail is one widget whatever it holds."""

    BINDINGS = [*_MESSAGE_KEYS, Binding("left", "ask('prev')", "Prev version"),
                Binding("right", "ask('next')", "Next version"), Binding("c", "ask('code')", "Copy code")]

    DEFAULT_CSS = f"""
    AssistantMessage {{
        height: auto;
        padding: 0 1;
        {_FRAME_CSS}
        & > ReplyMarkdown {{ margin: 0; padding: 0 0; }}
        & > .tail {{ padding: 0 0; height: auto; text-wrap: nowrap; text-overflow: clip; }}
        & > .tail.-empty {{ display: none; }}
        & > .stats {{ color: $text-muted; padding: 0 0; height: auto; }}
        & > .stats.-empty {{ display: none; }}
    }}
    """

    def __init__(self, text: str = "", stats: str = "", *, reasoning: str = "", calls: tuple = ()) -> None:
        """text: the answer (Markdown); reasoning and calls (name, arguments) as the chat layer
        split them from the model's text (reasoning folded above the answer, calls below)."""
        super().__init__()
        self._initial = text
        self._initial_stats = stats
        self._initial_parts = (reasoning, tuple(calls))
        self.text = text
        self._blocks = FinishedBlocks(len(text))  # text[:_blocks.end] is in the Markdown widget
        self._tail = ""  # the unfinished block shown in .tail
        self._fence = FenceHighlight()  # its highlighted lines, when it is a code fence
        self.border_title = MENU_MARK

    def compose(self) -> ComposeResult:
        reasoning, calls = self._initial_parts
        yield ReasoningFold(reasoning)
        yield ReplyMarkdown(safe_lines(self._initial))
        yield Static(Text(""), classes="tail -empty")
        yield ToolCallsBlock(calls)
        yield Static(Text(self._initial_stats), classes="stats" if self._initial_stats else "stats -empty")

    @property
    def reasoning(self) -> str:
        return self.query_one(ReasoningFold).text

    def append_reasoning(self, text: str) -> None:
        """Streamed reasoning (folded: the title counts its words)."""
        self.query_one(ReasoningFold).append(text)

    def add_tool_call(self, name: str, arguments: str) -> None:
        self.query_one(ToolCallsBlock).add_call(name, arguments)

    def set_parts(self, text: str, reasoning: str = "", calls: tuple = ()) -> None:
        """Replace the whole reply (another version of it): answer, reasoning and calls."""
        self.set_text(text)
        self.query_one(ReasoningFold).set_text(reasoning)
        self.query_one(ToolCallsBlock).set_calls(calls)

    def append(self, text: str) -> None:
        """Add streamed text (whole characters, as the controller sends them)."""
        self.text += text
        shown = self._blocks.end
        end = self._blocks.end_of_finished(self.text)
        if end > shown:
            self.query_one(ReplyMarkdown).append(safe_lines(self.text[shown:end]))
        self._show_tail(self.text[end:].lstrip("\n"))

    def finish(self) -> None:
        """The reply is complete: its last block becomes Markdown too."""
        if len(self.text) > self._blocks.end:
            self.query_one(ReplyMarkdown).append(safe_lines(self.text[self._blocks.end :]))
        self._blocks = FinishedBlocks(len(self.text))
        self._show_tail("")
        self.query_one(ReasoningFold).finish()

    def set_text(self, text: str) -> None:
        """Replace the whole reply (another version of it)."""
        self.text = text
        self.query_one(Markdown).update(safe_lines(text))
        self._blocks = FinishedBlocks(len(text))
        self._show_tail("")

    def _show_tail(self, tail: str) -> None:
        widget = self.query_one(".tail", Static)
        self._tail = tail
        if not tail:
            self._fence = FenceHighlight()  # the next open fence is lexed from its start
        width = self.content_region.width
        if not width and tail:  # not laid out yet: drawn for its width once it is
            self.call_after_refresh(self._redraw_tail)
        widget.update(as_content(tail_text(safe_lines(tail), width or self.app.size.width, self._fence)))
        widget.set_class(not tail, "-empty")

    def on_resize(self) -> None:
        self._redraw_tail()  # drawn for a width: drawn again for the new one

    def _redraw_tail(self) -> None:
        if self._tail and self.content_region.width:
            self._show_tail(self._tail)

    def set_stats(self, line: str) -> None:
        stats = self.query_one(".stats", Static)
        stats.update(Text(line))
        stats.set_class(not line, "-empty")


class NoticeLine(Static):
    """An inline note in the conversation (an error, a cancelled turn)."""

    DEFAULT_CSS = """
    NoticeLine {
        margin: 1 0 0 0;
        padding: 0 1;
        color: $text-muted;
        &.-error { color: $error; }
    }
    """

    def __init__(self, text: str, *, error: bool = False, id: str | None = None) -> None:
        super().__init__(Text(safe_lines(text)), classes="-error" if error else "", id=id)


class ChatLog(VerticalScroll):
    """The scrolling list of one conversation's messages.

    Follows the newest text (Textual's anchor) until the user scrolls up to read; from
    then on new text does not move the view, and `reading_above` is True until the user
    is back at the bottom (PageDown, End, the wheel) or sends a message (`follow`).
    Posts `AtBottom` when the view reaches the bottom again, so the pane can drop its
    "new reply" marker."""

    DEFAULT_CSS = """
    ChatLog {
        height: 1fr;
        padding: 0 1 1 1;
    }
    """

    class AtBottom(Message):
        """The view is at the newest text again."""

    def on_mount(self) -> None:
        self.anchor()

    def follow(self) -> None:
        """Jump to the newest text and follow it again."""
        self.anchor()

    @property
    def reading_above(self) -> bool:
        """The user scrolled away from the newest text (and new text will not move the view).

        Asked of the anchor, not of the geometry: while text streams in, the content grows a
        frame before the anchor scrolls to it, and the gap would read as the user scrolling up.
        Textual releases the anchor on a user's scroll and restores it at the bottom."""
        return self.is_anchored and self._anchor_released

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y - 1 and old_value < new_value:
            self.post_message(self.AtBottom())

    def add_user(self, text: str) -> UserMessage:
        message = UserMessage(text)
        self.mount(message)
        return message

    def add_assistant(self, text: str = "", stats: str = "", *, reasoning: str = "",
                      calls: tuple = ()) -> AssistantMessage:
        message = AssistantMessage(text, stats, reasoning=reasoning, calls=calls)
        self.mount(message)
        return message

    def add_notice(self, text: str, *, error: bool = False) -> NoticeLine:
        notice = NoticeLine(text, error=error)
        self.mount(notice)
        return notice

    def show_messages(self, messages: list[dict], last_stats: str = "", notes: dict[int, str] | None = None) -> None:
        """Fill the log from a transcript (a resumed session): user and assistant turns only;
        `last_stats` goes under the last message when it is a reply (how that reply ended),
        `notes[i]` under the reply at messages[i] (where it stands among its versions)."""
        for i, message in enumerate(messages):
            if message.get("role") == "user":
                self.add_user(str(message.get("content", "")))
            elif message.get("role") == "assistant":
                note = (notes or {}).get(i, "")
                if i == len(messages) - 1 and last_stats:
                    note = f"{last_stats} · {note}" if note else last_stats
                # "reasoning" and "tool_calls" as the chat layer split them (screens: _shown)
                calls = tuple((c["name"], c["arguments"]) for c in message.get("tool_calls") or ())
                self.add_assistant(str(message.get("content", "")), note,
                                   reasoning=str(message.get("reasoning") or ""), calls=calls)

    def messages(self) -> list[Widget]:
        """The user and assistant message widgets, in order (conv.visible_messages() order)."""
        return [w for w in self.children if isinstance(w, (UserMessage, AssistantMessage))]

    @property
    def last_assistant(self) -> AssistantMessage | None:
        found = self.query(AssistantMessage)
        return found.last() if found else None
