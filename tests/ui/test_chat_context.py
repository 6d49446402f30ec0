"""What the chat says about a chat's context (Pilot): the meter of a fork parked on its file
(it read 0/4,096 for a fork holding 203 tokens), the toast of a resumed chat (a remote one said
"(0 tokens, no prefill)"; the embedded engine said "the server re-reads" for a chat made on a
server), and a remote engine's model and context known at start (the URL is probed first)."""

from __future__ import annotations

import httpx

from ds4tui.chat.remote import RemoteChatController
from ds4tui.config import Config
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.widgets.chat_log import UserMessage
from ds4tui.screens.widgets.status_bar import StatusBar
from tests.ui.chat_app import SIZE, ChatHost, chat_config, send
from tests.ui.waiting import until


async def test_a_fork_parked_on_its_file_shows_its_context(tiny_llama, tmp_path):
    """Edit and resend keeps the old continuation as a fork parked on the chat's file: shown,
    the meter counts that file's tokens."""
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "First question.")
        await send(pilot, "Second question.")
        ctl, key = app.chat.controller, app.chat._active
        held = ctl.get(key).saved_upto
        assert held > 0
        app.chat._pane(key).log.query(UserMessage).last().focus()
        await pilot.press("e")
        prompt = app.chat.query_one("#prompt")
        prompt.load_text("Second question, edited.")
        mark = len(app.seen)
        await pilot.press("enter")
        await app.wait_for(ChatScreen.TurnEnded, after=mark)
        [fork] = [c for c in ctl.list() if c.display_title.endswith("(fork)")]
        assert not fork.live
        await until(pilot, lambda: app.chat._pane_or_none(fork.key) is not None, "the fork's pane")
        while app.chat._active != fork.key:
            await pilot.press("ctrl+pagedown")
        status = app.chat.query_one(StatusBar)
        assert status.ctx_used == held and status.ctx_total == ctl.ctx_size()
        assert f"{held}/" in status.line() or f"{held:,}/" in status.line()


def _stored_remote_chat(data_dir, title: str) -> None:
    ctl = RemoteChatController("http://gpu-box:8008/v1", Config(data_dir=str(data_dir)), model="qwen3-8b")
    conv = ctl.new_conversation()
    conv.title = title
    conv.messages += [{"role": "user", "content": title}, {"role": "assistant", "content": "Madrid."}]
    ctl.history.commit(conv)
    ctl.history.store.close()


async def test_a_chat_made_on_a_server_resumed_here_says_what_it_costs_here(tiny_llama, tmp_path):
    _stored_remote_chat(tmp_path / "data", "Capital of Spain?")
    config = chat_config(tiny_llama, cache_dir=str(tmp_path / "kv"), data_dir=str(tmp_path / "data"))
    app = ChatHost(tiny_llama, config=config, resume="Capital of Spain")
    async with app.run_test(size=SIZE) as pilot:
        assert (await app.wait_for(ChatScreen.Resumed)).error is None
        await pilot.pause()
        note = [n.message for n in app.toasts if n.title == "Session"][-1]
        assert "re-prefill" in note and "server" not in note  # this engine prefills it, no server


async def test_a_resumed_remote_chat_says_the_server_rereads_it(tiny_llama, tmp_path):
    _stored_remote_chat(tmp_path / "data", "Capital of Spain?")
    ctl = RemoteChatController("http://gpu-box:8008/v1", Config(data_dir=str(tmp_path / "data")), model="qwen3-8b")
    app = ChatHost(tiny_llama, controller=ctl, resume="Capital of Spain")
    async with app.run_test(size=SIZE) as pilot:
        assert (await app.wait_for(ChatScreen.Resumed)).error is None
        await pilot.pause()
        note = [n.message for n in app.toasts if n.title == "Session"][-1]
        assert note == "Resumed Capital of Spain? (2 messages): the server re-reads its history at the next message"
        assert "0 tokens" not in note


async def test_a_probed_server_shows_its_model_and_context_at_start(tiny_llama, tmp_path):
    models = [{"id": "qwen3-8b", "max_model_len": 32768}]
    never = httpx.MockTransport(lambda request: httpx.Response(500))  # nothing is sent in this test
    ctl = RemoteChatController("http://gpu-box:8008/v1", Config(data_dir=str(tmp_path)), models=models,
                               transport=never)
    app = ChatHost(tiny_llama, controller=ctl)
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        await pilot.pause()
        status = app.chat.query_one(StatusBar)
        assert status.model_name == "qwen3-8b @ gpu-box" and status.ctx_total == 32768
        assert "ctx ▱▱▱▱▱▱▱▱ 0/32,768" in status.line()
