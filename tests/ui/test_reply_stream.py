"""A streaming reply: finished Markdown blocks above, the block being written drawn as Markdown
by one renderable (an open fence framed, a table as a table) below them."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from ds4tui.format.display import safe_lines
from ds4tui.screens.widgets.chat_log import AssistantMessage, ChatLog, FinishedBlocks, ReplyMarkdown
from ds4tui.screens.widgets.reply_tail import FenceHighlight, tail_text

REPLY = (
    "Here are the facts:\n\n"
    "1. Paris is the **capital**.\n"
    "2. It has `museums`.\n\n"
    "Some code:\n\n"
    "```python\n"
    "def f():\n"
    "\n"
    "    return 1\n"
    "```\n"
    "After the fence.\n\n"
    "~~~\n"
    "``` inside a tilde fence\n"
    "~~~\n\n"
    "The end, with [b]markup[/b] and an escape \x1b[31m."
)


def _ends(text: str, piece: int) -> list[int]:
    """end_of_finished after each piece of `piece` characters."""
    blocks = FinishedBlocks()
    return [blocks.end_of_finished(text[: k + piece]) for k in range(0, len(text), piece)]


def _after(piece: str) -> int:
    return REPLY.index(piece) + len(piece)


def test_finished_blocks_end_at_blank_lines_and_closing_fences():
    expected = [
        _after("facts:\n\n"),
        _after("`museums`.\n\n"),
        _after("Some code:\n\n"),
        _after("return 1\n```\n"),  # the closing fence; not the blank line inside the fence
        _after("After the fence.\n\n"),
        _after("tilde fence\n~~~\n"),  # a ``` line does not close a ~~~ fence
        _after("tilde fence\n~~~\n\n"),
    ]
    assert sorted(set(_ends(REPLY, 1)) - {0}) == expected


def test_finished_blocks_do_not_depend_on_how_the_text_arrives():
    whole = _ends(REPLY, len(REPLY))[-1]
    for piece in (1, 2, 3, 7, 40):
        assert _ends(REPLY, piece)[-1] == whole


def test_a_line_is_read_once_and_an_unfinished_line_waits():
    blocks = FinishedBlocks()
    assert blocks.end_of_finished("para one\n") == 0
    assert blocks.end_of_finished("para one\n  ") == 0  # a blank line needs its newline
    assert blocks.end_of_finished("para one\n  \n") == len("para one\n  \n")
    assert blocks.end_of_finished("para one\n  \n```\n\n") == len("para one\n  \n")  # a fence is open


def _tail_shows(reply: AssistantMessage, block: str) -> bool:
    """The tail shows `block` (made safe) drawn as Markdown for the reply's width."""
    tail = reply.query_one(".tail", Static)
    drawn = tail_text(safe_lines(block), reply.content_region.width, FenceHighlight())
    return tail.display and tail.visual.plain == drawn.plain  # type: ignore[union-attr]


def _shown(widget) -> list[str]:
    """The widget's lines as drawn on screen."""
    return [strip.text.rstrip() for strip in widget.render_lines(widget.content_region.reset_offset)]


async def test_an_open_fence_and_a_table_render_while_they_stream():
    """Issue 34: a fence or a table showed raw ("```python", "|---|") until it closed."""
    app = ReplyHost()
    async with app.run_test(size=(80, 30)) as pilot:
        reply = AssistantMessage()
        await app.query_one(ChatLog).mount(reply)
        reply.append("Code:\n\n```python\ndef f(x):\n    return x + 1")  # the fence still open
        await pilot.pause()
        markdown, tail = reply.query_one(ReplyMarkdown), reply.query_one(".tail", Static)
        assert markdown.source == "Code:\n\n"  # the finished paragraph only: the Markdown is not redone
        lines = _shown(tail)
        assert lines[0].startswith("╭─ python ─") and "```" not in "".join(lines)
        assert any("def f(x):" in line for line in lines) and lines[-1].startswith("╰")
        reply.append("\n```\n\n| city | people |\n|---|---|\n| Paris | 2.1M |\n| Lyon")
        await pilot.pause()
        assert markdown.source.endswith("return x + 1\n```\n\n")  # the closed fence joined the Markdown
        lines = _shown(tail)
        text = "\n".join(lines)
        assert "|---|" not in text and "| Paris |" not in text
        assert lines[0].startswith("┌") and any("city" in line and "people" in line for line in lines)
        assert any("Paris" in line and "2.1M" in line for line in lines) and "Lyon" in text
        reply.finish()
        await pilot.pause()
        assert not tail.display and reply.query_one(ReplyMarkdown).query("MarkdownTable")


class ReplyHost(App):
    def compose(self) -> ComposeResult:
        yield ChatLog()


async def _render_blocks(app: App, text: str) -> list[str]:
    """The block widget types the reply's Markdown makes of `text` in one go."""
    md = ReplyMarkdown(text)
    await app.query_one(ChatLog).mount(md)
    await md.update(text)
    kinds = [type(child).__name__ for child in md.children]
    await md.remove()
    return kinds


@pytest.mark.parametrize("piece", [1, 5, 23])
async def test_streamed_reply_ends_as_the_same_markdown(piece):
    app = ReplyHost()
    async with app.run_test(size=(80, 40)) as pilot:
        reply = AssistantMessage()
        await app.query_one(ChatLog).mount(reply)
        markdown, tail = reply.query_one(ReplyMarkdown), reply.query_one(".tail", Static)
        for k in range(0, len(REPLY), piece):
            reply.append(REPLY[k : k + piece])
            await pilot.pause()
            shown = len(markdown.source)
            assert REPLY[: k + piece].startswith(markdown.source)  # only finished blocks are Markdown
            block = REPLY[shown : k + piece].lstrip("\n")
            if block:  # the rest is drawn as Markdown in the tail, escaped
                assert _tail_shows(reply, block)
        assert markdown.source == REPLY[: REPLY.rindex("~~~\n\n") + 5]
        assert "The end" in tail.visual.plain and "[b]markup[/b]" in tail.visual.plain  # type: ignore[union-attr]
        reply.finish()
        await pilot.pause()
        assert reply.text == REPLY and markdown.source == REPLY.replace("\x1b", "\\e")  # escaped for the screen
        assert not tail.display
        assert [type(c).__name__ for c in markdown.children] == await _render_blocks(app, reply.text)


async def test_set_text_replaces_a_reply_mid_stream():
    app = ReplyHost()
    async with app.run_test(size=(80, 24)) as pilot:
        reply = AssistantMessage()
        await app.query_one(ChatLog).mount(reply)
        reply.append("First paragraph.\n\nSecond, unfinished")
        await pilot.pause()
        reply.set_text("Another version.")
        await pilot.pause()
        assert reply.query_one(ReplyMarkdown).source == "Another version."
        assert not reply.query_one(".tail", Static).display
        reply.append("\n\nMore.")  # a later append continues from the new text
        reply.finish()
        await pilot.pause()
        assert reply.query_one(ReplyMarkdown).source == "Another version.\n\nMore."
