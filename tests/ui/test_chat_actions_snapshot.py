"""Snapshots of a selected message (framed, its hint on the frame) and its open menu, at
80x24 and 140x40 (issue 34: the selection was one background shade). Regenerate with
`pytest tests/ui/test_chat_actions_snapshot.py --snapshot-update` and look at the SVGs."""

from __future__ import annotations

from ds4tui.screens.widgets import fmt
from ds4tui.screens.widgets.chat_log import AssistantMessage, UserMessage
from tests.ui.chat_app import ChatHost, send


def _pinned(monkeypatch):
    monkeypatch.setattr(fmt, "rate", lambda tok_s: "12.3 tok/s")
    monkeypatch.setattr(fmt, "ms", lambda value: "45 ms")
    monkeypatch.setattr(fmt, "share", lambda fraction: "1%")


def test_selected_reply_with_its_menu_at_80x24(snap_compare, tiny_llama, monkeypatch):
    _pinned(monkeypatch)
    app = ChatHost(tiny_llama)

    async def run_before(pilot) -> None:
        await send(pilot, "What is a lighthouse?")
        app.clear_notifications()
        app.chat.query(AssistantMessage).last().focus()
        await pilot.press("enter")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_selected_question_at_140x40(snap_compare, tiny_llama, monkeypatch):
    _pinned(monkeypatch)
    app = ChatHost(tiny_llama)

    async def run_before(pilot) -> None:
        await send(pilot, "What is a lighthouse?")
        await send(pilot, "And a harbour?")
        app.clear_notifications()
        app.chat.query(UserMessage).last().focus()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)
