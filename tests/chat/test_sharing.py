"""Prompts that share a prefix: the cold checkpoint at the stable chat prefix (ds4's anchor),
forks of another conversation's live session, the divergence point kept on disk, and replies
equal to a cold prefill's."""

from __future__ import annotations

import os
from dataclasses import replace

from ds4tui.cache.store import KvStore
from ds4tui.chat import events as ev
from ds4tui.chat.sharing import anchor_tokens, best_share, stable_point, task_message
from ds4tui.chat.conversation import Conversation
from ds4tui.chat.stateless import StatelessChats
from ds4tui.chat.turn import TurnOptions
from ds4tui.engine.sampling import SamplingParams
from ds4tui.format.kvc import read_kvc
from tests.chat.conftest import SMALL_POLICY, Recorder, make_controller

GREEDY = TurnOptions(sampling=SamplingParams(temperature=0.0), max_tokens=6)
# A system prompt of ~150 tiny-llama tokens: past SMALL_POLICY's 32-token minimum.
SYSTEM = "You answer questions about the harbour town. Keep the log entries in order. " * 6


def _ask(chats, messages, options=GREEDY):
    rec = Recorder()
    c = chats.complete(messages, rec, options)
    assert c is not None
    return c, rec


def _chat(question: str, system: str = SYSTEM) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def _texts(directory, reason: str) -> list[bytes]:
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".kv"):
            with open(os.path.join(directory, name), "rb") as fp:
                kvc = read_kvc(fp, with_trailers=False)
            if kvc.header.reason == reason:
                out.append(kvc.text)
    return out


def test_task_message_is_the_last_user_message_before_the_first_reply():
    system = {"role": "system", "content": "s"}
    assert task_message([system, {"role": "user", "content": "scaffold"}, {"role": "user", "content": "task"}]) == 2
    assert task_message([system, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                         {"role": "user", "content": "later"}]) == 1
    assert task_message([system]) is None


def test_anchor_is_the_start_of_the_task_turn(tiny_llama):
    tok, chat = tiny_llama.tokenizer, tiny_llama.chat
    render = lambda m: chat.render(m, add_generation_prompt=True)  # noqa: E731
    for messages in (_chat("What is the tide?"),
                     [*_chat("Rules of the log."), {"role": "user", "content": "What is the tide?"}],
                     [*_chat("What is the tide?"), {"role": "assistant", "content": "High."},
                      {"role": "user", "content": "And tomorrow?"}]):
        prompt = render(messages)
        tokens = tok.encode(prompt)
        n = anchor_tokens(render, tok, messages, prompt, tokens)
        i = task_message(messages)
        # What the tokens before the anchor stand for: everything before the task's own turn.
        before = chat.render(messages[:i], add_generation_prompt=False)
        assert b"".join(tok.token_bytes(t) for t in tokens[:n]) == before.encode("utf-8")
        assert tokens[n] in tok.boundary_ids  # the turn's opening marker comes next


def test_no_anchor_without_a_user_message_or_boundary_tokens(tiny_llama):
    tok, chat = tiny_llama.tokenizer, tiny_llama.chat
    render = lambda m: chat.render(m, add_generation_prompt=True)  # noqa: E731
    system_only = [{"role": "system", "content": SYSTEM}]
    prompt = render(system_only)
    assert anchor_tokens(render, tok, system_only, prompt, tok.encode(prompt)) == 0

    class NoBoundaries:
        boundary_ids = frozenset()

    messages = _chat("x")
    assert anchor_tokens(render, NoBoundaries(), messages, render(messages), tok.encode(render(messages))) == 0


def test_stable_point_backs_off_to_a_boundary_token_or_the_trim(tiny_llama):
    tok = tiny_llama.tokenizer
    tokens = tok.encode(tiny_llama.chat.render(_chat("What is the tide today?")))
    marker = max(j for j, t in enumerate(tokens) if t in tok.boundary_ids)  # the assistant turn's opening
    assert stable_point(tok, tokens, marker + 3, trim=8) == marker
    assert stable_point(tok, tokens, marker, trim=8) < marker  # at `at` itself the cut is already before it
    plain = tok.encode("plain text without any special token " * 4)
    assert stable_point(tok, plain, 20, trim=8) == 12


def test_best_share_prefers_the_most_tokens_and_a_whole_prompt_at_a_mark(tiny_llama):
    tok = tiny_llama.tokenizer
    prompt = tok.encode(tiny_llama.chat.render(_chat("What is the tide today?")))
    near = Conversation(key="near", session=tiny_llama.new_session(512))
    near.session.prefill(prompt[:-5])
    same = Conversation(key="same", session=tiny_llama.new_session(512))
    same.session.prefill(prompt)  # a prefill's end keeps a mark
    same.session.decode(5)
    share = best_share([near, same], prompt)
    assert (share.donor.key, share.tokens, share.whole) == ("same", len(prompt), True)
    longer = Conversation(key="longer", session=tiny_llama.new_session(512))
    longer.session.prefill(prompt + [5, 6])  # no mark at the prompt's end: all but its last token
    assert (best_share([near, longer], prompt).tokens, best_share([longer], prompt).whole) == (len(prompt) - 1, False)
    assert best_share([], prompt) is None


def test_shared_system_prompt_cold_anchor_fork_and_restart(tiny_llama, tmp_path):
    """The first request writes its cold checkpoint at the end of the system turn; a request with
    another question forks that live session; the same prompt again reuses all of it; after a
    restart another question finds the anchor on disk. Every reply equals a cold prefill's."""
    chats = StatelessChats(make_controller(tiny_llama, tmp_path / "kv", live_sessions=4))
    first, rec = _ask(chats, _chat("What is the tide today?"))
    assert first.source == "cold"
    anchor = chats.controller.model.chat.render([{"role": "system", "content": SYSTEM}], add_generation_prompt=False)
    cold = [s for s in rec.of(ev.Saved) if s.reason == "cold"]
    assert len(cold) == 1 and _texts(tmp_path / "kv", "cold") == [anchor.encode("utf-8")]
    anchor_tokens_n = cold[0].tokens

    second, rec = _ask(chats, _chat("Who keeps the harbour log?"))
    assert second.source == "fork" and second.cached_tokens >= anchor_tokens_n
    assert not rec.of(ev.Hit) and len(_texts(tmp_path / "kv", "cold")) == 1  # nothing new worth a file

    again, _ = _ask(chats, _chat("Who keeps the harbour log?"))
    assert again.source == "fork" and again.cached_tokens >= again.prompt_tokens - 1
    assert again.text == second.text

    restarted = StatelessChats(make_controller(tiny_llama, tmp_path / "kv"))
    fourth, rec = _ask(restarted, _chat("When does the market open?"))
    assert fourth.source == "disk" and fourth.cached_tokens == anchor_tokens_n
    for got, question in ((first, "What is the tide today?"), (second, "Who keeps the harbour log?"),
                          (fourth, "When does the market open?")):
        reference = StatelessChats(make_controller(tiny_llama, tmp_path / "ref", no_disk_cache=True))
        want, _ = _ask(reference, _chat(question))  # a cold prefill: nothing to share, no disk
        assert want.source == "cold" and got.text == want.text and got.done.tokens == want.done.tokens


def test_a_long_divergence_point_is_kept_for_later_prompts(tiny_llama, tmp_path):
    """Plain-text prompts (no chat turns, no anchor) sharing a long start: the second one forks
    the first's session and checkpoints the shared part (trimmed), which a restart then finds."""
    shared = "The harbour log of the small town by the sea, entry by entry, as the keeper wrote it. " * 4
    # A long own tail: the first prompt's cold checkpoint (its trimmed length) covers part of
    # it, and no continued checkpoint holds the shared part alone.
    tail = "First: " + "the tide rises over the old stone quay. " * 5
    policy = replace(SMALL_POLICY, continued_interval_tokens=0)
    a = TurnOptions(sampling=SamplingParams(temperature=0.0), max_tokens=4, prompt=shared + tail)
    b = TurnOptions(sampling=SamplingParams(temperature=0.0), max_tokens=4, prompt=shared + "Second: the boats")
    chats = StatelessChats(make_controller(tiny_llama, tmp_path, policy=policy, live_sessions=4))
    first, rec_a = _ask(chats, [], a)
    assert first.source == "cold"
    second, rec = _ask(chats, [], b)
    kept = [s for s in rec.of(ev.Saved) if s.reason == "cold"]
    assert second.source == "fork" and len(kept) == 1
    shared_tokens = len(tiny_llama.tokenizer.encode(shared))
    assert shared_tokens - SMALL_POLICY.boundary_trim_tokens - 2 <= kept[0].tokens <= shared_tokens
    assert second.cached_tokens == kept[0].tokens  # forked at the kept point, the rest prefilled
    store = KvStore(tmp_path, SMALL_POLICY)
    assert store.path_for(kept[0].sha).exists()

    third = TurnOptions(sampling=SamplingParams(temperature=0.0), max_tokens=4, prompt=shared + "Third: the market")
    restarted = StatelessChats(make_controller(tiny_llama, tmp_path, policy=policy))
    got, _ = _ask(restarted, [], third)
    assert got.source == "disk" and got.cached_tokens == kept[0].tokens


def test_chat_with_a_long_system_prompt_shares_it_with_the_next_chat(tiny_llama, tmp_path):
    """In the app: a second chat with the same system prompt forks the first chat's session."""
    ctl = make_controller(tiny_llama, tmp_path, system_prompt=SYSTEM)
    first, rec = ctl.new_conversation(), Recorder()
    ctl.send(first.key, "What is the tide today?", rec)
    assert [s for s in rec.of(ev.Saved) if s.reason == "cold"]
    second, rec = ctl.new_conversation(), Recorder()
    ctl.send(second.key, "Who keeps the harbour log?", rec)
    report = rec.of(ev.Done)[0].cache
    assert report.source == "fork" and report.reused >= len(tiny_llama.tokenizer.encode(
        tiny_llama.chat.render([{"role": "system", "content": SYSTEM}], add_generation_prompt=False)))


def test_a_fork_that_would_recompute_from_the_start_is_not_taken():
    """DeepSeek V4 rewinds from its nearest mark: a donor whose only mark is past the shared point
    would re-run the whole shared part, so the turn prefills cold instead (same work, no copy)."""
    from ds4tui.engine.loader import load_model

    model = load_model("tiny-dsv4")
    chats = StatelessChats(make_controller(model, None, no_disk_cache=True, live_sessions=4))
    # Short prompts: no cold checkpoint split (the disk cache is off), so the first session's
    # only mark is at its prompt's end, past the point the second prompt leaves it.
    first, _ = _ask(chats, [{"role": "user", "content": "The harbour log: what is the tide?"}])
    second, _ = _ask(chats, [{"role": "user", "content": "The harbour log: who keeps it?"}])
    assert first.source == second.source == "cold"
    # The same prompt again is at that mark: forked whole, nothing recomputed.
    again, _ = _ask(chats, [{"role": "user", "content": "The harbour log: who keeps it?"}])
    assert again.source == "fork" and again.cached_tokens == again.prompt_tokens
