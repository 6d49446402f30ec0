"""The conversation moves on screen, with Pilot: ctrl+r regenerate and the reply's versions
(←/→), e (edit and resend), f (fork), y (copy), ctrl+f (find a chat), the stats line's cache
report, the full-context dialog, and a message queued while the model loads."""

from __future__ import annotations

from ds4tui.chat import events as ev
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.widgets.start_progress import StartProgress
from ds4tui.screens.widgets.chat_log import AssistantMessage, UserMessage
from ds4tui.screens.widgets.status_bar import StatusBar, context_meter
from tests.ui.chat_app import SIZE, ChatHost, chat_config, send


async def test_regenerate_and_versions(tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path), temperature=1.0, seed=3))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hello there.")
        ctl, key = app.chat.controller, app.chat._active
        first = ctl.get(key).messages[-1]["content"]
        stats = str(app.chat._pane(key).log.last_assistant.query_one(".stats").render())
        assert "cold: no cached prefix · prefilled" in stats
        mark = len(app.seen)
        await pilot.press("ctrl+r")
        ended = await app.wait_for(ChatScreen.TurnEnded, after=mark)
        assert ended.done.cache.prefilled == 0 and ended.done.regenerated
        log = app.chat._pane(key).log
        assert len(log.query(AssistantMessage)) == 1  # replaced, not added
        stats = str(log.last_assistant.query_one(".stats").render())
        assert "reused" in stats and "(live) · prefilled 0" in stats and "from kept logits" in stats
        assert stats.endswith("version 2/2 · shift+tab, then ←/→ switches")  # the old reply is not lost
        reply = log.last_assistant
        reply.focus()
        await pilot.press("left")
        assert reply.text == first and ctl.alternatives(key, len(ctl.get(key).messages) - 1)[0] == 0
        assert "version 1/2" in str(reply.query_one(".stats").render())


async def test_edit_fork_and_copy_keys(tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    copied = []
    app.copy_to_clipboard = copied.append
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "First question.")
        await send(pilot, "Second question.")
        ctl, key = app.chat.controller, app.chat._active
        log = app.chat._pane(key).log
        second = log.query(UserMessage).last()
        second.focus()
        await pilot.press("y")
        assert copied == ["Second question."]
        second.focus()
        await pilot.press("e")
        prompt = app.chat.query_one("#prompt")
        assert prompt.text == "Second question."
        prompt.load_text("Second question, edited.")
        mark = len(app.seen)
        await pilot.press("enter")
        ended = await app.wait_for(ChatScreen.TurnEnded, after=mark)
        assert ended.done.cache.source == "live" and ended.done.cache.reused > 0
        conv = ctl.get(key)
        assert [m["content"] for m in conv.messages if m["role"] == "user"] == ["First question.", "Second question, edited."]
        forks = [c for c in ctl.list() if c.display_title.endswith("(fork)")]
        assert len(forks) == 1 and forks[0].messages[-2]["content"] == "Second question."
        await pilot.pause()
        # f on the first reply: a new chat with the first exchange, live, no prefill.
        log.query(AssistantMessage).first().focus()
        mark = len(app.seen)
        await pilot.press("f")
        forked = (await app.wait_for(ChatScreen.EngineEvent, lambda m: isinstance(m.event, ev.Forked), after=mark)).event
        assert forked.source == "memory" and forked.tokens > 0
        await pilot.pause()
        fork = ctl.get(forked.conversation)
        assert fork.live and [m["content"] for m in fork.messages][0] == "First question."


async def test_find_a_chat(tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Where is the lighthouse?")
        await pilot.press("ctrl+f")
        await pilot.pause()
        screen = app.screen
        assert "at least 2 characters" in str(screen.query_one(".summary").render())  # never a blank box
        screen.query_one("#query").value = "lighthouse"
        for _ in range(100):
            await pilot.pause(0.05)
            if screen.query_one("#results").option_count:
                break
        results = screen.query_one("#results")
        assert results.option_count >= 1
        text = str(results.get_option_at_index(0).prompt)
        assert "Where is the lighthouse?" in text and "open now" in text
        screen.query_one("#query").value = "l"  # too short: the old results go, the hint is back
        await pilot.pause()
        assert results.option_count == 0 and "at least 2" in str(screen.query_one(".summary").render())
        await pilot.press("escape")
        # Opening the chat that is already on screen shows it; nothing is "resumed".
        mark = len(app.seen)
        app.clear_notifications()
        app.chat.open_file(app.chat.controller.get(app.chat._active).saved_sha)
        await app.wait_for(ChatScreen.Resumed, after=mark)
        await pilot.pause()
        notes = [n.message for n in app.toasts]
        assert any("already open" in n for n in notes) and not any(n.startswith("Resumed") for n in notes)


async def test_full_context_dialog_offers_the_choices(tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path), ctx=128))
    async with app.run_test(size=SIZE) as pilot:
        ended = await send(pilot, "word " * 200)
        assert ended.done is None
        await pilot.pause()
        from ds4tui.screens.widgets.choice_dialog import ChoiceDialog

        # Too long on its own: no fresh chat or dropped turns would help, so none is offered.
        assert isinstance(app.screen, ChoiceDialog)
        assert [str(b.label) for b in app.screen.query("Button")] == ["OK"]
        assert "too long for the context" in str(app.screen.query_one(".question").render())
        await pilot.press("escape")
        assert app.chat.query_one("#prompt").text.startswith("word word")  # nothing lost
        assert app.chat.controller.get(app.chat._active).messages == []
        # A chat that has grown: a fresh chat (or dropping the oldest exchange) makes room.
        app.chat.query_one("#prompt").clear()
        assert (await send(pilot, "word " * 10)).done is not None  # ~70 of the 128 tokens
        ended = await send(pilot, "word " * 15)
        assert ended.done is None
        await pilot.pause()
        assert isinstance(app.screen, ChoiceDialog)
        labels = [str(b.label) for b in app.screen.query("Button")]
        assert labels[0].startswith("Fresh chat") and labels[-1] == "Cancel"
        assert "The chat with this message takes" in str(app.screen.query_one(".question").render())
        await pilot.press("escape")


async def test_a_message_sent_while_loading_is_queued(tiny_llama, tmp_path, monkeypatch):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    app._screen_args["model"] = None  # load in the worker, as the real app does
    app.config = chat_config(tiny_llama, cache_dir=str(tmp_path))
    import threading

    import ds4tui.engine.loader as loader

    loaded = threading.Event()  # the model "loads" until the test has typed both messages
    real_load = loader.load_model

    def slow_load(*args, **kwargs):
        loaded.wait(10)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loader, "load_model", slow_load)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.chat.query_one("#prompt")
        prompt.insert("Early message.")
        await pilot.press("enter")
        # A second one while the first waits stays in the box (it used to replace the first).
        prompt.insert("Second early message.")
        await pilot.press("enter")
        assert prompt.text == "Second early message." and app.chat.controller is None
        # Keys that need the model say so while it loads, rather than doing nothing: in the
        # start card (a toast would cover its title).
        card = app.chat.query_one(StartProgress)
        for key in ("ctrl+n", "f2", "f3", "ctrl+f", "ctrl+r"):
            card.say("")
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, ChatScreen), key
            assert card.note == "The model is still loading." and not app.toasts, key
        loaded.set()
        ended = await app.wait_for(ChatScreen.TurnEnded)
        assert ended.done is not None
        conv = app.chat.controller.get(app.chat._active)
        assert conv.messages[0] == {"role": "user", "content": "Early message."}
        # Sent and answered: the status bar no longer says it waits (it did, for ever).
        assert "queued" not in app.chat.query_one(StatusBar).activity_of(None)


def test_context_meter():
    assert context_meter(0, 100) == "▱" * 8 and context_meter(1, 100) == "▰" + "▱" * 7
    assert context_meter(100, 100) == "▰" * 8 and context_meter(50, 100) == "▰" * 4 + "▱" * 4
    assert StatusBar is not None


async def test_browser_title_column_uses_its_width(tmp_path):
    """At 160 columns a 19-character title is not cut (the column grows with the table)."""
    from tests.ui.browser_app import BrowserHost
    from tests.ui.kv_fixtures import titled_session

    titled_session(tmp_path, title="A nineteen-char tit")
    app = BrowserHost(tmp_path)
    async with app.run_test(size=(160, 40)) as pilot:
        for _ in range(100):
            await pilot.pause(0.05)
            if app.shown:
                break
        table = app.browser.query_one("KvTable")
        assert table.columns["title"].width > 18 + 10  # was a fixed 18: 19 characters were cut
        assert "A nineteen-char tit" in str(table.get_row_at(0)[0])


async def test_escape_leaves_edit_mode_and_a_busy_chat_says_why_keys_wait(tiny_llama, tmp_path):
    """Edit mode is a state the user can leave (Escape, or another chat), and ctrl+r during a
    reply says why nothing happens instead of doing nothing."""
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "First question.")
        key = app.chat._active
        app.chat._pane(key).log.query(UserMessage).last().focus()
        await pilot.press("e")
        prompt, status = app.chat.query_one("#prompt"), app.chat.query_one(StatusBar)
        assert prompt.text == "First question." and status.activity.startswith("editing")
        await pilot.press("escape")
        assert app.chat._editing is None and prompt.text == "" and status.activity == ""
        assert [m["content"] for m in app.chat.controller.get(key).messages if m["role"] == "user"] == [
            "First question."]
        # e then Enter with the text as it was: no resend, so no needless fork.
        app.chat._pane(key).log.query(UserMessage).last().focus()
        await pilot.press("e")
        await pilot.press("enter")
        await pilot.pause()
        assert app.chat._editing is None and status.activity == "" and len(app.chat.controller.list()) == 1
        assert any("unchanged" in n.message for n in app.toasts)
        # Editing, then another chat: the edit does not follow into it.
        app.chat._pane(key).log.query(UserMessage).last().focus()
        await pilot.press("e")
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.chat._editing is None and prompt.text == "" and status.activity == ""
        # A key that cannot act now tells why.
        app.chat._engine_job = True
        app.clear_notifications()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert any("Wait for the reply" in n.message for n in app.toasts)
        app.chat._engine_job = False
