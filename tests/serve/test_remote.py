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
    """A remote chat whose conversation store is tmp_path/data (a second one on it is another process's view)."""
    values = dict(temperature=0.0, max_tokens=8, data_dir=str(tmp_path / "data"))
    values.update(config)
    return RemoteChatController(url, Config(**values))


def test_chat_through_serve_streams_reuses_and_keeps_history(server, tiny_llama, tmp_path):
    from tests.serve.conftest import reference_replies

    ctl = remote(server.url, tmp_path)
    conv = ctl.new_conversation()
    events = Recorder()
    done = ctl.send(conv.key, "remote: first question", events)
    assert done is not None and ctl.model_name.startswith("tiny-llama @ 127.0.0.1")
    # The same greedy reply as the embedded engine gives these messages (a cut character dropped).
    assert [conv.messages[-1]["content"]] == reference_replies(tiny_llama, [conv.messages[:1]], 8)
    assert "".join(e.text for e in events.of(ev.TokenText)) == conv.messages[-1]["content"]
    started = events.of(ev.PrefillStarted)
    assert started and started[0].source == "remote" and events.of(ev.PrefillProgress)
    assert done.context_tokens == conv.context_tokens > 0

    second = Recorder()
    done2 = ctl.send(conv.key, "and a second one", second)
    # The reference runs both requests in order, as the server did (the second reuses the first's session).
    assert reference_replies(tiny_llama, [conv.messages[:1], conv.messages[:3]], 8) == [
        conv.messages[1]["content"], conv.messages[3]["content"]]
    assert done2.cached_tokens is not None and done2.cached_tokens >= done.context_tokens - 1
    assert second.of(ev.PrefillStarted)[0].cached == done2.cached_tokens

    # Another chat process lists the chat from the store, finds it by title and resumes it.
    again = remote(server.url, tmp_path)
    [saved] = again.stored_chats()
    assert saved.title == conv.title and saved.engine == server.url and saved.model == "tiny-llama"
    assert saved.message_count == 4 and not again.kv_on_disk(saved)
    opened = Recorder()
    resumed = again.resume(conv.title, opened)
    assert resumed.messages == conv.messages and resumed.store_id == saved.id
    [history] = opened.of(ev.HistoryOpened)
    assert history.remote and history.conversation == resumed.key
    assert again.send(resumed.key, "third", Recorder()) is not None
    assert len(again.get(resumed.key).messages) == 6
    assert len(remote(server.url, tmp_path).history.store.load(saved.id).messages) == 6


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
        ctl.server.model_id, ctl.server.models_asked = "m", True  # no /models lookup: the socket answers one request
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


def test_versions_edits_and_forks_of_a_remote_chat_survive_reopening_the_store(server, tmp_path):
    ctl = remote(server.url, tmp_path, temperature=1.0, seed=7)  # sampled: the versions differ
    conv = ctl.new_conversation()
    assert ctl.send(conv.key, "survive: first") is not None
    assert ctl.regenerate(conv.key) is not None
    assert ctl.send(conv.key, "survive: second") is not None
    before = [dict(m) for m in conv.messages]
    done, kept = ctl.edit(conv.key, 2, "survive: second, edited")
    assert done is not None and kept is not None
    branch = ctl.fork(conv.key, 2)
    ctl.set_chat_settings(conv.key, top_p=0.5, system_prompt="Be terse.")
    assert len(set(conv.alternatives[2])) == 2  # shifted by the system prompt, both kept
    assert ctl.regenerate(conv.key) is not None  # the edited question's reply, twice
    assert len(set(conv.alternatives[4])) == 2

    again = remote(server.url, tmp_path)  # another run of the chat on the same store
    rows = {c.id: c for c in again.stored_chats()}
    assert set(rows) == {conv.store_id, kept.store_id, branch.store_id}
    assert rows[kept.store_id].forked_from == rows[branch.store_id].forked_from == conv.store_id
    assert all(r.engine == server.url and r.model == "tiny-llama" for r in rows.values())
    reopened = again.open_stored(conv.store_id)
    assert reopened.messages == conv.messages and reopened.alternatives == conv.alternatives
    assert again.alternatives(reopened.key, 2) == ctl.alternatives(conv.key, 2) == (1, 2)
    assert again.chat_settings(reopened.key)["top_p"] == 0.5
    assert again.open_stored(kept.store_id).messages == before  # the continuation before the edit
    assert again.open_stored(branch.store_id).messages == conv.messages[1:3]
    # The other version, shown after the restart, is what the next request continues from.
    older = again.show_alternative(reopened.key, 4, -1)
    assert older == conv.alternatives[4][0] != conv.messages[4]["content"]
    assert again.send(reopened.key, "survive: third") is not None
    assert reopened.messages[4]["content"] == older and reopened.messages[5]["content"] == "survive: third"
    assert third_process_sees(server, tmp_path, conv.store_id) == reopened.messages


def third_process_sees(server, tmp_path, chat_id):
    return list(remote(server.url, tmp_path).history.store.load(chat_id).messages)


def test_a_message_the_servers_context_cannot_hold_is_not_sent(server, tmp_path):
    ctl = remote(server.url, tmp_path)
    conv = ctl.new_conversation()
    assert ctl.check_fit(conv.key, "word " * 5000).fits  # nothing counted yet: the server judges
    assert ctl.send(conv.key, "fit: a first question") is not None
    assert ctl.ctx_size() == 2048  # ds4tui serve says it in /v1/models (max_model_len)
    served = server.health()["served"]
    events = Recorder()
    assert ctl.send(conv.key, "word " * 5000, events) is None
    [refused] = events.of(ev.ContextWontFit)
    check = refused.check
    assert not check.fits and check.ctx == 2048 and check.prompt_tokens > 2048
    assert check.drop_turns is None and check.fresh_tokens > 2048  # too long even on its own
    assert len(conv.messages) == 2 and server.health()["served"] == served  # nothing sent or changed
    assert ctl.check_fit(conv.key, "a short one").fits


def test_the_fit_check_counts_what_dropping_exchanges_leaves():
    from ds4tui.chat.branches import fit_check

    chars = lambda ms: sum(len(m["content"]) for m in ms)  # noqa: E731  one token a character
    msgs = [{"role": "system", "content": "s" * 10}]
    for n in range(3):
        msgs += [{"role": "user", "content": "u" * 30}, {"role": "assistant", "content": "a" * 30}]
    assert fit_check(msgs, "x" * 20, chars, 300, 16).fits
    check = fit_check(msgs, "x" * 20, chars, 120, 16)
    # 10 + 180 + 20 does not fit 120 - 16; dropping two exchanges leaves 10 + 60 + 20 = 90.
    assert (check.fits, check.prompt_tokens, check.drop_turns, check.drop_prefill, check.fresh_tokens) == (
        False, 210, 2, 80, 30)


def test_an_older_versions_transcript_comes_into_the_store_and_goes_on(server, tmp_path):
    """The JSON transcripts remote chats were kept in before the store are imported once (at
    start: the screen's first scan calls import_existing) and continue like any stored chat."""
    from ds4tui import paths
    from ds4tui.chat.legacy_transcripts import Transcript, Transcripts

    old = Transcripts(paths.transcripts_dir())  # the test's own directory (tests/conftest.py)
    messages = [{"role": "user", "content": "old: a question"}, {"role": "assistant", "content": "old: its answer"}]
    old.save(Transcript(sha=old.new_name(), title="An old remote chat", created_at=1_700_000_000,
                        messages=messages, engine=server.url, model="tiny-llama"))
    ctl = remote(server.url, tmp_path)
    assert ctl.import_existing().imported == 1
    [row] = ctl.stored_chats()
    assert (row.title, int(row.created_at), row.engine) == ("An old remote chat", 1_700_000_000, server.url)
    conv = ctl.open_stored(row.id)
    assert conv.messages == messages
    assert ctl.send(conv.key, "old: and now?") is not None
    assert len(ctl.history.store.load(row.id).messages) == 4
    assert remote(server.url, tmp_path).import_existing().imported == 0  # once per file
