"""The transcript follows a streaming reply unless the user is reading above; then a marker says
there is a new reply, and PageDown (or sending) brings the view back to it."""

from __future__ import annotations

from textual.app import App, ComposeResult

from ds4tui.screens.widgets.chat_pane import ChatPane
from tests.ui.chat_app import ChatHost, chat_config, send


class PaneHost(App):
    def compose(self) -> ComposeResult:
        yield ChatPane("c1")


async def _long_transcript(pilot) -> ChatPane:
    pane = pilot.app.query_one(ChatPane)
    pane.log.show_messages([{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}\n" * 3}
                            for i in range(20)])
    pane.reply = pane.log.add_assistant()
    await pilot.pause()
    pane.follow()
    await pilot.pause()
    return pane


async def test_follows_the_stream_at_the_bottom():
    async with PaneHost().run_test(size=(60, 20)) as pilot:
        pane = await _long_transcript(pilot)
        for i in range(10):
            pane.reply.append(f"line {i}\n\n")
            pane.text_arrived()
            await pilot.pause()
        assert not pane.log.reading_above and not pane.new_reply_marked


async def test_reading_above_keeps_the_view_and_marks_the_new_reply():
    async with PaneHost().run_test(size=(60, 20)) as pilot:
        pane = await _long_transcript(pilot)
        pane.log.scroll_page_up(animate=False)
        await pilot.pause()
        where = pane.log.scroll_y
        assert pane.log.reading_above
        for i in range(10):
            pane.reply.append(f"line {i}\n\n")
            pane.text_arrived()
            await pilot.pause()
        assert pane.log.scroll_y == where and pane.new_reply_marked
        # Reading down to the end drops the marker and follows again.
        while pane.log.reading_above:
            pane.log.scroll_page_down(animate=False)
            await pilot.pause()
        await pilot.pause()
        assert not pane.new_reply_marked
        pane.reply.append("more\n\nand more\n\n")
        await pilot.pause()
        assert not pane.log.reading_above


async def test_sending_brings_the_view_back():
    async with PaneHost().run_test(size=(60, 20)) as pilot:
        pane = await _long_transcript(pilot)
        pane.log.scroll_home(animate=False)
        await pilot.pause()
        pane.reply.append("new text\n")
        pane.text_arrived()
        assert pane.new_reply_marked
        pane.follow()
        await pilot.pause()
        assert not pane.log.reading_above and not pane.new_reply_marked


async def test_a_reply_streamed_at_the_bottom_is_never_marked(tiny_llama, monkeypatch):
    """In the real app the content grows a frame before the anchor scrolls to it; that gap
    is not the user reading above, so the marker must not flicker on while following."""
    marked: list[bool] = []
    text_arrived = ChatPane.text_arrived

    def spy(pane: ChatPane) -> None:
        text_arrived(pane)
        marked.append(pane.new_reply_marked)

    monkeypatch.setattr(ChatPane, "text_arrived", spy)
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, max_tokens=300, no_disk_cache=True))
    async with app.run_test(size=(100, 30)) as pilot:
        for _ in range(3):
            await send(pilot, "hello there " * 5)
    assert marked and not any(marked)
