"""The block of a streaming reply still being written, drawn as Markdown in one renderable.

Owns: turning that block (a paragraph, a list, a table, a code fence not closed yet) into
one Rich renderable for the reply's `.tail` Static. Why Rich's Markdown and not Textual's
widget: the tail changes ten times a second, and Textual's Markdown builds a widget per
block (and per list item, table cell, fence line), which makes the screen lay itself out
again on every update (docs/perf-archive.md, "Streaming in the app"); one Static holding
one renderable costs a parse of the open block only. An unclosed fence runs to the end of
the text for markdown-it, and a table is a table once its delimiter row is there, so both
render as they grow. The finished reply is Textual's Markdown as before.
The text reaching here is `safe_lines`'d already; links are not made hyperlinks (no OSC 8
from a model's text).
"""

from __future__ import annotations

import time

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markdown import CodeBlock, Markdown, TableElement
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.style import Style as RichStyle
from rich.text import Text
from textual.content import Content, Span
from textual.style import Style

from ds4tui.format.display import one_line

CODE_THEME = "monokai"  # the finished reply's fences (Textual's default highlighting) look close


class _FramedCode(CodeBlock):
    """A fence as the finished reply shows it: a rounded frame, the language on it, lines wrapped."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        code = str(self.text).rstrip("\n")
        syntax = Syntax(code, self.lexer_name, theme=self.theme, word_wrap=True, background_color="default")
        label = one_line(self.lexer_name if self.lexer_name != "text" else "", 24) or "code"
        yield Panel(syntax, box=box.ROUNDED, title=Text(label, "dim"), title_align="left",
                    border_style="dim", padding=(0, 1))


class _GridTable(TableElement):
    """A table ruled as the finished reply's (Textual's MarkdownTable): every cell boxed, the
    header bold, so a table does not change its look when it is done."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = Table(box=box.SQUARE, show_lines=True, border_style="dim", header_style="bold")
        if self.header is not None and self.header.row is not None:
            for cell in self.header.row.cells:
                table.add_column(cell.content.copy())
        if self.body is not None:
            for row in self.body.rows:
                table.add_row(*(cell.content for cell in row.cells))
        yield table


class TailMarkdown(Markdown):
    elements = {**Markdown.elements, "fence": _FramedCode, "code_block": _FramedCode, "table_open": _GridTable}


def tail_renderable(block: str) -> RenderableType:
    """The Markdown renderable of the unfinished `block` (already made safe)."""
    return TailMarkdown(block, code_theme=CODE_THEME, hyperlinks=False)


def _console(width: int) -> Console:
    return Console(width=width, color_system="truecolor", force_terminal=True, legacy_windows=False,
                   highlight=False, emoji=False, markup=False)


def _open_fence(block: str) -> tuple[str, str] | None:
    """(language, code so far) when `block` is a code fence still being written. The tail
    starts where a block starts, so a fence's opening line is its first line; a last line of
    backticks or tildes only is its closing line arriving, not code."""
    first, _, rest = block.partition("\n")
    opening = first.lstrip(" ")
    if len(first) - len(opening) > 3 or opening[:3] not in ("```", "~~~"):
        return None
    marker = opening[0]
    language = opening.lstrip(marker).strip().split(" ", 1)[0]
    head, _, last = rest.rpartition("\n")
    if last and not last.strip(marker + " "):
        rest = head
    return language, rest


class FenceHighlight:
    """The highlighted lines of the fence being streamed, lexed again only when lines were
    completed and at most every `interval` seconds (Pygments takes ~0.1 ms a line, per
    update, for the whole fence); lines past the last lexing show plain until the next."""

    def __init__(self, interval: float = 0.5, clock=time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._key: tuple[str, str] | None = None  # (language, code lexed)
        self._lines: list[Text] = []
        self._at = float("-inf")

    def lines(self, language: str, code: str) -> list[Text]:
        done, _, _partial = code.rpartition("\n")
        key = self._key
        fresh = key is not None and key[0] == language and code.startswith(key[1])
        if not fresh or (done != key[1] and self._clock() - self._at >= self._interval):
            lexed = Syntax(done, language or "text", theme=CODE_THEME, background_color="default").highlight(done)
            if lexed.plain.endswith("\n") and not done.endswith("\n"):
                lexed.right_crop(1)  # the newline Rich adds, not a line of the code
            self._lines = list(lexed.split("\n", allow_blank=True)) if done else []
            if self._lines and done.endswith("\n"):
                self._lines.pop()  # split's empty piece after the last newline
            self._key, self._at = (language, done), self._clock()
            key = self._key
        # The code's lines (an empty last one is a line not begun: not shown), the lexed ones
        # highlighted, any after them plain until the next lexing.
        lines = code.split("\n")
        if lines[-1] == "":
            lines.pop()
        lexed = self._lines[: len(lines)]
        return lexed + [Text(line) for line in lines[len(lexed):]]


def _fence_text(language: str, code: str, width: int, highlight: FenceHighlight | None = None) -> Text:
    """A fence as the finished reply frames it (widgets/chat_log.ReplyFence): a rounded frame,
    the language on it, the code highlighted, long lines wrapped. Drawn by hand, not by Rich's
    Panel and Syntax, which wrap line by line: 60 ms against 5 for a 40-line fence."""
    width = max(width, 12)
    inner = width - 4
    label = one_line(language, 24) or "code"
    out = Text(no_wrap=True, overflow="crop", end="")
    out.append("╭─ ", "dim")
    out.append(label, "dim")
    out.append(" " + "─" * max(width - len(label) - 5, 0) + "╮", "dim")
    console = None
    for line in (highlight or FenceHighlight()).lines(language, code):
        pieces = [line]
        if line.cell_len > inner:
            console = console or _console(inner)
            pieces = list(line.wrap(console, inner))
        for piece in pieces:
            out.append("\n│ ", "dim")
            out.append_text(piece)
            out.append(" " * max(inner - piece.cell_len, 0) + " │", "dim")
    out.append("\n╰" + "─" * (width - 2) + "╯", "dim")
    return out


def tail_text(block: str, width: int, highlight: FenceHighlight | None = None) -> Text:
    """The unfinished `block` drawn as Markdown at `width` columns, as styled lines, drawn once
    per update (a Static would draw a Markdown renderable several times a frame: measuring
    its width, its height, then the lines)."""
    if not block:
        return Text("")
    fence = _open_fence(block)
    if fence is not None:
        return _fence_text(*fence, width, highlight)
    console = _console(max(width, 8))
    lines = console.render_lines(tail_renderable(block), console.options.update(height=None), pad=False)
    while lines and not "".join(segment.text for segment in lines[0]).strip():
        lines.pop(0)  # Rich opens some blocks (a table) with a blank line
    out = Text(no_wrap=True, overflow="crop", end="")
    for i, line in enumerate(lines):
        if i:
            out.append("\n")
        for segment in line:
            if not segment.control:
                out.append(segment.text, segment.style)
    out.rstrip()
    return out


_STYLES: dict[RichStyle | str, Style] = {}  # the few styles of a tail (a theme's tokens, "dim")


def as_content(text: Text) -> Content:
    """`text` as Textual content, each Rich style converted once per run: the conversion a
    Static makes of a Rich Text was most of a streaming fence's cost per update (a span per token)."""
    spans = []
    for start, end, style in text.spans:
        converted = _STYLES.get(style)
        if converted is None:
            rich = RichStyle.parse(style) if isinstance(style, str) else style
            converted = _STYLES.setdefault(style, Style.from_rich_style(rich))
        spans.append(Span(start, end, converted))
    return Content(text.plain, spans)
