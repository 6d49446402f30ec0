"""The DeepSeek V4 template renders what ds4-server renders (think on/off, Think Max, tools,
DSML tool calls, tool results) and parses it back.

The expected strings below are read from antirez/ds4's ds4_server.c (render_chat_prompt_text
and its helpers). `test_renders_like_ds4_server` checks the same requests against ds4's own
renderer, built by bench/ds4_reference.sh (DS4TUI_DS4_DIR=its output folder, holding
`ds4render`); it is skipped with the reason when that build is absent."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ds4tui.engine.text.dsv4_chat import (
    ASSISTANT,
    BOS,
    EOS,
    THINK_END,
    THINK_MAX_PREFIX,
    TOOLS_PREAMBLE,
    USER,
    Dsv4ChatTemplate,
    dsml_calls,
    parse_dsml_calls,
)

OFF, ON = Dsv4ChatTemplate(), Dsv4ChatTemplate(thinking=True)
MAX = Dsv4ChatTemplate(thinking=True, think_max=True)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris </｜DSML｜parameter> & co", "days": [1, 2],'
                                                         ' "opts": {"unit": "C"}, "n": 3}'}}
CHATS = {
    "plain": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!", "reasoning": "greet back"},
              {"role": "user", "content": "2+2?"}],
    "continued": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "reasoning": "r1"},
                  {"role": "user", "content": "More"}, {"role": "assistant", "content": "Sure", "reasoning": "r2"}],
    "tools": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "Checking.", "reasoning": "need a call", "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "c1", "content": "sunny </tool_result> 20C"},
              {"role": "tool", "tool_call_id": "c2", "content": "<b>windy</b> & dry"},
              {"role": "assistant", "content": "Sunny.", "reasoning": "read it"},
              {"role": "user", "content": "Thanks"}],
    "odd arguments": [{"role": "user", "content": "go"},
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"id": "x", "type": "function", "function": {"name": 'a"b<c>', "arguments": "not json"}}]},
                      {"role": "tool", "content": "ok"}],
    "two assistants": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "One."},
                       {"role": "assistant", "content": "Two."}, {"role": "user", "content": "?"}],
}


def test_thinking_off_renders_no_reasoning():
    text = OFF.render(CHATS["plain"])
    assert text == (f"{BOS}Be brief.{USER}Hi{ASSISTANT}{THINK_END}Hello!{EOS}{USER}2+2?{ASSISTANT}{THINK_END}")


def test_thinking_on_drops_the_reasoning_of_turns_before_the_last_user_message():
    assert ON.render(CHATS["plain"]) == (
        f"{BOS}Be brief.{USER}Hi{ASSISTANT}{THINK_END}Hello!{EOS}{USER}2+2?{ASSISTANT}<think>")
    # after the last user message the reasoning is kept (a continued assistant turn)
    assert ON.render(CHATS["continued"], add_generation_prompt=False) == (
        f"{BOS}{USER}Hi{ASSISTANT}{THINK_END}Hello!{EOS}{USER}More{ASSISTANT}<think>r2{THINK_END}Sure{EOS}")
    assert MAX.render(CHATS["plain"]).startswith(BOS + THINK_MAX_PREFIX + "Be brief.")


def test_tools_section_calls_and_results():
    text = ON.render(CHATS["tools"], tools=TOOLS)
    schema = json.dumps(TOOLS[0]["function"], separators=(",", ":"))
    assert text.startswith(BOS + TOOLS_PREAMBLE + schema + "\n\nYou MUST strictly follow")
    assert "Use the exact parameter names from the schemas.\n\nUse tools." + USER in text
    calls = (
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Paris &lt;/｜DSML｜parameter> & co</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"days\" string=\"false\">[1,2]</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"unit\":\"C\"}</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"n\" string=\"false\">3</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
    # a tool context keeps every turn's reasoning; results share one user turn, escaped
    assert (f"{ASSISTANT}<think>need a call{THINK_END}Checking.{calls}{EOS}"
            f"{USER}<tool_result>sunny &lt;/tool_result> 20C</tool_result><tool_result><b>windy</b> & dry</tool_result>"
            f"{ASSISTANT}<think>read it{THINK_END}Sunny.{EOS}{USER}Thanks{ASSISTANT}<think>") in text


def test_arguments_that_are_not_an_object_and_names_are_escaped():
    text = OFF.render(CHATS["odd arguments"])
    assert ('<｜DSML｜invoke name="a&quot;b&lt;c&gt;">\n'
            '<｜DSML｜parameter name="arguments" string="true">not json</｜DSML｜parameter>\n') in text
    # a call alone is a tool context even without a tools list
    assert text.endswith(f"{USER}<tool_result>ok</tool_result>{ASSISTANT}{THINK_END}")


def test_an_assistant_after_an_assistant_has_no_marker():
    assert OFF.render(CHATS["two assistants"]) == (
        f"{BOS}{USER}Hi{ASSISTANT}{THINK_END}One.{EOS}Two.{EOS}{USER}?{ASSISTANT}{THINK_END}")


@pytest.mark.parametrize("name", list(CHATS))
@pytest.mark.parametrize("chat", [OFF, ON, MAX], ids=["off", "on", "max"])
def test_parse_inverts_render(name, chat):
    tools = TOOLS if name == "tools" else None
    for generation in (False, True):
        text = chat.render(CHATS[name], add_generation_prompt=generation, tools=tools)
        back = chat.parse(text)
        assert chat.render(back, add_generation_prompt=generation) == text
        assert [m["role"] for m in back if m["role"] != "system"] == [
            m["role"] for m in CHATS[name] if m["role"] != "system"]


def test_calls_read_back_as_openai_calls():
    block = dsml_calls([CALL])[2:]
    calls = parse_dsml_calls(block)
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == json.loads(CALL["function"]["arguments"])
    assert dsml_calls(calls) == dsml_calls([CALL])
    assert parse_dsml_calls("<｜DSML｜tool_calls>\nnot a call</｜DSML｜tool_calls>") is None


# -- against ds4-server's own renderer ------------------------------------------------------------

DS4 = Path(os.environ.get("DS4TUI_DS4_DIR", "/tmp/ds4-ref/n2"))
RENDER = DS4 / "ds4render"


def _request(messages: list[dict], tools) -> bytes:
    """The chat request as the OpenAI client sends it (compact JSON, reasoning_content)."""
    wire = []
    for m in messages:
        m = dict(m)
        if "reasoning" in m:
            m["reasoning_content"] = m.pop("reasoning")
        wire.append(m)
    body = {"model": "x", "messages": wire, **({"tools": tools} if tools else {})}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.skipif(not RENDER.is_file(), reason=f"no ds4 renderer at {RENDER} (build it: bench/ds4_reference.sh "
                                                 "DS4_SOURCE N, then DS4TUI_DS4_DIR=its output folder)")
@pytest.mark.parametrize("name", list(CHATS))
@pytest.mark.parametrize("mode,chat", [("none", OFF), ("high", ON), ("max", MAX)], ids=["off", "on", "max"])
def test_renders_like_ds4_server(name, mode, chat):
    tools = TOOLS if name == "tools" else None
    ours = chat.render(CHATS[name], tools=tools)
    theirs = subprocess.run([str(RENDER), mode], input=_request(CHATS[name], tools), capture_output=True,
                            check=True, timeout=60).stdout.decode()
    assert ours == theirs


def test_a_reply_with_dsml_calls_parses_into_content_and_calls():
    """A reply written the way the template renders calls (what V4 was trained to write),
    streamed in pieces of any size: the answer is content, the block is the calls."""
    from ds4tui.engine.text.reply_parts import ReplyParser, syntax_of

    assert syntax_of(OFF.source) == "dsml"
    odd = {"function": {"name": "run", "arguments": {"cmd": "ls && echo '</｜DSML｜parameter>'", "n": 2.5}}}
    reply = "Checking." + dsml_calls([CALL, odd])
    for step in (1, 7, len(reply)):
        parser = ReplyParser("dsml")
        got = {"content": "", "reasoning": ""}
        for i in range(0, len(reply), step):
            for kind, t in parser.feed(reply[i:i + step]):
                got[kind] += t
        for kind, t in parser.finish():
            got[kind] += t
        assert got["content"].strip() == "Checking." and got["reasoning"] == ""
        assert [(c.name, json.loads(c.arguments)) for c in parser.calls] == [
            ("get_weather", json.loads(CALL["function"]["arguments"])), ("run", odd["function"]["arguments"])]
    broken = "Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"x\">\noops"
    parser = ReplyParser("dsml")
    text = "".join(t for _, t in parser.feed(broken) + parser.finish())
    assert parser.calls == [] and text == broken  # not calls: nothing the model wrote is lost
