"""Conversation moves through the controller, headless: regenerate, alternatives, edit and
resend, fork, the per-turn cache report, the context-fit check and its choices, per-chat
settings. Each asserts what was reused and what was prefilled."""

from __future__ import annotations

import os

import pytest

from ds4tui.chat import events as ev
from ds4tui.cache.policy import CachePolicy
from tests.chat.conftest import LONG_PROMPT, Recorder, make_controller, opening_tokens


def chat(ctl, *texts):
    conv = ctl.new_conversation()
    for t in texts:
        assert ctl.send(conv.key, t, Recorder()) is not None
    return conv


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-dsv4"])
def test_regenerate_prefills_nothing_and_needs_no_forward_first(spec, tmp_path):
    from ds4tui.engine.loader import load_model

    ctl = make_controller(load_model(spec), tmp_path)
    conv = chat(ctl, "Hello there.", "Tell me a story.")
    first = conv.messages[-1]["content"]
    events = Recorder()
    done = ctl.regenerate(conv.key, events)
    assert done.cache.source == "live" and done.cache.prefilled == 0 and done.prompt_tokens == 0
    assert done.cache.replayed == 0 and not done.forward_before_first_token and done.regenerated
    assert events.of(ev.PrefillStarted)[0].total == 0
    # Greedy from the kept logits: the same reply, bit for bit.
    assert conv.messages[-1]["content"] == first and events.reply == first
    assert ctl.alternatives(conv.key, len(conv.messages) - 1) == (1, 2)


def test_alternatives_switch_and_the_next_turn_continues_from_the_shown_one(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path, temperature=1.0, seed=7, max_tokens=12)
    conv = chat(ctl, "Say something.")
    index = len(conv.messages) - 1
    first = conv.messages[index]["content"]
    ctl.regenerate(conv.key, Recorder())
    second = conv.messages[index]["content"]
    assert second != first  # the seed is offset per version
    assert ctl.alternatives(conv.key, index) == (1, 2)
    assert ctl.show_alternative(conv.key, index, -1) == first
    assert ctl.alternatives(conv.key, index) == (0, 2) and conv.messages[index]["content"] == first
    assert ctl.show_alternative(conv.key, index, -1) == first  # clamped, no wrap
    events = Recorder()
    done = ctl.send(conv.key, "Go on.", events)
    # The session held the second version: it rewinds to the prompt and prefills the first one's text.
    assert done.cache.source == "live"
    rendered = tiny_llama.chat.render(conv.messages[:-1], add_generation_prompt=False)
    assert conv.session_text.decode("utf-8", errors="replace").startswith(rendered)
    with pytest.raises(ValueError):
        ctl.show_alternative(conv.key, index, 1)  # no longer the last reply


def test_regenerate_cancelled_keeps_the_old_reply(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path)
    conv = chat(ctl, "Hello.")
    before = list(conv.messages)
    with pytest.raises(ValueError):
        ctl.regenerate(ctl.new_conversation().key)  # nothing to regenerate

    def cancel_first(event):
        if isinstance(event, ev.PrefillStarted):
            ctl.cancel()

    done = ctl.regenerate(conv.key, cancel_first)
    assert done is not None and done.stop == "cancelled"  # cancelled before its first token
    assert conv.messages[:-1] == before[:-1] and conv.messages[-1]["role"] == "assistant"


def test_edit_prefills_only_the_edited_suffix_and_keeps_a_fork(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path)
    conv = chat(ctl, "First question here.", "Second question here.", "Third one.")
    old = [dict(m) for m in conv.messages]
    old_sha = conv.saved_sha
    index = next(i for i, m in enumerate(conv.messages) if m["content"] == "Second question here.")
    events = Recorder()
    done, fork = ctl.edit(conv.key, index, "Second question, edited.", events)
    prompt = tiny_llama.chat.render(conv.messages[:-1], add_generation_prompt=True)
    cold = len(tiny_llama.tokenizer.encode(prompt))
    assert done.cache.source == "live" and done.cache.replayed <= 1
    assert done.cache.reused + done.cache.prefilled == len(conv.session.tokens) - done.tokens - opening_tokens(tiny_llama)
    # Everything before the edited message came from the session; only its text and the
    # generation prompt were prefilled.
    edited_part = tiny_llama.tokenizer.encode("Second question, edited.<|im_end|>\n<|im_start|>assistant\n")
    assert done.cache.prefilled <= len(edited_part) + 2 and done.cache.reused >= cold - len(edited_part) - 2
    assert [m["content"] for m in conv.messages[:index]] == [m["content"] for m in old[:index]]
    # The old continuation is a fork holding the old messages and the old file's state.
    assert fork.messages == old and fork.display_title.endswith("(fork)") and fork.forked_from[1] == index
    assert conv.saved_sha == old_sha  # named by title and creation time: the chat's new state
    assert os.path.exists(os.path.join(tmp_path, fork.saved_sha + ".kv")) and not fork.live
    held = fork.context_tokens
    later, fork_sha = Recorder(), fork.saved_sha
    ctl.send(fork.key, "Back on the old branch.", later)
    started = later.of(ev.PrefillStarted)[0]
    assert started.source == "disk" and later.of(ev.Hit)[0].sha == fork_sha
    assert started.cached == later.of(ev.Hit)[0].tokens
    # Parked on that file, the fork's context was its tokens (the meter read 0 for a fork holding 203).
    assert held == later.of(ev.Hit)[0].tokens > 0


def test_fork_copies_the_live_state_and_answers_like_the_parent(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path)
    conv = chat(ctl, "One.", "Two.")
    events = Recorder()
    fork = ctl.fork(conv.key, len(conv.messages), events)
    forked = events.of(ev.Forked)[0]
    assert forked.source == "memory" and forked.tokens > 0 and forked.replayed <= 1
    assert fork.live and fork.display_title == f"{conv.display_title} (fork)"
    assert fork.saved_sha and any(s.reason == "agent-session" for s in events.of(ev.Saved))
    a, b = Recorder(), Recorder()
    done_b = ctl.send(fork.key, "Three.", b)
    done_a = ctl.send(conv.key, "Three.", a)
    assert done_b.cache.source == "live" and done_b.cache.reused == forked.tokens
    assert done_b.cache.prefilled == done_a.cache.prefilled  # the fork prefilled only the new message
    assert a.reply == b.reply  # the same state: the same greedy reply
    second = ctl.fork(conv.key, 2, Recorder())  # at the first reply
    assert second.display_title.endswith("(fork 2)") and second.messages == conv.messages[:2]


def test_fork_of_a_parked_chat_loads_the_parents_file(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path)
    conv = chat(ctl, "One.", "Two.")
    ctl.pool.free(conv, "evict", Recorder())
    events = Recorder()
    fork = ctl.fork(conv.key, 3, events)  # the first exchange and the second question
    forked = events.of(ev.Forked)[0]
    assert forked.source == "disk" and forked.tokens > 0 and fork.live
    assert events.of(ev.Hit)[0].sha == conv.saved_sha
    done = ctl.send(fork.key, "Next.", Recorder())
    assert done.cache.source == "live" and done.cache.reused == forked.tokens


def test_cache_report_names_the_source(tiny_llama, tmp_path):
    from tests.chat.conftest import LONG_PROMPT

    first = make_controller(tiny_llama, tmp_path, max_tokens=3)
    done = first.send(first.new_conversation().key, LONG_PROMPT, Recorder())
    assert done.cache.source == "cold" and done.cache.reason == "no cached prefix" and done.cache.reused == 0
    second = make_controller(tiny_llama, tmp_path, max_tokens=3)
    done = second.send(second.new_conversation().key, LONG_PROMPT, Recorder())
    assert done.cache.source == "disk" and done.cache.sha and done.cache.ms is not None and done.cache.reused > 0
    off = make_controller(tiny_llama, tmp_path, no_disk_cache=True, max_tokens=3)
    assert off.send(off.new_conversation().key, "Hi.", Recorder()).cache.reason == "disk cache off"


def test_full_context_choices(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path, ctx=256, max_tokens=8, system_prompt="Be brief.")
    conv = ctl.new_conversation()
    def text_of(i: int) -> str:  # each exchange differs from its first character
        return f"{'ABCDEFGHIJ'[i]} question " + "pad " * 25

    sent = 0
    while ctl.check_fit(conv.key, text_of(sent)).fits:
        assert ctl.send(conv.key, text_of(sent), Recorder()) is not None
        sent += 1
    assert sent >= 2
    text = text_of(sent)
    check = ctl.check_fit(conv.key, text)
    assert not check.fits and check.prompt_tokens + check.reserve > check.ctx == 256
    assert check.drop_turns and check.drop_prefill and check.fresh_tokens < check.ctx
    before = list(conv.messages)
    events = Recorder()
    assert ctl.send(conv.key, text, events) is None  # refused, nothing truncated
    assert events.of(ev.ContextWontFit)[0].check == check and conv.messages == before
    ctl.drop_oldest(conv.key, check.drop_turns)
    assert conv.messages[0] == {"role": "system", "content": "Be brief."}
    assert len(conv.messages) == len(before) - 2 * check.drop_turns
    done = ctl.send(conv.key, text, Recorder())
    assert done is not None and done.cache.source == "live"
    # The system prompt stayed in the session; everything after it was re-prefilled.
    system = len(tiny_llama.tokenizer.encode(tiny_llama.chat.render(before[:1], False)))
    assert system <= done.cache.reused <= system + 4  # and "<|im_start|>user\n", shared too
    assert abs(done.cache.reused + done.cache.prefilled - (system + check.drop_prefill)) <= 1
    fresh = ctl.fresh_like(conv.key)
    assert fresh.messages == [{"role": "system", "content": "Be brief."}] and fresh.key != conv.key


def test_hitting_the_context_during_a_reply_stops_visibly(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path, ctx=64, max_tokens=8, no_disk_cache=True)
    conv = ctl.new_conversation()
    ctl.set_chat_settings(conv.key, max_tokens=500)
    done = ctl.send(conv.key, "Hi " * 5, Recorder())
    assert done.stop == "context-full" and done.context_tokens == 64


def test_chat_settings_apply_to_one_chat(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path, system_prompt="Default.")
    a, b = ctl.new_conversation(), ctl.new_conversation()
    ctl.set_chat_settings(a.key, max_tokens=2, temperature=0.5, system_prompt="Custom.")
    assert ctl.chat_settings(a.key)["max_tokens"] == 2 and ctl.chat_settings(a.key)["system_prompt"] == "Custom."
    assert ctl.chat_settings(b.key)["max_tokens"] == 8 and ctl.chat_settings(b.key)["system_prompt"] == "Default."
    assert ctl.new_conversation().system_prompt == "Default."
    assert ctl.send(a.key, "Hello.", Recorder()).tokens <= 2
    with pytest.raises(ValueError):
        ctl.set_chat_settings(a.key, swa_policy="zero")
    # A new system prompt changes the first message: the next turn starts over from there.
    ctl.set_chat_settings(a.key, system_prompt="Other.")
    done = ctl.send(a.key, "Again.", Recorder())
    assert done.cache.reused < 8


def test_import_opens_a_chat_that_prefills_its_transcript(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path, no_disk_cache=True)
    msgs = [{"role": "user", "content": "Old question."}, {"role": "assistant", "content": "Old answer."}]
    conv = ctl.import_messages(msgs, title="Imported", created_at=1_700_000_000)
    assert conv.messages == msgs and conv.title == "Imported" and not conv.live
    done = ctl.send(conv.key, "New question.", Recorder())
    assert done.cache.source == "cold" and done.prompt_tokens == len(
        tiny_llama.tokenizer.encode(tiny_llama.chat.render(msgs + [{"role": "user", "content": "New question."}])))


def test_fit_check_of_a_live_chat_counts_what_the_turn_holds(tiny_llama, tmp_path):
    """On a live chat the check counts the session's tokens plus the new text's, without
    encoding the transcript again: the count is the prompt the turn then holds."""
    ctl = make_controller(tiny_llama, tmp_path, max_tokens=3)
    conv = chat(ctl, "Tell me about the river.", "What is a cat?")
    text = "Which is older?"
    prompt = tiny_llama.chat.render(conv.messages + [{"role": "user", "content": text}])
    assert prompt.startswith(conv.session_text.decode())  # the replies hold whole characters only
    calls = []
    encode = tiny_llama.tokenizer.encode
    tiny_llama.tokenizer.encode = lambda s: calls.append(s) or encode(s)
    try:
        check = ctl.check_fit(conv.key, text)
    finally:
        del tiny_llama.tokenizer.encode
    assert check.fits and len(calls) == 1 and "river" not in calls[0] and text in calls[0]
    events = Recorder()
    ctl.send(conv.key, text, events)
    started = events.of(ev.PrefillStarted)[0]
    assert started.source == "live" and check.prompt_tokens == started.cached + started.total


class _Encodes(list):
    """The texts a tokenizer is asked to encode while this is open."""

    def __init__(self, tokenizer) -> None:
        super().__init__()
        self._tokenizer = tokenizer

    def __enter__(self):
        encode = self._tokenizer.encode
        self._tokenizer.encode = lambda s: self.append(s) or encode(s)
        return self

    def __exit__(self, *exc) -> None:
        del self._tokenizer.encode


def test_fit_check_after_a_restart_counts_what_the_disk_hit_holds(tiny_llama, tmp_path):
    """A chat whose state is only on disk (a new process, the transcript sent again): the check
    counts the tokens of the cached file the turn restores plus the new text's, encoding only
    the new text; the turn then holds exactly that many. (Empty replies: their text must be a
    byte prefix of the next prompt, which a random model's bytes need not be.)"""
    first = make_controller(tiny_llama, tmp_path, max_tokens=0)
    conv = chat(first, LONG_PROMPT, "What is a river?")
    first.shutdown()  # the shutdown checkpoint holds the whole transcript
    second = make_controller(tiny_llama, tmp_path, max_tokens=0)
    again = second.import_messages(conv.messages)
    text = "Which is older?"
    with _Encodes(tiny_llama.tokenizer) as calls:
        check = second.check_fit(again.key, text)
    assert check.fits and len(calls) == 1 and "river" not in calls[0] and text in calls[0]
    events = Recorder()
    second.send(again.key, text, events)
    started = events.of(ev.PrefillStarted)[0]
    assert started.source == "disk" and started.cached > 0
    assert check.prompt_tokens == started.cached + started.total


def test_fit_check_of_a_parked_chat_counts_its_titled_file(tiny_llama, tmp_path):
    """A chat freed from memory (the live-session cap) continues from its titled file: the check
    counts that file's tokens plus the new text's."""
    ctl = make_controller(tiny_llama, tmp_path, policy=CachePolicy(min_tokens=10**6), live_sessions=1, max_tokens=0)
    parked = chat(ctl, "Chat A: tell me about the river.")
    chat(ctl, "Chat B: hello.")
    assert not parked.live and parked.saved_sha
    text = "Back to chat A."
    with _Encodes(tiny_llama.tokenizer) as calls:
        check = ctl.check_fit(parked.key, text)
    assert check.fits and len(calls) == 1 and "river" not in calls[0] and text in calls[0]
    events = Recorder()
    ctl.send(parked.key, text, events)
    assert events.of(ev.Hit)[0].sha == parked.saved_sha
    started = events.of(ev.PrefillStarted)[0]
    assert started.source == "disk" and check.prompt_tokens == started.cached + started.total


def test_fit_check_without_a_cached_prefix_counts_the_whole_prompt(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path, max_tokens=0)
    msgs = [{"role": "user", "content": "Old question."}, {"role": "assistant", "content": "Old answer."}]
    conv = ctl.import_messages(msgs)
    check = ctl.check_fit(conv.key, "New question.")
    prompt = tiny_llama.chat.render(msgs + [{"role": "user", "content": "New question."}])
    assert check.prompt_tokens == len(tiny_llama.tokenizer.encode(prompt))
    events = Recorder()
    ctl.send(conv.key, "New question.", events)
    started = events.of(ev.PrefillStarted)[0]
    assert started.source == "cold" and started.total == check.prompt_tokens
