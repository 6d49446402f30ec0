"""The chat layer's split of a reply into reasoning, answer and tool calls (chat/reply_view.py),
on what the real templates make models write, streamed in pieces of any size; the batcher
keeps the two kinds of text apart and in order; a remote server's `reasoning_content` and
streamed `tool_calls` become the same events."""

from __future__ import annotations

import pytest

from ds4tui.chat.events import Done, ReasoningText, TokenText, ToolCallShown
from ds4tui.chat.remote_stream import ReplyReader
from ds4tui.chat.reply_view import ReplyFormat, ReplySplitter, view_of
from ds4tui.chat.streaming import EventBatcher
from ds4tui.engine.text.reply_parts import syntax_of
from tests.serve.test_tools_parser import TEMPLATES

QWEN = ReplyFormat(syntax_of((TEMPLATES / "qwen2_5.jinja").read_text()))
TEXT = ('<think>\nFirst the weather.\n</think>\n\nChecking.\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>')
DONE = Done(tokens=1, tok_s=1.0, prompt_tokens=1, prefill_tok_s=1.0, ttft_ms=1.0, context_tokens=2, stop="eos")


def test_the_qwen_template_speaks_hermes():
    assert QWEN.syntax == "hermes"


def test_a_whole_reply_splits_into_its_three_parts():
    view = view_of(TEXT, QWEN)
    assert view.reasoning == "First the weather."
    assert view.content.strip() == "Checking."
    assert view.calls == (ToolCallShown("get_weather", '{"city": "Zürich"}'),)
    plain = view_of("No tags here <think> in the middle.", QWEN)
    assert plain.content == "No tags here <think> in the middle." and not plain.reasoning and not plain.calls


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_streamed_in_any_pieces_the_events_say_the_same(step):
    out: list = []
    split = ReplySplitter(out.append, QWEN)
    for i in range(0, len(TEXT), step):
        split(TokenText(TEXT[i:i + step]))
    split(DONE)
    reasoning = "".join(e.text for e in out if isinstance(e, ReasoningText))
    answer = "".join(e.text for e in out if isinstance(e, TokenText))
    assert reasoning.strip("\n") == "First the weather." and answer.strip() == "Checking."
    assert [e for e in out if isinstance(e, ToolCallShown)] == [ToolCallShown("get_weather", '{"city": "Zürich"}')]
    assert out[-1] is DONE  # what the parser held comes out before the turn's end
    assert "<tool_call>" not in answer and "<think>" not in answer


def test_a_prompt_that_opens_the_think_block_starts_in_reasoning():
    view = view_of("still thinking</think>The answer.", ReplyFormat(in_think=True))
    assert view.reasoning == "still thinking" and view.content == "The answer."


def test_the_batcher_joins_each_kind_apart_in_order():
    now = [0.0]
    out: list = []
    batch = EventBatcher(out.append, interval=10.0, clock=lambda: now[0])
    for event in (ReasoningText("a"), ReasoningText("b"), TokenText("c"), TokenText("d"), ReasoningText("e")):
        batch(event)
    batch.flush()
    assert out == [ReasoningText("a"), ReasoningText("b"), TokenText("cd"), ReasoningText("e")]


def test_a_remote_servers_reasoning_and_streamed_calls_become_events():
    out: list = []
    reader = ReplyReader(out.append, started=0.0)
    for delta in ({"reasoning_content": "Hmm, "}, {"reasoning_content": "weather."}, {"content": "Sure."},
                  {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '"Bern"}'}}]}):
        reader.feed({"choices": [{"delta": delta}]})
    reader.feed({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    assert [e for e in out if isinstance(e, ReasoningText)] == [ReasoningText("Hmm, "), ReasoningText("weather.")]
    assert reader.text == "Sure."  # the reasoning is not part of the reply kept in the history
    assert out[-1] == ToolCallShown("get_weather", '{"city": "Bern"}')


def test_deepseek_v4_with_thinking_on_starts_its_replies_in_reasoning():
    """DeepSeek V4's generation prompt ends in `<think>` when thinking is on (ds4's own
    rendering): the reply is reasoning up to `</think>`; thinking off, it is all answer."""
    from ds4tui.engine.text.dsv4_chat import Dsv4ChatTemplate

    on, off = ReplyFormat.of(Dsv4ChatTemplate(thinking=True)), ReplyFormat.of(Dsv4ChatTemplate(thinking=False))
    assert on.in_think and not off.in_think
    view = view_of("Compare both options.</think>Take the train.", on)
    assert (view.reasoning, view.content) == ("Compare both options.", "Take the train.")
    assert view_of("Take the train.", off) == view_of("Take the train.")
