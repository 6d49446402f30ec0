"""The chat screen driven by Pilot: streaming, prefill progress, cancel, switching, resuming."""

from __future__ import annotations

from textual.widgets import Label

from ds4tui.chat import events as ev
from ds4tui.screens.chat import ChatScreen
from ds4tui.format.display import safe_lines
from ds4tui.screens.widgets.chat_log import AssistantMessage, ReplyMarkdown, UserMessage
from ds4tui.screens.widgets.conversation_list import ChatItem, ConversationList
from ds4tui.screens.widgets.prefill_bar import PrefillBar
from ds4tui.screens.widgets.status_bar import StatusBar
from tests.chat.conftest import make_controller
from tests.ui.chat_app import SIZE, ChatHost, GatedController, chat_config, send


def _pane(app):
    return app.chat.query_one("#chats").visible_content


async def test_send_streams_the_reply(tiny_llama):
    """Enter sends; token text arrives as events and ends up in the assistant message."""
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        ended = await send(pilot, "Hello [b]there[/b]")
        assert ended.done is not None and app.events(ev.TokenText)
        pane = _pane(app)
        reply = pane.query_one(AssistantMessage)
        conv = app.chat.controller.get(ended.key)
        assert reply.text == "".join(e.text for e in app.events(ev.TokenText)) == conv.messages[-1]["content"]
        await pilot.pause()
        # the turn's end made the block being written Markdown too: no plain-text tail is left
        assert reply.query_one(ReplyMarkdown).source == safe_lines(reply.text)
        assert not reply.query_one(".tail").display
        user = pane.query_one(UserMessage)
        assert user.text == "Hello [b]there[/b]"  # shown verbatim, not as markup
        assert user.visual.plain == "Hello [b]there[/b]"  # type: ignore[union-attr]
        status = app.chat.query_one(StatusBar)
        assert status.ctx_used == len(conv.session.tokens) and status.speed
        assert app.chat.query_one("#prompt").text == ""


async def test_long_prefill_shows_progress_and_escape_cancels(tiny_llama, tmp_path):
    """During a multi-chunk prefill the bar shows tokens done/total; Escape stops it, withdraws the
    message, puts the text back in the prompt, and the next send still answers."""
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)
    text = "word " * 420  # ~1300 tokens: three chunks
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        app.chat.query_one("#prompt").insert(text)
        await pilot.press("enter")
        progress = await app.wait_for(ChatScreen.EngineEvent, lambda m: isinstance(m.event, ev.PrefillProgress))
        bar = _pane(app).query_one(PrefillBar)
        assert bar.active and bar.display
        info = str(bar.query_one("#prefill-info").render())
        assert f"{progress.event.done:,}/{progress.event.total:,} tokens" in info
        await pilot.press("escape")
        controller.gate.set()
        ended = await app.wait_for(ChatScreen.TurnEnded)
        assert ended.done is None and app.events(ev.Cancelled)
        assert not bar.active
        assert not _pane(app).query(UserMessage) and not _pane(app).query(AssistantMessage)
        assert app.chat.query_one("#prompt").text == text
        app.chat.query_one("#prompt").clear()
        ended = await send(pilot, "Short question?")
        assert ended.done is not None


async def test_switching_conversations(tiny_llama):
    """ctrl+n opens a second chat; ctrl+pageup goes back to the first, with its messages."""
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        first = await send(pilot, "First chat")
        await pilot.press("ctrl+n")
        second = await send(pilot, "Second chat")
        assert first.key != second.key
        assert _pane(app).query_one(UserMessage).text == "Second chat"
        await pilot.press("ctrl+pageup")
        assert _pane(app).key == first.key
        assert _pane(app).query_one(UserMessage).text == "First chat"
        items = app.chat.query(ChatItem)
        assert [i.entry.key for i in items] == [first.key, second.key]
        assert [i.entry.title for i in items] == ["First chat", "Second chat"]


async def test_resume_a_titled_session_without_prefill(tiny_llama, tmp_path):
    """--resume: the transcript appears and the KV is restored from disk; nothing is prefilled."""
    writer = make_controller(tiny_llama)
    conv = writer.new_conversation()
    writer.send(conv.key, "Remember [red]this[/red]", lambda e: None)
    app = ChatHost(tiny_llama, resume=conv.saved_sha[:8])
    async with app.run_test(size=SIZE) as pilot:
        resumed = await app.wait_for(ChatScreen.Resumed)
        assert resumed.error is None
        await pilot.pause()
        pane = _pane(app)
        assert [m.text for m in pane.query(UserMessage)] == ["Remember [red]this[/red]"]
        assert pane.query_one(AssistantMessage).text == conv.messages[-1]["content"]
        assert app.events(ev.Hit) and not app.events(ev.PrefillStarted)
        assert app.chat.query_one(StatusBar).ctx_used == len(conv.session.tokens)
        ended = await send(pilot, "And now?")
        started = app.events(ev.PrefillStarted)[0]
        assert ended.done is not None and started.source == "live" and started.cached == len(conv.session.tokens)
        row = app.chat.query(ChatItem).first().query_one("Label")
        assert "Remember [red]this[/red]" in str(row.render())  # the title is text, not markup


async def test_saved_sessions_are_listed_and_open_from_the_sidebar(tiny_llama):
    """A stored chat whose KV is on disk shows as ↺ in the sidebar; selecting it opens it, live."""
    writer = make_controller(tiny_llama)
    conv = writer.new_conversation()
    writer.send(conv.key, "An older chat", lambda e: None)
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ConversationList.Redrawn, lambda m: any(e.chat_id for e in m.entries))
        sidebar = app.chat.query_one("#sidebar")
        saved = [i for i in sidebar.query(ChatItem) if i.entry.chat_id == conv.store_id]
        assert saved and saved[0].entry.title == "An older chat" and not saved[0].entry.text_only
        sidebar.index = list(sidebar.query(ChatItem)).index(saved[0])
        sidebar.focus()
        await pilot.press("enter")
        resumed = await app.wait_for(ChatScreen.Resumed)
        assert resumed.error is None
        reopened = app.chat.controller.get(resumed.key)
        assert reopened.saved_sha == conv.saved_sha and reopened.live
        assert reopened.messages == conv.messages


async def test_settings_apply_to_the_active_chat(tiny_llama):
    """f3 opens the active chat's settings; a bad value is refused in place, a good one applied
    to that chat only: new chats keep the defaults."""
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.press("f3")
        temperature = app.screen.query_one("#set-temperature")
        temperature.value = "9"
        temperature.focus()
        await pilot.press("enter")
        assert "temperature must be within" in str(app.screen.query_one("#settings-error").render())
        temperature.value = "0.5"
        app.screen.query_one("#set-max_tokens").value = "16"
        await pilot.click("#settings-apply")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
        ctl = app.chat.controller
        mine = ctl.chat_settings(app.chat._active)
        assert (mine["temperature"], mine["max_tokens"]) == (0.5, 16)
        assert (ctl.config.temperature, ctl.config.max_tokens) == (0.0, 8)  # the defaults
        assert ctl.chat_settings(ctl.new_conversation().key)["max_tokens"] == 8


async def test_settings_of_a_chat_that_is_answering_wait_for_the_reply(tiny_llama):
    """f3 during the active chat's turn used to open the form and refuse it on Apply, losing what
    was typed; it now says why at once."""
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    app = ChatHost(tiny_llama, controller=controller)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        app.chat.query_one("#prompt").insert("word " * 420)
        await pilot.press("enter")
        await app.wait_for(ChatScreen.EngineEvent, lambda m: isinstance(m.event, ev.PrefillProgress))
        await pilot.press("f3")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
        assert any("after the reply" in n.message for n in app.toasts)
        controller.gate.set()
        await app.wait_for(ChatScreen.TurnEnded)
        await pilot.press("f3")
        await pilot.pause()
        assert not isinstance(app.screen, ChatScreen)  # the form opens once the turn is over


async def test_palette_offers_the_chat_commands(tiny_llama):
    """ctrl+p lists New chat / Rename / Cache browser / Settings / Quit; New chat opens a chat."""
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        before = len(app.chat.controller.list())
        await pilot.press("ctrl+p")
        await pilot.press(*"New chat")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert len(app.chat.controller.list()) == before + 1


async def test_f2_renames_the_chat_and_f4_opens_the_cache_browser(tiny_llama):
    """The dialogs glue: F2's title reaches the controller and the sidebar; F4 opens the browser
    on the chat's own cache directory."""
    from textual.widgets import Input

    from ds4tui.screens.cache_browser import CacheBrowserScreen
    from ds4tui.screens.widgets.prompt_dialog import PromptDialog
    from tests.ui.browser_app import until

    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        ended = await send(pilot, "Hello")
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, PromptDialog), "the rename dialog")
        app.screen.query_one(Input).value = "Lisbon  plans"
        await pilot.press("enter")
        conv = app.chat.controller.get(ended.key)
        await until(pilot, lambda: conv.display_title == "Lisbon plans", "the new title")
        await until(pilot, lambda: any(str(item.entry.title) == "Lisbon plans"
                                       for item in app.chat.query(ChatItem)), "the sidebar's new title")
        await pilot.press("f4")
        await until(pilot, lambda: isinstance(app.screen, CacheBrowserScreen), "the cache browser")
        assert app.screen.store.dir == app.chat.controller.cache_store.dir


async def test_a_chat_whose_kv_file_broke_opens_from_its_history(tiny_llama):
    """A chat whose titled file cannot be restored (here: truncated) is still listed; choosing
    it opens its messages from the store, says why the file was refused, and the next
    message re-prefills: the cache is only a cache."""
    writer = make_controller(tiny_llama)
    conv = writer.new_conversation()
    writer.send(conv.key, "A chat that will break", lambda e: None)
    path = writer.cache_store.path_for(conv.saved_sha)
    path.write_bytes(path.read_bytes()[:-100])
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ConversationList.Redrawn, lambda m: any(e.chat_id == conv.store_id for e in m.entries))
        sidebar = app.chat.query_one("#sidebar")
        row = [i for i in sidebar.query(ChatItem) if i.entry.chat_id == conv.store_id][0]
        sidebar.index = list(sidebar.query(ChatItem)).index(row)
        sidebar.focus()
        await pilot.press("enter")
        resumed = await app.wait_for(ChatScreen.Resumed)
        opened = app.chat.controller.get(resumed.key)
        assert opened.messages == conv.messages and not opened.live
        note = [n.message for n in app.toasts if n.title == "Session"][-1]
        assert "its .kv file was refused" in note and "re-prefill" in note


async def test_a_chat_of_another_model_opens_and_says_it_will_re_prefill(tiny_llama, tmp_path):
    """A chat made with another model (another file of the family) is listed like any other;
    opened here, its history shows and the toast names the model it was made with and what
    continuing here costs. Its title (user text) reaches the toast escaped."""
    import shutil

    from safetensors.torch import save_file

    from ds4tui.engine.llama.tiny import CONFIG, SEED, ensure_tiny_llama, random_llama_weights
    from ds4tui.engine.loader import load_model

    other_dir = tmp_path / "other-tiny"
    shutil.copytree(ensure_tiny_llama(), other_dir)
    save_file(random_llama_weights(CONFIG, SEED + 1), str(other_dir / "model.safetensors"), metadata={"format": "pt"})
    other = load_model(str(other_dir))
    assert other.info.fingerprint != tiny_llama.info.fingerprint
    writer = make_controller(other)
    conv = writer.new_conversation()
    writer.send(conv.key, "Other model \x1b[2J chat", lambda e: None)
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ConversationList.Redrawn, lambda m: any(e.chat_id == conv.store_id for e in m.entries))
        sidebar = app.chat.query_one("#sidebar")
        row = [i for i in sidebar.query(ChatItem) if i.entry.chat_id == conv.store_id][0]
        assert row.entry.model == other.info.name  # the sidebar says which model made it
        assert other.info.name[:16] in str(row.query_one(".tag").render())
        sidebar.index = list(sidebar.query(ChatItem)).index(row)
        sidebar.focus()
        await pilot.press("enter")
        resumed = await app.wait_for(ChatScreen.Resumed)
        assert app.chat.controller.get(resumed.key).messages == conv.messages
        note = [n.message for n in app.toasts if n.title == "Session"][-1]
        assert f"made with {other.info.name}" in note and "re-prefill" in note
        assert "\x1b" not in note and "Other model \\e[2J chat" in note


async def test_a_base_model_is_announced_when_it_is_ready(tiny_llama):
    """Started on a registered base model, the chat says so before its first echoing reply."""
    from dataclasses import replace

    app = ChatHost(tiny_llama, config=replace(chat_config(tiny_llama), model="gemma3-270m"))
    async with app.run_test(size=SIZE):
        await app.wait_for(ChatScreen.ModelReady)
        assert [n.title for n in app.toasts] == ["Base model"]
    plain = ChatHost(tiny_llama)
    async with plain.run_test(size=SIZE):
        await plain.wait_for(ChatScreen.ModelReady)
        assert not [n for n in plain.toasts if n.title == "Base model"]


async def test_a_cache_dir_that_is_a_file_is_a_notice_and_the_chat_goes_on(tiny_llama, tmp_path):
    not_a_dir = tmp_path / "cache"
    not_a_dir.write_text("a regular file")
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(not_a_dir)))
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.pause()
        assert any("disk cache off" in n.message for n in app.toasts)
        ended = await send(pilot, "still answered")
        assert ended.done is not None and not_a_dir.read_text() == "a regular file"
async def test_palette_lists_quit_once(tiny_llama):
    from ds4tui.screens.commands import ChatCommands

    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE):
        await app.wait_for(ChatScreen.ModelReady)
        system = [c.title for c in app.get_system_commands(app.chat)]
        ours = [name for name, _, _ in ChatCommands(app.chat)._commands()]
        assert (system + ours).count("Quit") == 1 and "Quit" in ours


async def test_a_parked_chat_keeps_its_context_and_its_own_status_line(tiny_llama):
    """Chat 1 goes to disk when chat 2 needs the one live slot; back on chat 1 the status bar
    shows chat 1's context (not 0) and chat 1's last cache event (not chat 2's)."""
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, live_sessions=1))
    async with app.run_test(size=SIZE) as pilot:
        first = await send(pilot, "First chat")
        tokens = app.chat.controller.get(first.key).context_tokens

        async def markers() -> dict:
            await pilot.pause()
            return {i.entry.key: str(i.query_one(".title", Label).render())[0] for i in app.chat.query(ChatItem)}

        await pilot.press("ctrl+n")
        new_key = app.chat._active
        assert (await markers())[new_key] == "●"  # a new chat has nothing parked on disk
        second = await send(pilot, "Second chat, a longer message than the first one")
        conv = app.chat.controller.get(first.key)
        assert not conv.live and conv.context_tokens == tokens
        assert (await markers())[first.key] == "○"
        status = app.chat.query_one(StatusBar)
        other = app.chat.controller.get(second.key).context_tokens
        assert status.cache == f"session saved ({other:,} tok)"
        await pilot.press("ctrl+pageup")
        assert status.ctx_used == tokens
        assert status.cache == f"session saved ({tokens:,} tok)"


async def test_pageup_from_the_message_box_scrolls_the_transcript(tiny_llama):
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hello")
        log = _pane(app).log
        log.show_messages([{"role": "user", "content": f"line {i}\n" * 4} for i in range(20)])
        await pilot.pause()
        log.scroll_end(animate=False)
        await pilot.pause()
        bottom = log.scroll_y
        assert app.chat.focused is app.chat.query_one("#prompt") and bottom > 0
        await pilot.press("pageup")
        assert log.scroll_y < bottom
        await pilot.press("pagedown")
        assert log.scroll_y == bottom


async def test_escape_in_a_later_prefill_withdraws_only_that_message(tiny_llama):
    """A chat with earlier turns: cancelling the next message's prefill removes that message
    and its empty reply and puts the text back; the earlier reply is not shown twice."""
    controller = GatedController(tiny_llama, chat_config(tiny_llama, no_disk_cache=True))
    controller.gate.set()
    app = ChatHost(tiny_llama, controller=controller)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "First question")
        before = [a.text for a in _pane(app).query(AssistantMessage)]
        controller.gate.clear()
        mark = len(app.seen)
        text = "word " * 420
        app.chat.query_one("#prompt").insert(text)
        await pilot.press("enter")
        await app.wait_for(ChatScreen.EngineEvent, lambda m: isinstance(m.event, ev.PrefillProgress), after=mark)
        await pilot.press("escape")
        ended = await app.wait_for(ChatScreen.TurnEnded, after=mark)
        await pilot.pause()
        assert ended.done is None
        assert [u.text for u in _pane(app).query(UserMessage)] == ["First question"]
        assert [a.text for a in _pane(app).query(AssistantMessage)] == before
        assert app.chat.query_one("#prompt").text == text


async def test_the_palette_shows_the_model_info_line(tiny_llama):
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        app.chat.action_model_info()
        await pilot.pause()
        line = tiny_llama.describe()
        assert line.startswith("llama, ") and "layers" in line and "chat:" in line
        assert any(n.message == line for n in app.toasts)


async def test_a_resumed_reply_cut_off_by_the_context_is_marked(tiny_llama):
    """A reply that ran into the end of the context is marked "■ context full" when the chat is
    resumed (the file's tokens fill the context it was written with), even with a larger
    context now. A stop by max_tokens (or the user) is not stored: that reply is not marked."""
    writer = make_controller(tiny_llama, ctx=64, max_tokens=500)
    full = writer.new_conversation()
    assert writer.send(full.key, "Hi " * 5, lambda e: None).stop == "context-full"
    writer = make_controller(tiny_llama, max_tokens=8)
    capped = writer.new_conversation()
    assert writer.send(capped.key, "Hello", lambda e: None).stop == "max-tokens"
    for conv, shown in ((full, "■ context full"), (capped, "")):
        app = ChatHost(tiny_llama, resume=conv.saved_sha[:12])
        async with app.run_test(size=SIZE) as pilot:
            assert (await app.wait_for(ChatScreen.Resumed)).error is None
            await pilot.pause()
            stats = _pane(app).query_one(AssistantMessage).query_one(".stats")
            assert str(stats.render()) == shown and stats.has_class("-empty") == (not shown)


async def test_the_app_shortens_the_gil_switch_interval_while_it_runs(tiny_llama):
    """A streaming reply's decode worker waits for the GIL while the UI renders: the app runs
    with a 1 ms switch interval (5 ms is Python's default) and gives the old one back."""
    import sys

    from ds4tui.screens.app import APP_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    assert before != APP_SWITCH_INTERVAL_S  # else the test shows nothing
    app = ChatHost(tiny_llama)
    async with app.run_test(size=SIZE):
        await app.wait_for(ChatScreen.ModelReady)
        assert sys.getswitchinterval() == APP_SWITCH_INTERVAL_S
    assert sys.getswitchinterval() == before
