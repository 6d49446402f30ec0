"""One turn through the controller: live reuse, disk hits, cancellation, bad files, full disks."""

from __future__ import annotations

import errno
import os

import pytest

from ds4tui.format.kvc import PREFIX_BYTES, decode_header
from ds4tui.chat import events as ev
from ds4tui.format.payload import DSV4_HEADER_BYTES
from tests.chat.conftest import CHATML_OPENING, LONG_PROMPT, Recorder, make_controller, opening_tokens


def kv_files(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".kv")) if os.path.isdir(directory) else []


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-dsv4"])
def test_second_controller_gets_disk_hit_and_prefills_only_suffix(spec, tmp_path):
    """A fresh controller over the same cache dir restores the cold checkpoint and prefills the rest."""
    from ds4tui.engine.loader import load_model

    model = load_model(spec)
    first, first_events = make_controller(model, tmp_path, max_tokens=3), Recorder()
    conv = first.new_conversation()
    first.send(conv.key, LONG_PROMPT, first_events)
    saved = {s.reason: s for s in first_events.of(ev.Saved)}
    assert {"continued", "cold", "agent-session"} <= set(saved)
    cold = saved["cold"]  # the longest prefix of the prompt alone (trimmed, aligned)

    second, events = make_controller(model, tmp_path, max_tokens=3), Recorder()
    done = second.send(second.new_conversation().key, LONG_PROMPT, events)
    hit = events.of(ev.Hit)[0]
    started = events.of(ev.PrefillStarted)[0]
    assert (hit.sha, hit.tokens) == (cold.sha, cold.tokens)
    assert started.source == "disk" and started.cached == cold.tokens
    assert started.total == first_events.of(ev.PrefillStarted)[0].total - cold.tokens
    assert done is not None and done.prompt_tokens == started.total
    # The restored state is the one a cold prefill computes: greedy replies agree.
    assert events.reply == first_events.reply and events.reply


def test_next_turn_reuses_live_session(tiny_llama, tmp_path, recorder):
    """The second message of a chat prefills only its own text: no disk lookup, no re-prefill."""
    ctl = make_controller(tiny_llama, tmp_path)
    conv = ctl.new_conversation()
    ctl.send(conv.key, "Hello there.", Recorder())
    before = len(conv.session.tokens)
    ctl.send(conv.key, "And what next?", recorder)
    started = recorder.of(ev.PrefillStarted)[0]
    # A reply cut inside a character by max_tokens keeps only its whole characters (never
    # U+FFFD, chat/streaming.py): the session then rewinds over that character's tokens.
    assert started.source == "live" and before - 4 <= started.cached <= before
    assert not recorder.of(ev.Hit) and not recorder.of(ev.Miss)
    # The session's bytes are exactly what the rendered transcript starts with.
    assert conv.session_text == b"".join(tiny_llama.tokenizer.token_bytes(t) for t in conv.session.tokens)


def test_cancel_mid_prefill_leaves_the_chat_as_before_the_message(tiny_llama, tmp_path):
    """Stopping a long message's prefill after its first chunk withdraws the message and puts the
    session back where the message found it: the context does not grow (it did: 2,560 -> 3,072
    after Escape), and resending answers as a chat that was never interrupted."""
    text = "word " * 420  # ~1300 tokens: three 512-token chunks of tiny-llama
    ctl = make_controller(tiny_llama, tmp_path, no_disk_cache=True)
    conv = ctl.new_conversation()
    assert ctl.send(conv.key, "Hello there.") is not None
    before_tokens, before_text = list(conv.session.tokens), conv.session_text
    before_messages = [dict(m) for m in conv.messages]
    events = Recorder()

    def cancel_after_first_chunk(event):
        events.append(event)
        if isinstance(event, ev.PrefillProgress):
            ctl.cancel()

    assert ctl.send(conv.key, text, cancel_after_first_chunk) is None
    cancelled = events.of(ev.Cancelled)[0]
    assert 0 < cancelled.prefilled < events.of(ev.PrefillStarted)[0].total
    assert not events.of(ev.Done) and not events.of(ev.TokenText)
    assert conv.messages == before_messages  # the unanswered message was withdrawn
    assert conv.session.tokens == before_tokens and conv.context_tokens == len(before_tokens)
    assert conv.session_text == before_text

    again = Recorder()
    ctl.send(conv.key, text, again)
    assert again.of(ev.PrefillStarted)[0].source == "live"
    assert again.of(ev.PrefillStarted)[0].cached == len(before_tokens)

    twin_ctl, twin = make_controller(tiny_llama, tmp_path, no_disk_cache=True), Recorder()
    other = twin_ctl.new_conversation()
    twin_ctl.send(other.key, "Hello there.")
    twin_ctl.send(other.key, text, twin)
    assert again.reply == twin.reply and again.reply
    assert conv.session.tokens == other.session.tokens


def _flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as fp:
        fp.seek(offset)
        byte = fp.read(1)
        fp.seek(offset)
        fp.write(bytes([byte[0] ^ 0xFF]))


def test_corrupt_cache_files_are_reported_and_the_answer_still_comes(tiny_llama, tmp_path):
    """Bit rot in a checkpoint's text (hash mismatch: deleted) or in its payload's model
    fingerprint (refused by the engine: kept) is a Rejected event; the turn goes on cold."""
    first, first_events = make_controller(tiny_llama, tmp_path), Recorder()
    first.send(first.new_conversation().key, LONG_PROMPT, first_events)
    cold = [s for s in first_events.of(ev.Saved) if s.reason == "cold"][0]
    continued = [s for s in first_events.of(ev.Saved) if s.reason == "continued"]
    assert continued
    for saved, where in [(cold, "text")] + [(c, "fingerprint") for c in continued]:
        with open(saved.path, "rb") as fp:
            header = decode_header(fp.read(PREFIX_BYTES))
        at = header.text_bytes // 2 if where == "text" else header.text_bytes + DSV4_HEADER_BYTES + 3
        _flip_byte(saved.path, PREFIX_BYTES + at)

    second, events = make_controller(tiny_llama, tmp_path), Recorder()
    done = second.send(second.new_conversation().key, LONG_PROMPT, events)
    rejected = {r.file: r for r in events.of(ev.Rejected)}
    assert rejected[cold.sha].deleted and "does not match the file name" in rejected[cold.sha].reason
    for c in continued:
        assert not rejected[c.sha].deleted and "fingerprint" in rejected[c.sha].reason
    assert all(os.path.exists(c.path) for c in continued)
    # The cold run writes its cold checkpoint again: a whole, valid file under the same name.
    assert cold.sha in {s.sha for s in events.of(ev.Saved) if s.reason == "cold"}
    assert events.of(ev.Miss) and events.of(ev.PrefillStarted)[0].source == "cold"
    assert done is not None and events.reply == first_events.reply


def test_full_disk_fails_the_save_not_the_conversation(tiny_llama, tmp_path, monkeypatch):
    """ENOSPC while writing a checkpoint is a SaveFailed event; the reply arrives and no partial file stays."""
    session_type = type(tiny_llama.new_session())

    def disk_full(self, fp):
        fp.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(session_type, "save_payload", disk_full)
    ctl, events = make_controller(tiny_llama, tmp_path), Recorder()
    conv = ctl.new_conversation()
    done = ctl.send(conv.key, LONG_PROMPT, events)
    failures = events.of(ev.SaveFailed)
    assert failures and all("disk full" in f.reason for f in failures)
    assert done is not None and events.reply
    assert conv.messages[-1]["role"] == "assistant"
    assert os.listdir(tmp_path) == []  # no .kv, no leftover .tmp


def test_no_disk_cache_reads_and_writes_nothing(tiny_llama, tmp_path, recorder):
    """--no-disk-cache: a Miss saying so, and an empty directory afterwards."""
    ctl = make_controller(tiny_llama, tmp_path, no_disk_cache=True)
    ctl.send(ctl.new_conversation().key, LONG_PROMPT, recorder)
    assert "disk cache off" in recorder.of(ev.Miss)[0].reason
    assert not recorder.of(ev.Saved) and kv_files(tmp_path) == []


def test_max_tokens_and_reply_text_match_the_session(tiny_llama, tmp_path, recorder):
    """The reply stops at max_tokens; the streamed text is the stored assistant message."""
    ctl = make_controller(tiny_llama, tmp_path, max_tokens=5)
    conv = ctl.new_conversation()
    done = ctl.send(conv.key, "Count to ten.", recorder)
    assert done.stop in ("max-tokens", "eos", "stop-string")
    assert done.tokens <= 5
    assert conv.messages[-1] == {"role": "assistant", "content": recorder.reply}
    # The session holds the turn's tokens, then the next user turn's opening (chat/next_turn.py),
    # except after a stop string: the transcript's reply then is not the session's text.
    opened = 0 if done.stop == "stop-string" else opening_tokens(tiny_llama)
    assert done.context_tokens + opened == len(conv.session.tokens)
    if opened:
        assert conv.session_text.endswith(CHATML_OPENING.encode())


def test_prompt_longer_than_the_context_is_refused_before_sending(tiny_llama, tmp_path, recorder):
    """A message that cannot fit is not sent: ContextWontFit, nothing prefilled or changed, and
    the chat still works."""
    ctl = make_controller(tiny_llama, tmp_path, no_disk_cache=True)
    conv = ctl.new_conversation()
    assert ctl.send(conv.key, "word " * 1000, recorder) is None
    check = recorder.of(ev.ContextWontFit)[0].check
    assert not check.fits and check.prompt_tokens > check.ctx - check.reserve
    assert check.drop_turns is None  # no earlier exchange to drop
    assert not recorder.of(ev.PrefillStarted) and conv.messages == [] and conv.session is None
    assert ctl.send(conv.key, "Short one.", Recorder()) is not None


def test_cancel_while_streaming_keeps_the_partial_reply(tiny_llama, tmp_path):
    """Escape during the reply: Done(stop=cancelled), the text so far is the assistant message,
    and the next turn continues from the live session."""
    ctl = make_controller(tiny_llama, tmp_path, max_tokens=50)
    conv = ctl.new_conversation()
    events = Recorder()

    def cancel_on_first_text(event):
        events.append(event)
        if isinstance(event, ev.TokenText):
            ctl.cancel()

    done = ctl.send(conv.key, "Tell me a story.", cancel_on_first_text)
    assert done is not None and done.stop == "cancelled" and 1 <= done.tokens < 50
    assert conv.messages[-1] == {"role": "assistant", "content": events.reply}
    follow = Recorder()
    assert ctl.send(conv.key, "Go on.", follow) is not None
    assert follow.of(ev.PrefillStarted)[0].source == "live"


def test_a_reply_that_reaches_a_continued_frontier_is_checkpointed_there(tiny_llama, tmp_path):
    """The frontier a long reply crosses gets its continued file (ds4 checks it at every decode
    step), so a kill -9 before the next save loses at most one interval; the file restores."""
    from ds4tui.cache.policy import CachePolicy

    policy = CachePolicy(min_tokens=32, boundary_trim_tokens=4, boundary_align_tokens=64,
                         continued_interval_tokens=128, cold_max_tokens=0)
    ctl, events = make_controller(tiny_llama, tmp_path, policy=policy, max_tokens=300), Recorder()
    conv = ctl.new_conversation()
    done = ctl.send(conv.key, "Hi.", events)  # a short prompt: every frontier is in the reply
    prompt_tokens = events.of(ev.PrefillStarted)[0].total
    assert done is not None and done.context_tokens > 256 > prompt_tokens  # crossed 128 and 256
    continued = [s for s in events.of(ev.Saved) if s.reason == "continued"]
    assert sorted(s.tokens for s in continued) == [128, 256]
    # Each one holds the conversation as it stood at that token: a prefix of the session's text.
    session_text = conv.session_text
    for s in continued:
        with open(s.path, "rb") as fp:
            header = decode_header(fp.read(PREFIX_BYTES))
            assert session_text.startswith(fp.read(header.text_bytes))
    # A kill -9 before the reply's end: nothing but the continued files on disk. A fresh
    # controller finds the last one for the conversation's text.
    for s in events.of(ev.Saved):
        if s.reason != "continued":
            os.unlink(s.path)
    again = make_controller(tiny_llama, tmp_path, policy=policy, max_tokens=2)
    hits = again.checkpoints.store.lookup(session_text, again.checkpoints.acceptor())
    assert hits and (hits[0].header.tokens, hits[0].header.reason) == (256, "continued")


def test_a_cancelled_first_message_leaves_no_chat_behind(tiny_llama, tmp_path):
    """A new chat whose first message is withdrawn (its prefill cancelled) is "New chat" again and
    not in the store: it was listed (after a restart) as an empty chat titled with that message."""
    ctl = make_controller(tiny_llama, tmp_path, no_disk_cache=True)
    conv = ctl.new_conversation()
    before = {c.id for c in ctl.history.store.list()}

    def cancel_at_progress(event):
        if isinstance(event, ev.PrefillProgress):
            ctl.cancel()

    assert ctl.send(conv.key, "word " * 420, cancel_at_progress) is None
    assert conv.title is None and conv.display_title == "New chat" and conv.store_id is None
    assert {c.id for c in ctl.history.store.list()} == before
    assert ctl.send(conv.key, "Hello there.") is not None  # the chat goes on as new
    assert conv.title == "Hello there." and conv.store_id in {c.id for c in ctl.history.store.list()}
    # A later message withdrawn leaves the chat and its title alone.
    assert ctl.send(conv.key, "word " * 420, cancel_at_progress) is None
    assert conv.title == "Hello there." and conv.store_id in {c.id for c in ctl.history.store.list()}
