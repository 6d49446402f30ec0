"""Tool calls and reasoning parsed back from replies, on what the real templates write: an
assistant turn with tool calls rendered by Qwen 2.5's and Llama 3.1's own templates (the
model was trained to write exactly that) must parse back into the same calls, streamed in any
split as whole; DeepSeek's syntax and think blocks from typed samples of their documented form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4tui.engine.text.chat_templates import chat_template_for
from ds4tui.engine.text.reply_parts import ReplyParser, parse_calls, syntax_of

TEMPLATES = Path(__file__).parents[1] / "engine" / "text" / "templates"
BOS = {"qwen2_5": "", "llama3_1": "<|begin_of_text|>", "llama3_2": "<|begin_of_text|>"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather <now> in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def template(name):
    chat, _ = chat_template_for((TEMPLATES / f"{name}.jinja").read_text(), lambda t: False, "llama", BOS[name])
    return chat


def assistant_text(chat, calls: list[dict], content: str = "") -> str:
    """What the template writes for an assistant turn holding `calls` (the model's own output)."""
    user = [{"role": "user", "content": "weather?"}]
    prompt = chat.render(user, True, tools=[WEATHER])
    msg = {"role": "assistant", "content": content,
           "tool_calls": [{"id": f"c{i}", "type": "function", "function": c} for i, c in enumerate(calls)]}
    whole = chat.render(user + [msg], False, tools=[WEATHER])
    assert whole.startswith(prompt)
    text = whole[len(prompt):]
    for end in chat.stop_strings:  # the end of turn is a stop string: the reply never holds it
        text = text.split(end)[0]
    return text


def run(parser: ReplyParser, text: str, pieces: int) -> tuple[dict, list]:
    got = {"content": "", "reasoning": ""}
    step = max(1, len(text) // pieces)
    for i in range(0, len(text), step):
        for kind, t in parser.feed(text[i:i + step]):
            got[kind] += t
    for kind, t in parser.finish():
        got[kind] += t
    return got, parser.calls


@pytest.mark.parametrize("name", ["qwen2_5", "llama3_1"])
def test_calls_written_as_the_template_writes_them_parse_back(name):
    chat = template(name)
    syntax = syntax_of(chat.source)
    assert syntax == {"qwen2_5": "hermes", "llama3_1": "llama3"}[name]
    calls = [{"name": "get_weather", "arguments": {"city": "Zürich", "days": [1, 2]}}]
    if name == "qwen2_5":
        calls.append({"name": "get_weather", "arguments": {"city": "Oslo <north>"}})
    text = assistant_text(chat, calls)
    for pieces in (1, 3, len(text)):  # whole, a few chunks, one character at a time
        got, parsed = run(ReplyParser(syntax), text, pieces)
        assert got == {"content": "", "reasoning": ""}, text
        assert [(c.name, json.loads(c.arguments)) for c in parsed] == [(c["name"], c["arguments"]) for c in calls]
        assert len({c.id for c in parsed}) == len(parsed)


def test_text_before_a_hermes_call_streams_as_content():
    chat = template("qwen2_5")
    text = assistant_text(chat, [{"name": "get_weather", "arguments": {"city": "Rome"}}], content="Let me check.")
    assert text.startswith("Let me check.") and "<tool_call>" in text
    got, calls = run(ReplyParser("hermes"), text, len(text))
    assert got["content"].strip() == "Let me check." and [c.name for c in calls] == ["get_weather"]
    # without tools in the request the same text is plain content
    got, calls = run(ReplyParser(None), text, 5)
    assert got["content"] == text and calls == []


def test_a_broken_call_is_content_and_nothing_is_lost():
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
    got, calls = run(ReplyParser("hermes"), text, 7)
    assert calls == [] and got["content"] == text
    plain = "Not a call: {curly} text"
    got, calls = run(ReplyParser("llama3"), plain, 4)
    assert calls == [] and got["content"] == plain
    assert parse_calls("llama3", '{"name": "f", "parameters": [1]}') is None


def test_llama3_python_tag_and_several_objects():
    text = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
    got, calls = run(ReplyParser("llama3"), text, 9)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1}), ("b", {})]
    assert got["content"] == ""


def test_deepseek_calls():
    text = ("I will look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
            "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    got, calls = run(ReplyParser("deepseek"), text, 11)
    assert got["content"] == "I will look." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]


@pytest.mark.parametrize("in_think,text", [
    (False, "<think>\nThe user wants weather.\n</think>\n\nIt is sunny."),
    (True, "The user wants weather.\n</think>\n\nIt is sunny."),  # the prompt opened the block
])
def test_reasoning_is_split_from_content(in_think, text):
    for pieces in (1, 4, len(text)):
        got, _ = run(ReplyParser(None, in_think=in_think), text, pieces)
        assert got == {"reasoning": "\nThe user wants weather.\n" if not in_think else "The user wants weather.\n",
                       "content": "It is sunny."}


def test_reasoning_then_a_call():
    text = '<think>need a tool</think>\n<tool_call>\n{"name": "f", "arguments": {"a": "b"}}\n</tool_call>'
    got, calls = run(ReplyParser("hermes"), text, 6)
    assert got == {"reasoning": "need a tool", "content": ""} and calls[0].name == "f"


def test_rendering_with_tools_equals_transformers():
    import transformers.utils.chat_template_utils as ctu

    for name in ("qwen2_5", "llama3_1"):
        chat = template(name)
        messages = [{"role": "user", "content": "weather in Zürich?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "c0", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
                    {"role": "tool", "tool_call_id": "c0", "content": "sunny, 21 °C"}]
        expected, _ = ctu.render_jinja_template([messages], tools=[WEATHER], chat_template=chat.source,
                                                add_generation_prompt=True, bos_token=BOS[name], eos_token="",
                                                date_string="26 Jul 2024")
        assert chat.render(messages, True, tools=[WEATHER]) == expected[0], name


def test_leading_whitespace_is_content_unless_it_follows_a_think_block():
    for syntax in (None, "hermes", "llama3"):
        got, _ = run(ReplyParser(syntax), "  hello", 7)
        assert got["content"] == "  hello", syntax
