"""The message box and the one-line dialog box keep terminal controls out: a pasted (or loaded)
ESC sequence, BEL or bidi override is held, and sent, as its visible escape, so it can neither
restyle the screen nor reorder it."""

from __future__ import annotations

import re

from textual import events
from textual.app import App, ComposeResult

from ds4tui.screens.widgets.prompt_dialog import OneLineInput, PromptDialog
from ds4tui.screens.widgets.prompt_input import PromptInput

CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
PASTE = "ls output: \x1b[31mred\x1b[0m bell\x07 \u202eabc\r\nnext line\ttab 中文 😀"


class BoxHost(App):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def compose(self) -> ComposeResult:
        yield PromptInput(cursor_blink=False)

    def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        self.sent.append(message.text)


def _drawn(box: PromptInput) -> str:
    return "".join(segment.text for y in range(box.size.height) for segment in box.render_line(y))


async def test_pasted_controls_are_held_as_visible_escapes():
    app = BoxHost()
    async with app.run_test(size=(60, 10)) as pilot:
        box = app.query_one(PromptInput)
        box.focus()
        app.post_message(events.Paste(PASTE))  # as the driver delivers a terminal paste
        await pilot.pause()
        assert box.text == "ls output: \\e[31mred\\e[0m bell\\x07 \\u202eabc\nnext line\ttab 中文 😀"
        assert not CONTROLS.search(_drawn(box))
        await pilot.press("enter")
        assert app.sent == [box.text]


async def test_loaded_and_inserted_text_is_kept_clean_too():
    """An edit loads a stored message (it may come from a file); keys insert through the same door."""
    app = BoxHost()
    async with app.run_test(size=(60, 10)) as pilot:
        box = app.query_one(PromptInput)
        box.load_text("from a file \x1b]0;title\x07 end")
        assert box.text == "from a file \\e]0;title\\x07 end"
        box.focus()
        box.move_cursor(box.document.end)
        box.insert("\x9b")
        await pilot.press("x")
        assert not CONTROLS.search(box.text) and box.text.endswith("\\x9bx")


class DialogHost(App):
    def __init__(self, value: str) -> None:
        super().__init__()
        self.value = value
        self.answers: list[str | None] = []

    def on_mount(self) -> None:
        self.push_screen(PromptDialog("Rename chat:", self.value), self.answers.append)


async def test_a_title_from_a_file_reaches_the_rename_box_escaped():
    """The rename dialog starts from a title that may come from a file (a ds4 cache, a hostile .kv)."""
    app = DialogHost("Evil \x1b[2J title\u202e")
    async with app.run_test(size=(80, 12)) as pilot:
        box = app.screen.query_one(OneLineInput)
        assert "Enter saves · Escape cancels" in str(app.screen.query_one(".hint").render())
        assert box.value == "Evil \\e[2J title\\u202e"
        assert not CONTROLS.search("".join(s.text for y in range(box.size.height) for s in box.render_line(y)))
        app.post_message(events.Paste("\x07 more"))
        await pilot.pause()
        await pilot.press("enter")
        assert app.answers and not CONTROLS.search(app.answers[0]) and app.answers[0].endswith("\\x07 more")
