"""A reply's reasoning and tool calls in the chat (issue 32): the reasoning folded above the
answer (collapsed until opened), each tool call as its own block, split by the chat layer
from what the model wrote, while it streams and when the chat is opened again from the store.

The model is tiny-llama with Qwen 2.5's own template (hermes `<tool_call>` syntax); what it
writes is forced by a scripted sampler, so the token bytes, the stream, the splitter, the
events and the widgets all run for real."""

from __future__ import annotations

import pytest
from textual.widgets import Markdown

from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.widgets.reply_parts import ReasoningFold, ToolCallsBlock
from tests.serve.test_tools import Script
from tests.serve.test_tools_parser import BOS, TEMPLATES
from tests.ui.chat_app import ChatHost, chat_config, send
from tests.ui.waiting import until

REPLY = ('<think>\nThe user wants the weather. I should call the tool.\n</think>\n\n'
         'Let me check **Zürich**.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>')


@pytest.fixture
def qwen_model(tiny_llama, monkeypatch):
    from ds4tui.chat import turn
    from ds4tui.engine.text.chat_templates import chat_template_for

    chat, _ = chat_template_for((TEMPLATES / "qwen2_5.jinja").read_text(), lambda t: False, "llama",
                                BOS["qwen2_5"])
    monkeypatch.setattr(tiny_llama, "chat", chat)
    Script.tokenizer = tiny_llama.tokenizer
    Script.replies = []
    monkeypatch.setattr(turn, "Sampler", Script)
    return tiny_llama


def _markdown_source(reply) -> str:
    return reply.query_one(Markdown).source


async def test_reasoning_is_folded_and_a_tool_call_is_a_block(qwen_model):
    Script.replies = [REPLY]
    app = ChatHost(qwen_model, config=chat_config(qwen_model, max_tokens=400, no_disk_cache=True))
    async with app.run_test(size=(100, 40)) as pilot:
        ended = await send(pilot, "Weather in Zürich?")
        assert ended.done is not None
        reply = app.chat._pane(app.chat._active).log.last_assistant
        await pilot.pause()
        fold = reply.query_one(ReasoningFold)
        assert fold.text.strip() == "The user wants the weather. I should call the tool."
        assert fold.collapsed and fold.display and str(fold.title) == "Reasoning (10 words)"
        assert not fold.query_one(".reasoning-text").region.height  # folded: its text takes no rows
        source = _markdown_source(reply)
        assert source.strip() == "Let me check **Zürich**."
        assert "<think>" not in source and "tool_call" not in source and reply.text == source
        calls = reply.query_one(ToolCallsBlock)
        assert calls.calls == [("get_weather", '{"city": "Zürich"}')]
        block = calls.query_one(".call")
        assert "get_weather" in str(block.border_title) and '"city": "Zürich"' in str(block.render())
        # The reasoning opens on Enter on its title (or a click), and closes again.
        fold.query_one("CollapsibleTitle").focus()
        await pilot.press("enter")
        await until(pilot, lambda: not fold.collapsed, "the fold opening")
        await pilot.pause()
        assert fold.query_one(".reasoning-text").region.height >= 1
        # The history keeps what the model wrote: the next prompt renders it as the template does.
        conv = app.chat.controller.get(app.chat._active)
        assert conv.messages[-1]["content"] == REPLY
        title = conv.display_title

    # Opened again from the store in a new app: the same three parts.
    again = ChatHost(qwen_model, config=chat_config(qwen_model, max_tokens=400, no_disk_cache=True), resume=title)
    async with again.run_test(size=(100, 40)) as pilot:
        resumed = await again.wait_for(ChatScreen.Resumed)
        assert resumed.error is None
        await pilot.pause()
        reply = again.chat._pane(resumed.key).log.last_assistant
        assert reply.reasoning.strip() == "The user wants the weather. I should call the tool."
        assert reply.query_one(ReasoningFold).collapsed
        assert _markdown_source(reply).strip() == "Let me check **Zürich**."
        assert reply.query_one(ToolCallsBlock).calls == [("get_weather", '{"city": "Zürich"}')]


async def test_a_reply_without_reasoning_shows_no_fold(qwen_model):
    Script.replies = ["Just an answer, no <b>tags</b>."]
    app = ChatHost(qwen_model, config=chat_config(qwen_model, max_tokens=400, no_disk_cache=True))
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "hi")
        reply = app.chat._pane(app.chat._active).log.last_assistant
        await pilot.pause()
        assert not reply.query_one(ReasoningFold).display
        assert not reply.query_one(ToolCallsBlock).display
        assert _markdown_source(reply) == "Just an answer, no <b>tags</b>."
