"""The chat screen on a remote engine (Pilot): it streams from `ds4tui serve`, shows the server's
cache reuse in the stats line, and a refused connection gives the typed text back."""

from __future__ import annotations

from ds4tui.chat import events as ev
from ds4tui.screens.widgets.chat_log import AssistantMessage
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
