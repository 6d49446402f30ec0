"""Stopping and sending across chats, on screen (Pilot): ctrl+c stops a prefill (it said "press
ctrl+q to quit"), twice within a second quits; each chat's status bar shows its own work (a new
chat showed "generating…" of another); a message sent while another chat answers is queued,
saying after which chat's reply, and sent when that reply ends (it was refused)."""

from __future__ import annotations

from ds4tui.chat import events as ev
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.widgets.chat_log import UserMessage
from ds4tui.screens.widgets.status_bar import StatusBar
from tests.ui.chat_app import SIZE, ChatHost, GatedController, chat_config, send

LONG = "word " * 420  # ~1300 tokens of tiny-llama: three prefill chunks (the gate holds the second)


def _pane(app):
    return app.chat.query_one("#chats").visible_content


async def _start_gated(app, pilot, text: str = LONG) -> int:
    """Send `text` in the chat on screen; return once its prefill is held after a chunk."""
    mark = len(app.seen)
    prompt = app.chat.query_one("#prompt")
    prompt.insert(text)
    await pilot.press("enter")
    await app.wait_for(ChatScreen.EngineEvent, lambda m: isinstance(m.event, ev.PrefillProgress), after=mark)
    return mark


async def test_ctrl_c_stops_a_prefill_and_twice_quits(tiny_llama):
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        controller.gate.set()  # a first exchange runs through
        await send(pilot, "Hello.")
        controller.gate.clear()
        conv = controller.get(app.chat._active)
        before = conv.context_tokens
        mark = await _start_gated(app, pilot)
        await pilot.press("ctrl+c")
        assert controller._stop.is_set()  # the focused message box did not take it (copy)
        ended = await app.wait_for(ChatScreen.TurnEnded, after=mark)
        await pilot.pause()
        assert ended.done is None
        assert not any(n.title == "Do you want to quit?" for n in app.toasts)  # Textual's ctrl+c
        assert any(n.title == "Stop" for n in app.toasts)
        assert app.chat.query_one("#prompt").text == LONG  # the message is back in the box
        assert conv.context_tokens == before  # the cancelled prefill left nothing behind
        assert app.chat.query_one(StatusBar).ctx_used == before
        assert not app.chat._quitting
        # A second ctrl+c more than a second later does not quit; two within a second do.
        app.chat._last_interrupt -= 5.0
        await pilot.press("ctrl+c")
        assert not app.chat._quitting
        await pilot.press("ctrl+c")
        assert app.chat._quitting


async def test_ctrl_c_with_a_selection_in_the_box_copies(tiny_llama):
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        prompt = app.chat.query_one("#prompt")
        prompt.insert("copy me")
        prompt.select_all()
        copied = []
        app.copy_to_clipboard = copied.append
        await pilot.press("ctrl+c")
        assert copied == ["copy me"] and not app.chat._quitting
        # The chat's copy route says where it went (a file where OSC 52 may not arrive).
        assert any(n.title == "Clipboard" and "the selection" in n.message for n in app.toasts)


async def test_a_new_chat_shows_its_own_status_not_the_other_chats_reply(tiny_llama):
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        first = app.chat._active
        await _start_gated(app, pilot)
        status = app.chat.query_one(StatusBar)
        assert status.activity.startswith("prefill")
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.chat._active != first
        assert status.activity == "" and status.ctx_used == 0  # not "prefilling…" of the first chat
        await pilot.press("ctrl+pageup")
        await pilot.pause()
        assert app.chat._active == first and status.activity.startswith("prefill")
        controller.gate.set()
        await app.wait_for(ChatScreen.TurnEnded)


async def test_a_message_sent_while_another_chat_answers_is_queued_and_then_sent(tiny_llama):
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        first = app.chat._active
        await _start_gated(app, pilot)
        title = controller.get(first).display_title
        await pilot.press("ctrl+n")
        await pilot.pause()
        second = app.chat._active
        mark = len(app.seen)
        app.chat.query_one("#prompt").insert("Capital of Spain?")
        await pilot.press("enter")
        await pilot.pause()
        status = app.chat.query_one(StatusBar)
        assert status.activity.startswith("queued: after the reply in «word word")
        assert title.startswith("word word")
        assert any("Queued: sent after the reply in «word word" in n.message for n in app.toasts)
        assert [u.text for u in _pane(app).query(UserMessage)] == ["Capital of Spain?"]
        assert app.chat.query_one("#prompt").text == ""
        controller.gate.set()  # the first chat's reply runs to its end; then the queued one goes
        ended = await app.wait_for(ChatScreen.TurnEnded, lambda m: m.key == second, after=mark)
        assert ended.done is not None
        assert [m["content"] for m in controller.get(second).messages if m["role"] == "user"] == ["Capital of Spain?"]
        assert controller.get(first).messages[-1]["role"] == "assistant"


async def test_escape_takes_a_queued_message_back_and_leaves_the_other_reply_running(tiny_llama):
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        first = app.chat._active
        mark = await _start_gated(app, pilot)
        await pilot.press("ctrl+n")
        await pilot.pause()
        second = app.chat._active
        await pilot.press("escape")  # nothing of this chat runs: the other reply goes on
        await pilot.pause()
        assert not controller._stop.is_set()
        assert any("runs on" in n.message and "«word word" in n.message for n in app.toasts)
        app.chat.query_one("#prompt").insert("Capital of Spain?")
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert not controller._stop.is_set()
        assert app.chat.query_one("#prompt").text == "Capital of Spain?"
        assert not _pane(app).query(UserMessage)
        assert app.chat.query_one(StatusBar).activity == ""
        controller.gate.set()
        await app.wait_for(ChatScreen.TurnEnded, lambda m: m.key == first, after=mark)
        await pilot.pause()
        assert controller.get(second).messages == [] and not app.chat._engine_job


async def test_a_message_still_queued_at_quit_comes_back_as_the_chats_draft(tiny_llama):
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        await _start_gated(app, pilot)
        await pilot.press("ctrl+n")
        await pilot.pause()
        second = app.chat._active
        app.chat.query_one("#prompt").insert("Capital of Spain?")
        await pilot.press("enter")
        await pilot.pause()
        assert "queued" in app.chat.query_one(StatusBar).activity
        await pilot.press("ctrl+q")  # the running reply is cancelled; the queued message is not lost
        for _ in range(400):
            if controller.find(second) is not None and controller.get(second).store_id is not None:
                break
            await pilot.pause(0.05)
    conv = controller.get(second)
    stored = controller.history.store.load(conv.store_id)
    assert stored.messages[-1] == {"role": "user", "content": "Capital of Spain?"}
    reopened = controller.history.conversation(stored, "again")
    assert reopened.draft == "Capital of Spain?" and reopened.messages == []


async def test_ctrl_c_over_another_screen_stops_the_reply_too(tiny_llama):
    """In F1's keys, a dialog or the cache browser, ctrl+c no longer says "press ctrl+q"."""
    from ds4tui.screens.keys_help import KeysHelpScreen

    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        mark = await _start_gated(app, pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, KeysHelpScreen)
        await pilot.press("ctrl+c")
        assert controller._stop.is_set()
        assert (await app.wait_for(ChatScreen.TurnEnded, after=mark)).done is None
        assert not any(n.title == "Do you want to quit?" for n in app.toasts)
