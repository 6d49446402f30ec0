"""The wire-protocol corners of `ds4tui serve`, through the official `openai` client and raw HTTP:
nulls, bounds, errors known before a stream starts, sampler fields, UTF-8 at the cut, progress
on request, JSON depth, a client hanging up mid-body, CORS, Retry-After."""

from __future__ import annotations

import codecs
import random
import socket
import time

import httpx
import openai
import pytest

from tests.serve.test_serve import LONG, ask, client, reference


def post(server, body: dict) -> httpx.Response:
    body.setdefault("model", "tiny-llama")
    return httpx.post(f"{server.url}/chat/completions", json=body, timeout=300)


def test_explicit_nulls_are_absent_fields(server):
    body = {"messages": [{"role": "user", "content": "null test", "name": None}], "max_tokens": 3,
            "temperature": 0, "n": None, "stream_options": None, "top_p": None, "seed": None, "stop": None,
            "frequency_penalty": None, "tools": None, "max_completion_tokens": None, "user": None}
    r = post(server, body)
    assert r.status_code == 200, r.text
    streamed = post(server, dict(body, stream=True, stream_options={"include_usage": None}))
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert '"usage"' not in streamed.text  # include_usage: null is false


def test_max_tokens_is_bounded_by_the_context(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as err:
        ask(c, [{"role": "user", "content": "x"}], max_tokens=10**30)
    assert err.value.body["param"] == "max_tokens" and "context" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        ask(c, [{"role": "user", "content": "x"}], max_tokens=None, extra_body={"max_completion_tokens": 10**6})


def test_a_streamed_prompt_too_long_is_a_400_before_the_stream(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as err:
        ask(c, [{"role": "user", "content": LONG * 2}], max_tokens=2, stream=True)
    assert err.value.status_code == 400 and err.value.body["code"] == "context_length_exceeded"
    raw = post(server, {"messages": [{"role": "user", "content": LONG * 2}], "stream": True})
    assert raw.status_code == 400 and raw.headers["content-type"].startswith("application/json")


def test_deeply_nested_json_is_a_400(server):
    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(f"{server.url}/chat/completions", content=deep, timeout=300)
    assert r.status_code == 400 and "nested" in r.json()["error"]["message"]
    assert ask(client(server), [{"role": "user", "content": "alive"}], max_tokens=1).choices


def test_progress_chunks_only_when_asked(server):
    c = client(server)
    messages = [{"role": "user", "content": "progress test " * 20}]

    def progress_of(chunks):
        return [ch.model_extra["prompt_progress"] for ch in chunks if "prompt_progress" in (ch.model_extra or {})]

    plain = list(ask(c, messages, max_tokens=3, stream=True))
    assert progress_of(plain) == []
    asked = list(ask(c, [{"role": "user", "content": "progress asked " * 20}], max_tokens=3, stream=True,
                     extra_body={"return_progress": True}))
    assert progress_of(asked) and progress_of(asked)[-1]["processed"] == progress_of(asked)[-1]["total"]
    assert "".join(ch.choices[0].delta.content or "" for ch in plain if ch.choices) == \
        ask(c, messages, max_tokens=3).choices[0].message.content


def _reference_tokens(model, messages, n: int) -> list[bytes]:
    """The greedy reply's token bytes, straight from a session (no turn pipeline)."""
    prompt = model.chat.render(messages, add_generation_prompt=True)
    session = model.new_session(512)
    session.prefill(model.tokenizer.encode(prompt))
    logits, out = session.logits, []
    for _ in range(n):
        token = int(logits.argmax())
        out.append(model.tokenizer.token_bytes(token))
        logits = session.decode(token)
    return out


def test_a_character_cut_by_max_tokens_is_held_back(server, tiny_llama):
    # Find a prompt and a max_tokens where the greedy reply stops inside a character.
    found = None
    for q in range(40):
        messages = [{"role": "user", "content": f"utf8 probe {q}"}]
        pieces = _reference_tokens(tiny_llama, messages, 16)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = ""
        for k, piece in enumerate(pieces, 1):
            if piece in (b"<|im_end|>",) or b"<|" in piece:
                break
            text += decoder.decode(piece)
            if decoder.getstate()[0]:  # bytes of an unfinished character are pending
                found = messages, k, text
                break
        if found:
            break
    assert found, "no prompt's reply stops inside a character"
    messages, k, text = found
    c = client(server)
    r = ask(c, messages, max_tokens=k)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == k
    assert r.choices[0].message.content == text and not text.endswith("\ufffd")
    streamed = "".join(ch.choices[0].delta.content or "" for ch in ask(c, messages, max_tokens=k, stream=True)
                       if ch.choices)
    assert streamed == text


def _replay(model, messages, params, max_tokens: int) -> str:
    """The reply the turn pipeline should give with these sampling params, from a bare session."""
    from ds4tui.chat.streaming import ReplyStream
    from ds4tui.engine.sampling import Sampler

    prompt = model.chat.render(messages, add_generation_prompt=True)
    session = model.new_session(512)
    session.prefill(model.tokenizer.encode(prompt))
    sampler, stream, logits = Sampler(params), ReplyStream(model.chat.stop_strings), session.logits
    for _ in range(max_tokens):
        token = sampler(logits)
        if token in model.tokenizer.eos_ids:
            break
        stream.feed(model.tokenizer.token_bytes(token))
        if stream.stopped:
            break
        logits = session.decode(token)
    stream.finish()
    return stream.text


def test_top_k_and_penalties_reach_the_sampler(server, tiny_llama):
    from ds4tui.engine.sampling import SamplingParams

    c = client(server)
    messages = [{"role": "user", "content": "sampler fields: say it again and again"}]
    greedy = reference(tiny_llama, messages, max_tokens=16)
    # top_k = 1 is greedy whatever the temperature
    for seed in (1, 2):
        r = ask(c, messages, max_tokens=16, temperature=1.0, seed=seed, extra_body={"top_k": 1, "min_p": 0})
        assert r.choices[0].message.content == greedy
    # Negative penalties favour what was said: this greedy reply turns into a loop.
    penalized = ask(c, messages, max_tokens=16, frequency_penalty=-2.0, presence_penalty=-2.0)
    want = _replay(tiny_llama, messages, SamplingParams(temperature=0.0, frequency_penalty=-2.0,
                                                         presence_penalty=-2.0), 16)
    assert penalized.choices[0].message.content == want
    assert want != greedy  # the penalties changed this reply: the comparison above can tell
    with pytest.raises(openai.BadRequestError) as err:
        ask(c, messages, presence_penalty=3)
    assert err.value.body["param"] == "presence_penalty"


def test_a_client_hanging_up_mid_body_logs_one_line(cors_server):
    server = cors_server
    host, port = server.root.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 5000\r\n\r\n{\"messages\": [")
    deadline = time.monotonic() + 20
    while "went away" not in server.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = server.log.read_text()
    assert log.count("went away in the middle of its request body") == 1, log
    assert "Traceback" not in log
    assert ask(client(server), [{"role": "user", "content": "after a hang-up"}], max_tokens=1).choices


@pytest.fixture(scope="module")
def cors_server(tmp_path_factory):
    from tests.serve.conftest import running_server

    with running_server(tmp_path_factory.mktemp("cors"), "--cors-origin", "http://app.example:3000",
                        "--cors-origin", "localhost", "--log-level", "info") as s:
        yield s


def preflight(server, origin: str) -> httpx.Response:
    return httpx.options(f"{server.url}/chat/completions", timeout=10, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_cors_answers_the_named_origins_only(cors_server):
    for origin in ("http://app.example:3000", "http://localhost:5173", "http://127.0.0.1:8080"):
        r = preflight(cors_server, origin)
        assert r.status_code == 200, (origin, r.text)
        assert r.headers["access-control-allow-origin"] == origin
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
    got = httpx.get(f"{cors_server.url}/models", headers={"Origin": "http://app.example:3000"}, timeout=10)
    assert got.headers["access-control-allow-origin"] == "http://app.example:3000"
    for origin in ("http://evil.example", "http://localhost.evil.example", "http://app.example:3001"):
        r = preflight(cors_server, origin)
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        assert "access-control-allow-origin" not in httpx.get(f"{cors_server.url}/models", timeout=10,
                                                              headers={"Origin": origin}).headers


def test_cors_is_off_by_default(server):
    assert preflight(server, "http://localhost:5173").status_code == 405
    r = httpx.get(f"{server.url}/models", headers={"Origin": "http://localhost:5173"}, timeout=10)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_retry_after_follows_the_line_and_is_spread():
    from ds4tui.serve.worker import JITTER, EngineQueue

    for parallel, cases in ((1, {1: 2.0, 3: 6.0, 5: 10.0}), (4, {4: 0.5, 8: 2.5, 12: 4.5})):
        queue = EngineQueue(chats=None, max_waiting=8, rng=random.Random(7), parallel=parallel)
        queue.counters.recent_s = 2.0
        for pending, base in cases.items():  # 2 s x (the line ahead + 1) / parallel
            queue._pending = pending
            waits = [queue.retry_after() for _ in range(200)]
            assert all(base <= w < base * (1 + JITTER) for w in waits)
            assert max(waits) - min(waits) > 0.5 * base * JITTER  # spread over the range, not one value
        queue.close()


def test_tools_on_a_template_without_them_are_refused(server):
    from tests.serve.test_tools_parser import WEATHER

    with pytest.raises(openai.BadRequestError) as err:
        ask(client(server), [{"role": "user", "content": "x"}], tools=[WEATHER])
    assert err.value.body["param"] == "tools" and "template" in err.value.body["message"]
    # tool_choice "none" leaves the tools out: the request runs
    assert ask(client(server), [{"role": "user", "content": "x"}], tools=[WEATHER], tool_choice="none",
               max_tokens=1).choices


def test_text_completions_take_the_prompt_as_it_is(server, tiny_llama):
    from ds4tui.chat.streaming import ReplyStream

    prompt = "Once upon a time, in a harbour town,"
    c = client(server)
    r = c.completions.create(model="tiny-llama", prompt=prompt, max_tokens=10, temperature=0)
    tokens = tiny_llama.tokenizer.encode(prompt)
    assert r.object == "text_completion" and r.usage.prompt_tokens == len(tokens)  # no chat template around it
    session = tiny_llama.new_session(512)
    session.prefill(tokens)
    stream, logits, n = ReplyStream(tiny_llama.chat.stop_strings, drop_partial=True), session.logits, 0
    while n < 10:
        token = int(logits.argmax())
        if token in tiny_llama.tokenizer.eos_ids:
            break
        stream.feed(tiny_llama.tokenizer.token_bytes(token))
        n += 1
        if stream.stopped:
            break
        logits = session.decode(token)
    stream.finish()
    assert r.choices[0].text == stream.text and r.usage.completion_tokens == n
    chunks = list(c.completions.create(model="tiny-llama", prompt=prompt, max_tokens=10, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == stream.text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == [
        r.choices[0].finish_reason]
    assert chunks[-1].usage.prompt_tokens == len(tokens)
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model="tiny-llama", prompt=prompt, echo=True)
    assert err.value.body["param"] == "echo"
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model="tiny-llama", prompt=LONG * 2, max_tokens=2, stream=True)
    assert err.value.body["code"] == "context_length_exceeded"
