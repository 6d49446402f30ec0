"""Tools end to end with the official `openai` client: the request's tools rendered by the
model's own template (Qwen 2.5's and Llama 3.1's, typed into tests/engine/text/templates), the
model's output parsed back into `tool_calls` (stream and not), the call and its result sent
back as messages and rendered again, and `reasoning_content` from a think block.

The model is tiny-llama with the template swapped in; what it writes is forced by a scripted
sampler (the tokens of a reply in the template's own call syntax, then EOS), so everything
after the sampler (token bytes, stop strings, the parser, the wire format) runs for real."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.serve.test_tools_parser import BOS, TEMPLATES, WEATHER

CALLS = {
    "qwen2_5": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
    "llama3_1": '{"name": "get_weather", "parameters": {"city": "Zürich"}}',
}


class Script:
    """Replaces the turn's Sampler: each reply is the next scripted text's tokens, then EOS."""

    replies: list[str] = []
    tokenizer = None

    def __init__(self, params=None) -> None:
        text = Script.replies.pop(0)
        self.tokens = list(Script.tokenizer.encode(text)) + [min(Script.tokenizer.eos_ids)]

    def __call__(self, logits) -> int:
        return self.tokens.pop(0)


@pytest.fixture(params=["qwen2_5", "llama3_1"])
def tool_server(request, monkeypatch):
    from ds4tui.chat import turn
    from ds4tui.chat.stateless import StatelessChats
    from ds4tui.engine.loader import load_model
    from ds4tui.engine.text.chat_templates import chat_template_for
    from ds4tui.serve.app import create_app
    from ds4tui.serve.worker import EngineQueue
    from tests.serve.conftest import greedy_controller

    name = request.param
    model = load_model("tiny-llama")  # the process's shared instance: its template is put back after
    chat, _ = chat_template_for((TEMPLATES / f"{name}.jinja").read_text(), lambda t: False, "llama", BOS[name])
    monkeypatch.setattr(model, "chat", chat)
    Script.tokenizer = model.tokenizer
    Script.replies = []
    monkeypatch.setattr(turn, "Sampler", Script)
    engine = EngineQueue(StatelessChats(greedy_controller(model, max_tokens=200)), max_waiting=4)
    app = create_app(engine, model_name="tiny-tools", api_key=None, max_body_bytes=1 << 20)
    client = openai.AsyncOpenAI(base_url="http://serve.test/v1", api_key="unused", max_retries=0,
                                http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=60))
    yield name, model, client
    engine.close()


async def test_a_call_comes_back_as_tool_calls_and_its_result_goes_in(tool_server):
    name, model, client = tool_server
    user = [{"role": "user", "content": "What is the weather in Zürich?"}]
    Script.replies = [CALLS[name], CALLS[name], "It is sunny in Zürich."]

    r = await client.chat.completions.create(model="tiny-tools", messages=user, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Zürich"}
    # the prompt was the template's rendering with the tools
    prompt = model.chat.render(user, True, tools=[WEATHER])
    assert "get_weather" in prompt and r.usage.prompt_tokens == len(model.tokenizer.encode(prompt))

    stream = await client.chat.completions.create(model="tiny-tools", messages=user, tools=[WEATHER], stream=True)
    chunks = [ch async for ch in stream]
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        (0, "get_weather", {"city": "Zürich"})]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == [
        "tool_calls"]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ""

    # the round trip: the assistant's call and the tool's result, rendered by the template
    history = user + [choice.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 °C"}]
    final = await client.chat.completions.create(model="tiny-tools", messages=history, tools=[WEATHER])
    assert final.choices[0].message.content == "It is sunny in Zürich."
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    rendered = model.chat.render([user[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 °C"}], True, tools=[WEATHER])
    assert "sunny, 21 °C" in rendered
    assert final.usage.prompt_tokens == len(model.tokenizer.encode(rendered))


async def test_plain_text_and_no_tools(tool_server):
    name, _, client = tool_server
    Script.replies = ["Just words, no call.", CALLS[name]]
    r = await client.chat.completions.create(model="tiny-tools", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER])
    assert r.choices[0].message.content == "Just words, no call." and not r.choices[0].message.tool_calls
    # without tools in the request, call-shaped text is just text
    r = await client.chat.completions.create(model="tiny-tools", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == CALLS[name] and r.choices[0].finish_reason == "stop"


async def test_reasoning_content(tool_server):
    _, _, client = tool_server
    text = "<think>\nThe user greets me.\n</think>\n\nHello!"
    Script.replies = [text, text]
    r = await client.chat.completions.create(model="tiny-tools", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello!"
    assert r.choices[0].message.model_extra["reasoning_content"] == "\nThe user greets me.\n"
    stream = await client.chat.completions.create(model="tiny-tools", messages=[{"role": "user", "content": "hi"}],
                                                  stream=True)
    chunks = [ch async for ch in stream]
    reasoning = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content", "")
                        for ch in chunks if ch.choices)
    assert reasoning == "\nThe user greets me.\n"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hello!"


async def test_forced_tool_choice_is_refused(tool_server):
    _, _, client = tool_server
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="tiny-tools", messages=[{"role": "user", "content": "hi"}],
                                             tools=[WEATHER], tool_choice="required")
    assert err.value.body["param"] == "tool_choice"
