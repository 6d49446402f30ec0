"""The chat screen on a remote engine (Pilot): it streams from `ds4tui serve`, shows the server's
cache reuse in the stats line, and a refused connection gives the typed text back; F3, ctrl+r
and the versions, e, f, ctrl+f and delete work on a remote chat, and it reopens from the store
after a restart with its versions."""

from __future__ import annotations

from ds4tui.chat import events as ev
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.settings import SettingsScreen
from ds4tui.screens.widgets.chat_log import AssistantMessage, UserMessage
from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog
from ds4tui.screens.widgets.conversation_list import ChatItem, ConversationList
from ds4tui.screens.widgets.status_bar import StatusBar
from tests.serve.conftest import free_port
from tests.serve.test_remote import remote
from tests.ui.chat_app import SIZE, ChatHost, send


async def test_the_chat_screen_talks_to_ds4tui_serve(server, tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, controller=remote(server.url, tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        first = await send(pilot, "screen: hello")
        assert first.done is not None
        assert app.chat.query_one(StatusBar).model_name == "tiny-llama @ 127.0.0.1"
        second = await send(pilot, "screen: again")
        assert second.done is not None and second.done.cached_tokens
        replies = app.chat.query("AssistantMessage")
        conv = app.chat.controller.get(second.key)
        assert [r.text for r in replies] == [m["content"] for m in conv.messages if m["role"] == "assistant"]
        stats = replies.last(AssistantMessage).query_one(".stats").render()
        assert f"cached {second.done.cached_tokens} tok" in str(stats)


async def test_a_refused_connection_keeps_the_typed_message(tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, controller=remote(f"http://127.0.0.1:{free_port()}/v1", tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        ended = await send(pilot, "is anyone there?")
        assert ended.done is None
        [error] = app.events(ev.ChatError)
        assert "cannot connect" in error.message
        assert app.chat.query_one("#prompt").text == "is anyone there?"


# -- every chat key on the remote engine (they used to raise "object has no attribute") -----------


async def _results(pilot, screen, query: str):
    screen.query_one("#query").value = query
    results = screen.query_one("#results")
    for _ in range(200):
        await pilot.pause(0.05)
        if results.option_count:
            break
    return results


async def test_f3_applies_to_the_remote_chat_and_goes_with_its_requests(server, tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, controller=remote(server.url, tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.press("f3")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)  # was: AttributeError, the app gone
        assert not app.screen.query("#set-swa_policy")  # no storage policy to set on a server
        app.screen.query_one("#set-max_tokens").value = "3"
        app.screen.query_one("#set-system_prompt").load_text("Answer in one word.")
        await pilot.click("#settings-apply")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
        ctl, key = app.chat.controller, app.chat._active
        assert ctl.chat_settings(key)["max_tokens"] == 3 and ctl.config.max_tokens == 8
        ended = await send(pilot, "f3: hello")
        assert ended.done is not None and ended.done.tokens <= 3
        assert ctl.get(key).messages[0] == {"role": "system", "content": "Answer in one word."}
        stored = ctl.history.store.get(ctl.get(key).store_id)
        assert stored.settings["max_tokens"] == 3 and stored.system_prompt == "Answer in one word."
        assert not app.events(ev.ChatError)


async def test_regenerate_edit_and_fork_keys_on_the_remote_chat(server, tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, controller=remote(server.url, tmp_path, temperature=1.0, seed=11))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "keys: first question")
        ctl, key = app.chat.controller, app.chat._active
        first = ctl.get(key).messages[-1]["content"]
        mark = len(app.seen)
        await pilot.press("ctrl+r")
        ended = await app.wait_for(ChatScreen.TurnEnded, after=mark)
        assert ended.done is not None and ended.done.regenerated
        log = app.chat._pane(key).log
        assert len(log.query(AssistantMessage)) == 1  # replaced, not added
        reply = log.last_assistant
        assert str(reply.query_one(".stats").render()).endswith("version 2/2 · shift+tab, then ←/→ switches")
        reply.focus()
        await pilot.press("left")
        assert reply.text == first and ctl.alternatives(key, 1) == (0, 2)

        await send(pilot, "keys: second question")
        log.query(UserMessage).last().focus()
        await pilot.press("e")
        prompt = app.chat.query_one("#prompt")
        assert prompt.text == "keys: second question"
        prompt.load_text("keys: second question, edited")
        mark = len(app.seen)
        await pilot.press("enter")
        ended = await app.wait_for(ChatScreen.TurnEnded, after=mark)
        assert ended.done is not None
        conv = ctl.get(key)
        assert [m["content"] for m in conv.messages if m["role"] == "user"] == [
            "keys: first question", "keys: second question, edited"]
        [kept] = [c for c in ctl.list() if c.display_title.endswith("(fork)")]
        assert kept.messages[-2]["content"] == "keys: second question"
        await pilot.pause()

        log.query(AssistantMessage).first().focus()
        mark = len(app.seen)
        await pilot.press("f")
        forked = (await app.wait_for(ChatScreen.EngineEvent, lambda m: isinstance(m.event, ev.Forked),
                                     after=mark)).event
        for _ in range(100):
            await pilot.pause(0.05)
            if app.chat._active == forked.conversation:
                break
        fork = ctl.get(forked.conversation)
        assert app.chat._active == fork.key and fork.messages == conv.messages[:2]
        assert ctl.history.store.get(fork.store_id).forked_from == conv.store_id
        assert not app.events(ev.ChatError)


async def test_find_export_archive_and_delete_on_the_remote_chat(server, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("DS4TUI_EXPORT_DIR", str(tmp_path))  # where the export's files go
    app = ChatHost(tiny_llama, controller=remote(server.url, tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Where is the remote lighthouse?")
        ctl, key = app.chat.controller, app.chat._active
        chat_id = ctl.get(key).store_id
        await pilot.press("ctrl+f")
        await pilot.pause()
        results = await _results(pilot, app.screen, "remote lighthouse")
        assert results.option_count == 1
        text = str(results.get_option_at_index(0).prompt)
        assert "Where is the remote lighthouse?" in text and "open now" in text
        results.focus()
        results.highlighted = 0
        mark = len(app.seen)
        await pilot.press("enter")
        resumed = await app.wait_for(ChatScreen.Resumed, after=mark)
        assert resumed.error is None and resumed.key == key  # the chat open already: shown

        app.chat.action_export_chat()  # the palette's "Export chat"
        import json

        exported = json.loads((tmp_path / "Where-is-the-remote-lighthouse.json").read_text())
        assert exported["messages"] == ctl.get(key).messages
        app.chat.action_archive_chat()  # the palette's "Archive chat"
        assert ctl.history.store.get(chat_id).archived

        app.chat.action_delete_chat()  # the palette's "Delete chat"
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        for _ in range(200):
            await pilot.pause(0.05)
            if ctl.find(key) is None and app.chat._active not in (None, key):
                break
        assert ctl.history.store.get(chat_id) is None and ctl.find(key) is None
        assert app.chat._active not in (None, key)  # another chat shows
        assert any(n.message.startswith("Deleted") for n in app._notifications)


async def test_a_remote_chat_reopens_with_its_versions_after_a_restart(server, tiny_llama, tmp_path):
    """The second app is another run of the chat on the same store: the sidebar lists the chat
    (text only: the server holds its KV, if anything), and it opens with both replies."""
    writer = remote(server.url, tmp_path, temperature=1.0, seed=5)
    conv = writer.new_conversation()
    assert writer.send(conv.key, "restart: a question") is not None
    assert writer.regenerate(conv.key) is not None
    assert len(set(conv.alternatives[1])) == 2
    app = ChatHost(tiny_llama, controller=remote(server.url, tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ConversationList.Redrawn, lambda m: any(e.chat_id for e in m.entries))
        sidebar = app.chat.query_one("#sidebar")
        [row] = [i for i in sidebar.query(ChatItem) if i.entry.chat_id == conv.store_id]
        assert row.entry.title == "restart: a question" and row.entry.text_only
        sidebar.index = list(sidebar.query(ChatItem)).index(row)
        sidebar.focus()
        await pilot.press("enter")
        resumed = await app.wait_for(ChatScreen.Resumed)
        assert resumed.error is None
        await pilot.pause()
        reopened = app.chat.controller.get(resumed.key)
        assert reopened.messages == conv.messages and reopened.alternatives == conv.alternatives
        assert any("the server re-reads its history" in n.message for n in app._notifications)
        reply = app.chat._pane(resumed.key).log.last_assistant
        reply.focus()
        await pilot.press("left")
        assert reply.text == conv.alternatives[1][0]


async def test_no_footer_key_fails_on_the_remote_chat(server, tiny_llama, tmp_path):
    """Every key the footer offers does its job on a remote chat: none ends in an error."""
    app = ChatHost(tiny_llama, controller=remote(server.url, tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "footer: hello")
        # ctrl+n last: the keys before it act on the chat that has a reply.
        shown = sorted((b for b in ChatScreen.BINDINGS if b.show), key=lambda b: b.action == "new_chat")
        assert {"settings", "regenerate", "cache_browser", "new_chat"} <= {b.action for b in shown}
        for binding in shown:
            mark = len(app.seen)
            conv = app.chat.controller.get(app.chat._active)
            answered = bool(conv.messages) and conv.messages[-1]["role"] == "assistant"
            await pilot.press(binding.key)
            if binding.action == "regenerate" and answered:
                ended = await app.wait_for(ChatScreen.TurnEnded, after=mark)
                assert ended.done is not None
            await pilot.pause()
            if not isinstance(app.screen, ChatScreen):
                app.screen.dismiss(None)
                await pilot.pause()
        assert not app.events(ev.ChatError)
        assert not [n for n in app._notifications if n.severity == "error"]


async def test_a_reopened_remote_chat_meters_the_count_stored_with_it(server, tiny_llama, tmp_path):
    """The server counted the chat's tokens last time; reopened after a restart, the context
    meter shows that count (it read 0 until the next reply), and the fit check uses it."""
    writer = remote(server.url, tmp_path)
    conv = writer.new_conversation()
    assert writer.send(conv.key, "meter: a question") is not None
    counted = conv.context_tokens
    assert counted > 0
    app = ChatHost(tiny_llama, controller=remote(server.url, tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ConversationList.Redrawn, lambda m: any(e.chat_id == conv.store_id for e in m.entries))
        sidebar = app.chat.query_one("#sidebar")
        [row] = [i for i in sidebar.query(ChatItem) if i.entry.chat_id == conv.store_id]
        sidebar.index = list(sidebar.query(ChatItem)).index(row)
        sidebar.focus()
        await pilot.press("enter")
        resumed = await app.wait_for(ChatScreen.Resumed)
        await pilot.pause()
        assert app.chat.query_one(StatusBar).ctx_used == counted
        assert app.chat.controller.get(resumed.key).context_tokens == counted
