"""The conversation store on screen, with Pilot: the chat list comes from the store, a
budget that evicts every .kv file loses no chat, reply versions and forks survive a
restart of the app, and delete (asked first) leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.widgets.chat_log import AssistantMessage
from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog
from ds4tui.screens.widgets.conversation_list import TEXT_ONLY, ChatItem, ConversationList
from tests.chat.conftest import make_controller
from tests.ui.chat_app import SIZE, ChatHost, chat_config, send
from tests.ui.waiting import until


def _kv(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.kv"))


async def _open_row(app, pilot, predicate) -> ChatScreen.Resumed:
    sidebar = app.chat.query_one("#sidebar")
    row = next(i for i in sidebar.query(ChatItem) if predicate(i.entry))
    sidebar.index = list(sidebar.query(ChatItem)).index(row)
    sidebar.focus()
    mark = len(app.seen)
    await pilot.press("enter")
    return await app.wait_for(ChatScreen.Resumed, after=mark)


async def test_after_a_budget_evicts_every_file_every_chat_is_listed_and_answers(tiny_llama, tmp_path):
    writer = make_controller(tiny_llama, tmp_path)
    chats = []
    for text in ("Capital of France?", "Capital of Spain?", "Capital of Peru?"):
        conv = writer.new_conversation()
        writer.send(conv.key, text, lambda e: None)
        chats.append(conv)
    writer.shutdown()
    writer.checkpoints.store.evict(budget_bytes=1)  # what --budget-mb does to a full directory
    assert _kv(tmp_path) == []

    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        ids = {c.store_id for c in chats}
        drawn = await app.wait_for(ConversationList.Redrawn,
                                   lambda m: ids <= {e.chat_id for e in m.entries if e.chat_id})
        rows = [e for e in drawn.entries if e.chat_id in ids]
        assert all(e.text_only for e in rows) and {e.title for e in rows} == {c.title for c in chats}
        sidebar = app.chat.query_one("#sidebar")
        marker = [str(i.query_one(".title").render()) for i in sidebar.query(ChatItem) if i.entry.chat_id in ids]
        assert all(m.startswith(TEXT_ONLY) for m in marker)
        resumed = await _open_row(app, pilot, lambda e: e.chat_id == chats[1].store_id)
        conv = app.chat.controller.get(resumed.key)
        assert conv.messages == chats[1].messages
        note = [n.message for n in app.toasts if n.title == "Session"][-1]
        assert "history kept, KV evicted: re-prefill" in note
        ended = await send(pilot, "And its population?")
        assert ended.done is not None and ended.done.cache.source == "cold"
        assert len(app.chat._pane(resumed.key).log.query(AssistantMessage)) == 2


async def test_versions_and_forks_survive_a_restart_of_the_app(tiny_llama, tmp_path):
    config = chat_config(tiny_llama, cache_dir=str(tmp_path), temperature=1.0, seed=5)
    first = ChatHost(tiny_llama, config=config)
    async with first.run_test(size=SIZE) as pilot:
        await send(pilot, "Tell me something.")
        ctl, key = first.chat.controller, first.chat._active
        mark = len(first.seen)
        await pilot.press("ctrl+r")
        await first.wait_for(ChatScreen.TurnEnded, after=mark)
        conv = ctl.get(key)
        versions = dict(conv.alternatives)
        fork = ctl.fork(key, len(conv.messages))
        store_id, fork_id = conv.store_id, fork.store_id
        assert versions and fork_id
        first.chat.save_and_exit()
        await pilot.pause()

    second = ChatHost(tiny_llama, config=config)
    async with second.run_test(size=SIZE) as pilot:
        await second.wait_for(ConversationList.Redrawn,
                              lambda m: {store_id, fork_id} <= {e.chat_id for e in m.entries})
        resumed = await _open_row(second, pilot, lambda e: e.chat_id == store_id)
        ctl = second.chat.controller
        reopened = ctl.get(resumed.key)
        assert reopened.alternatives == versions
        index = len(reopened.messages) - 1
        assert ctl.alternatives(resumed.key, index)[1] == 2
        stats = str(second.chat._pane(resumed.key).log.last_assistant.query_one(".stats").render())
        assert "version 2/2" in stats
        assert ctl.history.store.get(fork_id).forked_from == store_id


async def test_delete_from_the_sidebar_asks_then_leaves_no_file_and_no_row(tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Keep me.")
        keep = app.chat.controller.get(app.chat._active)
        await pilot.press("ctrl+n")
        await send(pilot, "Delete me.")
        gone = app.chat.controller.get(app.chat._active)
        sha, chat_id = gone.saved_sha, gone.store_id
        assert (tmp_path / f"{sha}.kv").exists()
        sidebar = app.chat.query_one("#sidebar")
        row = next(i for i in sidebar.query(ChatItem) if i.entry.key == gone.key)
        sidebar.index = list(sidebar.query(ChatItem)).index(row)
        sidebar.focus()
        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        await pilot.press("y")
        await app.wait_for(ConversationList.Redrawn,
                           lambda m: all(e.key != gone.key and e.chat_id != chat_id for e in m.entries))
        assert not (tmp_path / f"{sha}.kv").exists()
        assert app.chat.controller.history.store.get(chat_id) is None
        assert app.chat._active == keep.key
        app.chat.save_and_exit()
        await pilot.pause()
    # Quitting wrote nothing of it again.
    assert all(b"Delete me." not in p.read_bytes() for p in _kv(tmp_path))


async def test_deleting_a_chat_with_a_pinned_file_asks_twice_as_the_cache_browser_does(tiny_llama, tmp_path):
    """The palette's "Delete chat" removes the chat's .kv files: a pinned one goes only after
    the second question (the cache browser's, confirm_delete); one "yes" then "no" keeps all."""
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Pinned chat.")
        conv = app.chat.controller.get(app.chat._active)
        sha, chat_id = conv.saved_sha, conv.store_id
        assert app.chat.controller.checkpoints.store.set_pinned(sha, True)

        async def ask() -> str:
            app.chat.action_delete_chat()  # the palette's "Delete chat"
            await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the first question")
            first = app.screen
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen is not first,
                        "the second question")
            return str(app.screen.query_one(".question").render())

        assert "PINNED" in await ask()
        await pilot.press("n")
        await until(pilot, lambda: app.screen is app.chat and not app.chat._engine_job, "the questions to close")
        assert (tmp_path / f"{sha}.kv").exists() and app.chat.controller.history.store.get(chat_id) is not None
        await ask()
        await pilot.press("y")
        await until(pilot, lambda: not (tmp_path / f"{sha}.kv").exists(), "the pinned file to go")
        await until(pilot, lambda: app.chat.controller.history.store.get(chat_id) is None, "the chat to go")


async def test_switch_model_keeps_the_chats_and_reopens_the_one_on_screen(tiny_llama, tmp_path):
    """Palette "Switch model": the chat on screen reopens on the new model from its history
    (its messages all there; the next message re-prefills), and the old model's chats stay listed."""
    from ds4tui.engine.registry import DEFAULT_MODEL, REGISTRY, is_installed
    from ds4tui.screens.chat_model_switch import ModelSwitched
    from ds4tui.screens.widgets.choice_dialog import ChoiceDialog

    if not is_installed(REGISTRY[DEFAULT_MODEL]):
        import pytest

        pytest.fail(f"{DEFAULT_MODEL} is not pulled (`make test` pulls it)")
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hello from the tiny model.")
        before = app.chat.controller.get(app.chat._active)
        messages, store_id = [dict(m) for m in before.messages], before.store_id
        app.chat.action_switch_model()
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ChoiceDialog)
        mark = len(app.seen)
        dialog.query_one("#choice-1").press()
        switched = await app.wait_for(ModelSwitched, after=mark, timeout=300)  # loads a real model
        assert switched.error is None and switched.spec == DEFAULT_MODEL
        resumed = await app.wait_for(ChatScreen.Resumed, after=mark)
        ctl = app.chat.controller
        assert ctl.config.model == DEFAULT_MODEL and ctl.model_name != tiny_llama.info.name
        conv = ctl.get(resumed.key)
        assert conv.store_id == store_id and conv.messages == messages and not conv.live
        note = [n.message for n in app.toasts if n.title == "Session"][-1]
        assert f"made with {tiny_llama.info.name}" in note and "re-prefill" in note
