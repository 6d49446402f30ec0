"""Conversations over time: titled sessions, the live-session cap, the disk budget, shutdown."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from ds4tui.format.kvc import PREFIX_BYTES, decode_header
from ds4tui.cache.policy import CachePolicy
from ds4tui.chat import events as ev
from tests.chat.conftest import LONG_PROMPT, SMALL_POLICY, Recorder, make_controller


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-dsv4"])
def tiny_model(request):
    from ds4tui.engine.loader import load_model

    return load_model(request.param)


def _visible(messages):
    return [m for m in messages if m["role"] != "system"]


def test_titled_session_resumes_transcript_and_kv_without_prefill(tiny_model, tmp_path):
    """After two turns the chat is a titled file; a fresh controller resumes it with zero prefill,
    and its next reply is the one the original session gives."""
    first = make_controller(tiny_model, tmp_path)
    conv = first.new_conversation()
    first.send(conv.key, "Hello there, tiny model.", Recorder())
    turn2 = Recorder()
    first.send(conv.key, "Tell me more.", turn2)
    saved = [s for s in turn2.of(ev.Saved) if s.reason == "agent-session"][-1]
    assert saved.sha == conv.saved_sha and conv.title == "Hello there, tiny model."
    with open(saved.path, "rb") as fp:
        header = decode_header(fp.read(PREFIX_BYTES))
    assert header.titled and header.tokens == len(conv.session.tokens)

    second, events = make_controller(tiny_model, tmp_path), Recorder()
    listed = second.saved_sessions()
    assert [(s.sha, s.title) for s in listed] == [(saved.sha, conv.title)]
    resumed = second.resume(saved.sha[:10], events)
    assert resumed.title == conv.title and resumed.saved_sha == saved.sha
    assert _visible(resumed.messages) == _visible(conv.messages)
    assert resumed.session.tokens == conv.session.tokens
    assert events.of(ev.Hit) and not events.of(ev.PrefillStarted) and not events.of(ev.PrefillProgress)

    a, b = Recorder(), Recorder()
    restored = len(resumed.session.tokens)
    first.send(conv.key, "One more thing.", a)
    second.send(resumed.key, "One more thing.", b)
    started = b.of(ev.PrefillStarted)[0]
    assert started.source == "live" and started.cached == restored  # the history is not prefilled again
    assert started.total == a.of(ev.PrefillStarted)[0].total
    assert b.reply == a.reply


def test_resume_by_title_and_rename(tiny_llama, tmp_path):
    """A session is found by its exact title; renaming moves the file to SHA-1(new title || created_at)."""
    ctl = make_controller(tiny_llama, tmp_path)
    conv = ctl.new_conversation()
    ctl.send(conv.key, "  A   [bold]title[/bold]\nwith lines  ", Recorder())
    assert conv.title == "A [bold]title[/bold] with lines"  # whitespace collapsed, nothing interpreted
    old = conv.saved_sha
    ctl.rename(conv.key, "Renamed chat")
    assert conv.saved_sha != old and not os.path.exists(tmp_path / f"{old}.kv")

    other = make_controller(tiny_llama, tmp_path)
    resumed = other.resume("Renamed chat")
    assert resumed.saved_sha == conv.saved_sha and resumed.title == "Renamed chat"
    with pytest.raises(LookupError):
        other.resume("no such title")


def test_long_titles_are_clipped(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path, max_tokens=1)
    conv = ctl.new_conversation()
    ctl.send(conv.key, "x" * 100, Recorder())
    assert len(conv.title) == 48 and conv.title.endswith("…")


def test_live_session_cap_frees_the_least_recently_used_one(tiny_llama, tmp_path):
    """With room for two live sessions, a third chat frees the oldest: its titled file already
    holds its state, so nothing more is written, and it continues from that file.
    (Empty replies: a random model's reply bytes need not survive the transcript's UTF-8
    round trip, and the titled text must be a byte prefix of the next prompt. No cold
    checkpoints: one would hold the same text, an equally good hit.)"""
    ctl = make_controller(tiny_llama, tmp_path, policy=CachePolicy(min_tokens=10**6), live_sessions=2, max_tokens=0)
    convs = [ctl.new_conversation() for _ in range(3)]
    for i, conv in enumerate(convs[:2]):
        ctl.send(conv.key, f"Chat number {i}: hello.", Recorder())
    tokens0 = len(convs[0].session.tokens)
    events = Recorder()
    ctl.send(convs[2].key, "Chat number 2: hello.", events)
    freed = events.of(ev.SessionFreed)
    assert [f.conversation for f in freed] == [convs[0].key]
    assert [s for s in events.of(ev.Saved) if s.reason == "evict"] == []
    assert not freed[0].written  # the chat says so instead of "saved to disk: evict"
    assert [c.live for c in convs] == [False, True, True] and ctl.live_count() == 2

    again, titled = Recorder(), convs[0].saved_sha
    ctl.send(convs[0].key, "Back to chat 0.", again)
    hit = again.of(ev.Hit)[0]
    assert hit.sha == titled and hit.tokens == tokens0
    assert again.of(ev.PrefillStarted)[0].source == "disk"
    assert again.of(ev.SessionFreed)[0].conversation == convs[1].key  # now the oldest live one


def test_tiny_budget_evicts_and_holds(tiny_llama, tmp_path):
    """A 1 MiB budget: saves evict the lowest-scoring files, and the directory never exceeds it."""
    policy = replace(SMALL_POLICY, budget_mb=1)
    ctl = make_controller(tiny_llama, tmp_path, policy=policy)
    evicted = []
    for i in range(4):
        events = Recorder()
        # Twice the prompt: the chats fork the first one's system turn (no cold file of their
        # own), and their other saves must still outgrow the budget.
        ctl.send(ctl.new_conversation().key, f"Topic {i}. " + LONG_PROMPT * 2, events)
        evicted += [f for e in events.of(ev.Evicted) for f in e.files]
        # The budget is for the .kv files (as ds4's); the header index and the model memo beside
        # them are a few KiB of bookkeeping.
        total = sum(os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path) if n.endswith(".kv"))
        assert total <= 1 << 20
    assert evicted


def test_shutdown_saves_only_states_not_already_on_disk(tiny_llama, tmp_path, recorder, monkeypatch):
    """One copy of a state on disk: a chat whose titled file holds its session is freed
    without a write; one whose session went further (its last titled save failed: a full
    disk, say) gets a `shutdown` file of exactly that state. (A cancelled prefill no longer
    moves a session past its file: it rewinds to where the turn found it.)"""
    ctl = make_controller(tiny_llama, tmp_path, policy=CachePolicy(min_tokens=10**6))
    saved_chat, unsaved_chat = ctl.new_conversation(), ctl.new_conversation()
    for conv in (saved_chat, unsaved_chat):
        ctl.send(conv.key, f"Hello from {conv.key}.", Recorder())
    with monkeypatch.context() as failing:
        failing.setattr(ctl.checkpoints, "save_titled", lambda *args, **kwargs: None)
        assert ctl.send(unsaved_chat.key, "And once more.", Recorder()) is not None
    unsaved_tokens = len(unsaved_chat.session.tokens)
    assert unsaved_tokens > unsaved_chat.saved_upto
    assert len(saved_chat.session.tokens) == saved_chat.saved_upto
    files_before = set(os.listdir(tmp_path))
    ctl.shutdown(recorder)
    saved = [s for s in recorder.of(ev.Saved) if s.reason == "shutdown"]
    assert [s.tokens for s in saved] == [unsaved_tokens]
    assert len(set(os.listdir(tmp_path)) - files_before) == 1
    assert ctl.live_count() == 0 and len(recorder.of(ev.SessionFreed)) == 2


def test_open_untitled_checkpoint_continues_from_its_kv(tiny_llama, tmp_path):
    """The cache browser may open a plain checkpoint: its text becomes the transcript, its KV the session."""
    first, events = make_controller(tiny_llama, tmp_path), Recorder()
    first.send(first.new_conversation().key, LONG_PROMPT, events)
    cold = [s for s in events.of(ev.Saved) if s.reason == "cold"][0]
    ctl = make_controller(tiny_llama, tmp_path)
    conv = ctl.open_file(cold.sha)
    assert len(conv.session.tokens) == cold.tokens and conv.saved_sha is None
    assert conv.messages[-1]["role"] == "user" and LONG_PROMPT.startswith(conv.messages[-1]["content"])
    assert conv.title.startswith("Please summarize")


def test_rename_caps_the_title_whoever_calls_it(tiny_llama, tmp_path):
    """The title is a trailer in every save: the controller caps it, not only the dialog."""
    from ds4tui.chat.conversation import MAX_TITLE_CHARS

    ctl = make_controller(tiny_llama, tmp_path, max_tokens=1)
    conv = ctl.new_conversation()
    ctl.send(conv.key, "hi", Recorder())
    ctl.rename(conv.key, "t" * (2 << 20))
    assert len(conv.title) == MAX_TITLE_CHARS and conv.title.endswith("…")
    assert make_controller(tiny_llama, tmp_path).resume(conv.title).title == conv.title


def test_a_session_of_another_model_of_the_family_says_so(tiny_llama, tmp_path):
    """SmolLM2 (Q4_1) and Gemma 3 (Q4_K) sessions are both ds4tui-llama files: the quant bits in
    the header differ before the fingerprint is ever read. Either way the session is another
    model's, not a broken file, and resuming it says which kind of problem it is."""
    from ds4tui.format.kvc import OFFSET_QUANT_BITS

    writer = make_controller(tiny_llama, tmp_path)
    conv = writer.new_conversation()
    writer.send(conv.key, "hello from another model", lambda e: None)
    path = writer.cache_store.path_for(conv.saved_sha)
    data = bytearray(path.read_bytes())
    data[OFFSET_QUANT_BITS] = (data[OFFSET_QUANT_BITS] & 0x80) | 5  # as a Q5 model of the family writes it
    path.write_bytes(bytes(data))
    reader = make_controller(tiny_llama, tmp_path)
    (saved,) = reader.saved_sessions(with_problems=True)
    assert saved.other_model and "quant bits" not in saved.problem
    with pytest.raises(LookupError, match="cannot be resumed: written by"):
        reader.resume(conv.saved_sha)


def _private_tiny_llama():
    """A tiny-llama of its own: these tests watch its spare KV buffers (not the shared model's)."""
    from ds4tui.engine.llama.model import LlamaConfig, LlamaModel
    from ds4tui.engine.llama.tiny import CONFIG, random_llama_weights
    from ds4tui.engine.llama.weights import hf_to_internal, make_info
    from ds4tui.engine.loader import load_model

    shared = load_model("tiny-llama")
    cfg = LlamaConfig.from_hf(CONFIG)
    tensors = hf_to_internal(cfg, random_llama_weights(CONFIG, seed=0), "test")
    return LlamaModel(cfg, tensors, make_info("pool", cfg, "test:pool", 32), shared.tokenizer, shared.chat, "test")


def test_an_evicted_chat_s_memory_goes_to_the_next_one(tmp_path):
    """At the cap, the chat going out hands its KV buffers to the one coming in (no fresh
    memory to fault in on its first restore); nothing is prepared beyond the cap; the reply
    is the one a fresh model gives."""
    model = _private_tiny_llama()
    ctl = make_controller(model, tmp_path, policy=CachePolicy(min_tokens=10**6), live_sessions=1, max_tokens=4)
    a, b = ctl.new_conversation(), ctl.new_conversation()
    ctl.send(a.key, "Chat A: hello.", Recorder())
    _settled(model)
    assert model._spare is None  # the cap is reached: nothing prepared
    ptr = a.session.kv.data_ptr()
    reply = Recorder()
    ctl.send(b.key, "Chat B: hello.", reply)
    assert not a.live and b.session.kv.data_ptr() == ptr
    fresh = Recorder()
    other = make_controller(_private_tiny_llama(), tmp_path / "other", max_tokens=4)
    other.send(other.new_conversation().key, "Chat B: hello.", fresh)
    assert reply.reply == fresh.reply and len(reply.of(ev.TokenText)) > 0


def _settled(model) -> None:
    """Wait for the spare the last turn started preparing, if it is still being made."""
    thread = model._preparing
    if thread is not None:
        thread.join()


def test_under_the_cap_the_next_chat_s_memory_is_prepared(tmp_path):
    model = _private_tiny_llama()
    ctl = make_controller(model, tmp_path, live_sessions=2, max_tokens=0)
    a, b = ctl.new_conversation(), ctl.new_conversation()
    ctl.send(a.key, "Chat A: hello.", Recorder())
    _settled(model)
    spare = model._spare
    assert spare is not None and spare.data_ptr() != a.session.kv.data_ptr()
    ctl.send(b.key, "Chat B: hello.", Recorder())
    assert b.session.kv is spare
    _settled(model)
    assert model._spare is None  # two live chats fill the cap: no third buffer


def test_a_busy_chat_closed_keeps_its_memory_to_itself(tmp_path):
    """A turn may still run on a busy chat's session: closing it frees it without handing its
    buffers to anyone."""
    model = _private_tiny_llama()
    ctl = make_controller(model, tmp_path, live_sessions=1, max_tokens=0)
    a = ctl.new_conversation()
    ctl.send(a.key, "Chat A: hello.", Recorder())
    session = a.session
    a.busy = True
    ctl.close(a.key)
    assert model._spare is None and session.kv is not None
    idle = ctl.new_conversation()
    ctl.send(idle.key, "Chat B: hello.", Recorder())
    kept = idle.session
    ctl.close(idle.key)
    assert model._spare is not None and kept.kv is None  # an idle one's are handed on
