"""Snapshots of the chat screen: greedy tiny-llama, timings pinned, no toasts, still cursor.

Regenerate after an intended change with `pytest tests/ui/test_chat_snapshot.py --snapshot-update`
and look at the SVGs in __snapshots__/ before committing them.
"""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from ds4tui.chat import events as ev
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.widgets import fmt
from ds4tui.screens.widgets.chat_log import ChatLog
from tests.ui.chat_app import SIZE, ChatHost, GatedController, chat_config, send
from tests.ui.waiting import until_settled


@pytest.fixture(autouse=True)
def _pinned_timings(monkeypatch):
    """Speeds and durations vary run to run; everything else on screen is deterministic."""
    monkeypatch.setattr(fmt, "rate", lambda tok_s: "12.3 tok/s")
    monkeypatch.setattr(fmt, "ms", lambda value: "45 ms")
    monkeypatch.setattr(fmt, "eta", lambda seconds: "ETA 7s")
    monkeypatch.setattr(fmt, "share", lambda fraction: "1%")


def test_chat_after_one_reply(snap_compare, tiny_llama):
    """Sidebar with the titled chat, the exchange, the reply's stats line and the status bar."""
    app = ChatHost(tiny_llama)

    async def run_before(pilot) -> None:
        await send(pilot, "Hello! Is [b]this[/b] shown as typed?")
        app.clear_notifications()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_prefill_progress_bar(snap_compare, tiny_llama):
    """A long prompt, parked after its first chunk: the bar with tokens done/total, speed, ETA."""
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)

    async def run_before(pilot) -> None:
        await app.wait_for(ChatScreen.ModelReady)
        # A scrollbar that appears only once the long message overflows narrows the transcript
        # and re-wraps it, and which of the two layouts a capture sees depended on timing:
        # keep the scrollbar from the start so there is one layout.
        app.chat.query_one(ChatLog).styles.overflow_y = "scroll"
        app.chat.query_one("#prompt").insert("Summarize: " + "word " * 420)
        await pilot.press("enter")
        await app.wait_for(ChatScreen.EngineEvent, lambda m: isinstance(m.event, ev.PrefillProgress))
        app.clear_notifications()
        await pilot.wait_for_scheduled_animations()
        # The log follows the long message a frame after it grows (Textual's anchor); on a
        # busy machine the capture could come first: wait for its layout to settle at the
        # bottom, not for a time.
        log = app.chat.query_one(ChatLog)
        await until_settled(pilot, lambda: (log.virtual_size, log.scroll_y, log.max_scroll_y, len(log.children)),
                            lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y, "the log's bottom")

    try:
        assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
    finally:
        controller.gate.set()


class MarkdownHost(App):
    """Just a chat log, to pin how replies render: Markdown, highlighted code, control codes."""

    def compose(self) -> ComposeResult:
        yield ChatLog()

    def on_mount(self) -> None:
        self.query_one(ChatLog).show_messages([
            {"role": "user", "content": "Show me [red]markup[/red] and a bell\x07"},
            {"role": "assistant", "content": (
                "## A heading\n\nSome **bold** text and a list:\n\n- one\n- two\n\n"
                "```python\ndef greet(name):\n    return f\"hi {name}\"  # a long comment that goes past the edge of"
                " the pane and wraps\n```\n\nEscape \x1b[31m stays visible."
            )},
        ])


def test_reply_markdown_rendering(snap_compare):
    assert snap_compare(MarkdownHost(), terminal_size=(70, 26))


def test_chat_at_80x24(snap_compare, tiny_llama):
    """80x24: a narrower sidebar with the title cut by its width, the whole footer, the status bar."""
    app = ChatHost(tiny_llama)

    async def run_before(pilot) -> None:
        await send(pilot, "Please summarize the following text about Lisbon's old town")
        app.clear_notifications()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_settings_dialog_at_80x24(snap_compare, tiny_llama):
    """F3 at 80x24: the form scrolls, the error line and the buttons stay on screen; no SWA
    field for a model without sliding-window layers; the default system prompt shown."""
    app = ChatHost(tiny_llama)

    async def run_before(pilot) -> None:
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.press("f3")
        await pilot.pause()
        app.clear_notifications()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
