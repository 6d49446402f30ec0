"""`ds4tui serve` driven by the official `openai` client (and raw HTTP where the client hides it)."""

from __future__ import annotations

import json
import subprocess
import threading

import httpx
import openai
import pytest

from tests.serve.conftest import API_KEY, free_port, isolated_env, running_server, serve_command

LONG = "The quick brown fox jumps over the lazy dog, again and again. " * 50  # ~1350 tiny-llama tokens


def client(server, **kw) -> openai.OpenAI:
    kw.setdefault("api_key", "unused")
    return openai.OpenAI(base_url=server.url, max_retries=0, timeout=300, **kw)


def ask(c: openai.OpenAI, messages, **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    return c.chat.completions.create(model="tiny-llama", messages=messages, **kw)


def reference(model, messages, max_tokens=8) -> str:
    """The greedy reply of the embedded engine (cold prefill of the same rendered prompt)."""
    from tests.serve.conftest import reference_replies

    return reference_replies(model, [messages], max_tokens)[0]


def test_models_and_health(server):
    [model] = client(server).models.list().data
    assert model.id == "tiny-llama" and model.max_model_len == 2048  # the context, as vLLM names it
    state = server.health()
    assert state["status"] == "ok" and state["model"] == "tiny-llama"


def test_reply_and_usage_equal_the_embedded_engine(server, tiny_llama):
    messages = [{"role": "user", "content": "usage test: name three colours"}]
    r = ask(client(server), messages)
    prompt = tiny_llama.chat.render(messages, add_generation_prompt=True)
    assert r.usage.prompt_tokens == len(tiny_llama.tokenizer.encode(prompt))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == reference(tiny_llama, messages)
    assert (r.choices[0].finish_reason == "length") == (r.usage.completion_tokens == 8)


def test_stream_equals_non_stream_with_progress_and_usage(server):
    c = client(server)
    messages = [{"role": "user", "content": "stream test: count to five " * 3}]
    whole = ask(c, messages, max_tokens=10)
    chunks = list(ask(c, messages, max_tokens=10, stream=True, stream_options={"include_usage": True},
                      extra_body={"return_progress": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # The same prompt again: the first request's session holds all of it (chat/sharing.py).
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= whole.usage.prompt_tokens - 1
    # Progress of a prompt that has something to prefill.
    fresh = [{"role": "user", "content": "progress test: name five rivers " * 3}]
    chunks = list(ask(c, fresh, max_tokens=4, stream=True, stream_options={"include_usage": True},
                      extra_body={"return_progress": True}))
    progress = [ch.model_extra["prompt_progress"] for ch in chunks if "prompt_progress" in (ch.model_extra or {})]
    assert progress, "no prefill progress chunk"
    last = progress[-1]
    assert last["processed"] == last["total"] == chunks[-1].usage.prompt_tokens
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)


def test_second_turn_reuses_the_first(server):
    c = client(server)
    messages = [{"role": "user", "content": "cache test: first question"}]
    first = ask(c, messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "and a second one"}]
    second = ask(c, messages)
    cached2 = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens
    assert cached2 >= first.usage.prompt_tokens  # the whole first prompt (and its reply) was reused
    assert cached2 < second.usage.prompt_tokens


def test_stop_strings_cut_the_reply(server, tiny_llama):
    c = client(server)
    messages = [{"role": "user", "content": "stop test: say something long"}]
    full = ask(c, messages, max_tokens=24).choices[0].message.content
    stop = full[len(full) // 2: len(full) // 2 + 2]
    assert stop.strip(), "the reply is too short to cut"
    cut = ask(c, messages, max_tokens=24, stop=[stop])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in ask(c, messages, max_tokens=24, stop=stop, stream=True)
                       if ch.choices)
    assert streamed == full[: full.index(stop)]


def test_bad_requests_get_openai_errors_and_the_server_goes_on(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as err:
        ask(c, [{"role": "user", "content": "x"}], temperature=9)
    assert err.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="tiny-llama", messages=[{"role": "tool", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="tiny-llama", messages=[])
    raw = httpx.post(f"{server.url}/chat/completions", content=b"{not json", timeout=120)
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    big = httpx.post(f"{server.url}/chat/completions", content=b"x" * (9 << 20), timeout=300)
    assert big.status_code == 413 and "exceeds" in big.json()["error"]["message"]
    missing = httpx.get(f"{server.root}/v1/nothing-here", timeout=120)
    assert missing.status_code == 404 and "error" in missing.json()
    with pytest.raises(openai.BadRequestError) as err:
        ask(c, [{"role": "user", "content": LONG * 2}], max_tokens=2)
    assert err.value.body["code"] == "context_length_exceeded"
    assert ask(c, [{"role": "user", "content": "still alive?"}], max_tokens=2).choices[0].message.content is not None
    assert server.health()["failed"] >= 1


def test_a_model_not_served_here_is_a_404_naming_the_one_that_is(server):
    """As OpenAI answers a model it does not have (404 model_not_found; the client raises
    NotFoundError), streamed or not; the served model's names are taken in any case."""
    c = client(server)
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as err:
            c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                      stream=stream)
        body = err.value.body
        assert body["code"] == "model_not_found" and body["param"] == "model"
        assert "'gpt-4o'" in body["message"] and "'tiny-llama'" in body["message"] and "--alias" in body["message"]
    r = c.chat.completions.create(model="Tiny-Llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.model == "tiny-llama"
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="davinci-002", prompt="Once upon a time", max_tokens=2)
    no_name = httpx.post(f"{server.url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                 "max_tokens": 2}, timeout=300)
    assert no_name.status_code == 200 and no_name.json()["model"] == "tiny-llama"  # as llama-server


async def test_aliases_are_listed_and_answered_and_a_star_takes_any_name(tiny_llama):
    from ds4tui.chat.stateless import StatelessChats
    from ds4tui.serve.app import create_app
    from ds4tui.serve.model_names import ServedNames
    from ds4tui.serve.worker import EngineQueue
    from tests.serve.conftest import greedy_controller

    engine = EngineQueue(StatelessChats(greedy_controller(tiny_llama, max_tokens=2)), max_waiting=4)
    try:
        for aliases, agent_name in ((("gpt-4o-mini",), "gpt-4o-mini"), (("*",), "claude-whatever")):
            names = ServedNames("tiny-llama", aliases=aliases, spec="/models/tiny-llama.gguf")
            app = create_app(engine, model_name=names, api_key=None, max_body_bytes=1 << 20)
            c = openai.AsyncOpenAI(base_url="http://serve.test/v1", api_key="unused", max_retries=0,
                                   http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=120))
            listed = [m.id for m in (await c.models.list()).data]
            assert listed == ["tiny-llama", *(a for a in aliases if a != "*")]
            for name in (agent_name, "tiny-llama.gguf", "/models/tiny-llama.gguf"):
                r = await c.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
                assert r.model == "tiny-llama" and r.choices[0].message.content is not None
            if aliases != ("*",):
                with pytest.raises(openai.NotFoundError) as err:
                    await c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
                message = err.value.body["message"]
                assert "also accepted: 'tiny-llama.gguf', 'gpt-4o-mini')" in message and "/models" not in message
    finally:
        engine.close()


def test_client_disconnect_cancels_the_request(server):
    before = server.health()
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "disconnect " + LONG}],
            "max_tokens": 64, "temperature": 0, "stream": True, "return_progress": True}
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if "prompt_progress" in line:
                break  # the server is prefilling: hang up now
    state = server.wait_health(lambda s: s["cancelled"] > before["cancelled"] and s["running"] == 0)
    assert state["cancelled"] == before["cancelled"] + 1
    assert state["served"] == before["served"]


def test_non_loopback_host_needs_an_api_key(tmp_path):
    out = subprocess.run(serve_command("--model", "tiny-llama", "--host", "0.0.0.0", "--port", str(free_port())),
                         capture_output=True, text=True, timeout=300, env=isolated_env(tmp_path))
    assert out.returncode == 1 and "API key" in out.stderr


def test_api_key_and_full_queue(tmp_path):
    env = isolated_env(tmp_path, DS4TUI_TEST_KEY=API_KEY)
    with running_server(tmp_path, "--api-key-env", "DS4TUI_TEST_KEY", "--queue-size", "0",
                        "--parallel", "1", env=env) as server:
        assert httpx.get(f"{server.root}/health", timeout=60).status_code == 200  # health stays public
        for key in ("wrong-key", "wrong-key-" + API_KEY):
            with pytest.raises(openai.AuthenticationError):
                client(server, api_key=key).models.list()
        anonymous = httpx.post(f"{server.url}/chat/completions", json={"messages": []}, timeout=120)
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
        good = client(server, api_key=API_KEY)
        assert ask(good, [{"role": "user", "content": "hello"}], max_tokens=2).usage.completion_tokens >= 1

        # One request prefills a long prompt; with no room to wait, requests that arrive while
        # it runs are refused. The tiny model answers in tens of milliseconds, so a burst of
        # eight goes out at its first progress chunk: some land while it (or one of them) runs.
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "queue " + LONG}],
                "max_tokens": 64, "temperature": 0, "stream": True, "return_progress": True}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        refused: list[openai.RateLimitError] = []
        answered: list[object] = []

        def another() -> None:
            try:
                answered.append(ask(client(server, api_key=API_KEY), [{"role": "user", "content": "me too"}],
                                    max_tokens=2))
            except openai.RateLimitError as exc:
                refused.append(exc)

        with httpx.stream("POST", f"{server.url}/chat/completions", json=body, headers=headers, timeout=300) as r:
            lines = r.iter_lines()
            for line in lines:
                if "prompt_progress" in line:
                    break
            burst = [threading.Thread(target=another) for _ in range(8)]
            for t in burst:
                t.start()
            for t in burst:
                t.join(timeout=300)
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert refused and len(refused) + len(answered) == 8  # none lost
        assert all(int(e.response.headers["retry-after"]) >= 1 for e in refused)
        waits = [int(e.response.headers["retry-after-ms"]) for e in refused]  # what the SDK reads first
        assert len(waits) == 1 or len(set(waits)) > 1  # spread, not one shared instant
        assert "error" not in rest[-1], rest[-1]
        assert rest[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        assert server.health()["refused"] == len(refused)
