"""The chat's remote engine (`ds4tui --engine URL`) headless, through its controller, against
`ds4tui serve` on loopback, plus the stream formats of llama-server and vLLM as documented."""

from __future__ import annotations

import socket
import threading

import pytest

from ds4tui.chat import events as ev
from ds4tui.chat.remote import RemoteChatController
from ds4tui.chat.remote_stream import ReplyReader, RemoteError, sse_data
from ds4tui.config import Config
from tests.serve.conftest import free_port
from tests.serve.test_serve import LONG


class Recorder(list):
    def __call__(self, event) -> None:
        self.append(event)

    def of(self, kind):
        return [e for e in self if isinstance(e, kind)]


def remote(url: str, tmp_path, **config) -> RemoteChatController:
    values = dict(temperature=0.0, max_tokens=8)
    values.update(config)
    return RemoteChatController(url, Config(**values), transcripts_dir=str(tmp_path / "transcripts"))


def test_chat_through_serve_streams_reuses_and_keeps_transcripts(server, tiny_llama, tmp_path):
    from tests.serve.conftest import reference_replies

    ctl = remote(server.url, tmp_path)
    conv = ctl.new_conversation()
    events = Recorder()
    done = ctl.send(conv.key, "remote: first question", events)
    assert done is not None and ctl.model_name.startswith("tiny-llama @ 127.0.0.1")
    # the same greedy reply as the embedded engine (as the server runs it: a character the
    # token limit cut is left out)
    assert conv.messages[-1]["content"] == reference_replies(tiny_llama, [conv.messages[:1]], 8)[0]
    assert "".join(e.text for e in events.of(ev.TokenText)) == conv.messages[-1]["content"]
    started = events.of(ev.PrefillStarted)
    assert started and started[0].source == "remote" and events.of(ev.PrefillProgress)
    assert done.context_tokens == conv.context_tokens > 0

    second = Recorder()
    done2 = ctl.send(conv.key, "and a second one", second)
    assert [m["role"] for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    assert conv.messages[-1]["content"] == reference_replies(tiny_llama, [conv.messages[:1], conv.messages[:3]], 8)[1]
    assert done2.cached_tokens is not None and done2.cached_tokens >= done.context_tokens - 1
    assert second.of(ev.PrefillStarted)[0].cached == done2.cached_tokens

    # Another chat process lists the transcript, finds it by title and resumes it.
    again = remote(server.url, tmp_path)
    [saved] = again.saved_sessions()
    assert saved.title == conv.title and again.find_saved(conv.title)[0].sha == saved.sha
    resumed = again.resume(conv.title)
    assert resumed.messages == conv.messages
    assert again.send(resumed.key, "third", Recorder()) is not None
    assert len(again.get(resumed.key).messages) == 6


def test_escape_closes_the_stream_and_keeps_the_message(server, tmp_path):
    ctl = remote(server.url, tmp_path, max_tokens=64)
    conv = ctl.new_conversation()
    before = server.health()
    events = Recorder()

    def cancel_on_progress(event):
        events.append(event)
        if isinstance(event, ev.PrefillProgress):
            ctl.cancel()

    assert ctl.send(conv.key, "cancel me " + LONG, cancel_on_progress) is None
    assert events.of(ev.Cancelled) and not events.of(ev.ChatError)
    assert conv.messages == []  # withdrawn: the screen puts the text back in the prompt
    state = server.wait_health(lambda s: s["cancelled"] > before["cancelled"] and s["running"] == 0)
    assert state["cancelled"] == before["cancelled"] + 1


def test_connection_refused_is_one_clear_message(tmp_path):
    ctl = remote(f"http://127.0.0.1:{free_port()}/v1", tmp_path)
    conv = ctl.new_conversation()
    events = Recorder()
    assert ctl.send(conv.key, "anyone there?", events) is None
    [error] = events.of(ev.ChatError)
    assert "cannot connect" in error.message and conv.messages == []


def _one_shot_server(reply: bytes) -> str:
    """A loopback socket that answers one request with `reply` and hangs up."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    sock.settimeout(10)

    def serve():
        try:
            conn, _ = sock.accept()
            with conn:
                conn.settimeout(10)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(reply)
        finally:
            sock.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def test_a_dropped_stream_and_http_errors_are_clear(tmp_path):
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    partial = b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
    cases = [
        (head + partial, "dropped after 1 token"),
        (b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: 37\r\n\r\n"
         b'{"error":{"message":"bad key given"}}', "refused the API key (HTTP 401): bad key given"),
        (b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 7\r\ncontent-length: 0\r\n\r\n", "retry in 7 s"),
    ]
    for reply, expected in cases:
        ctl = remote(_one_shot_server(reply), tmp_path)
        ctl._model_id = "m"  # skip the /models lookup: the socket answers one request
        conv = ctl.new_conversation()
        events = Recorder()
        assert ctl.send(conv.key, "hi", events) is None
        assert expected in events.of(ev.ChatError)[0].message
        assert conv.messages == []


def _read(lines: list[str]) -> tuple[Recorder, ReplyReader]:
    import json

    rec = Recorder()
    reader = ReplyReader(rec, started=0.0)
    for data in sse_data(lines):
        if data != "[DONE]":
            reader.feed(json.loads(data))
    return rec, reader


def test_llama_server_progress_and_timings():
    """llama-server with return_progress: progress chunks (counts include the cached part),
    then text, then a last chunk with timings (cache_n: reused prompt tokens)."""
    rec, reader = _read([
        'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}],"object":"chat.completion.chunk",'
        '"prompt_progress":{"total":300,"cache":100,"processed":164,"time_ms":40}}', "",
        ": keep-alive", "",
        'data: {"choices":[{"index":0,"delta":{}}],"prompt_progress":{"total":300,"cache":100,"processed":300}}', "",
        'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}', "",
        'data: {"choices":[{"index":0,"delta":{"content":" there"}}]}', "",
        'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}],'
        '"timings":{"cache_n":100,"prompt_n":200,"predicted_n":2,"predicted_per_second":50.0}}', "",
        "data: [DONE]", "",
    ])
    assert rec.of(ev.PrefillStarted) == [ev.PrefillStarted(total=200, cached=100, source="remote")]
    assert [(p.done, p.total) for p in rec.of(ev.PrefillProgress)] == [(64, 200), (200, 200)]
    done = reader.done()
    assert reader.text == "Hi there" and done.stop == "max-tokens"
    assert done.cached_tokens == 100 and done.prompt_tokens == 200 and done.context_tokens == 302
    assert done.tok_s == 50.0


def test_vllm_usage_chunk_and_stream_error():
    """vLLM: text chunks, a finish chunk, then (include_usage) a chunk with empty choices and usage
    carrying prompt_tokens_details.cached_tokens; an error object mid-stream ends the reply."""
    rec, reader = _read([
        'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}', "",
        'data: {"id":"x","choices":[{"index":0,"delta":{"content":"OK"},"finish_reason":null}]}', "",
        'data: {"id":"x","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}', "",
        'data: {"id":"x","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":1,"total_tokens":41,'
        '"prompt_tokens_details":{"cached_tokens":32}}}', "",
        "data: [DONE]", "",
    ])
    done = reader.done()
    assert reader.text == "OK" and done.stop == "eos" and not rec.of(ev.PrefillStarted)
    assert done.cached_tokens == 32 and done.prompt_tokens == 8 and done.context_tokens == 41
    with pytest.raises(RemoteError, match="out of memory"):
        _read(['data: {"error":{"message":"out of memory","type":"server_error","code":500}}', ""])
