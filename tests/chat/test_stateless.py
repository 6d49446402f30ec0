"""Stateless requests (the whole message list each time) on the chat's sessions: routing to the
live session with the longest prefix, parking to disk over the live-session cap, coming back."""

from __future__ import annotations

from ds4tui.chat import events as ev
from ds4tui.chat.stateless import StatelessChats
from ds4tui.chat.turn import TurnOptions
from ds4tui.engine.sampling import SamplingParams
from tests.chat.conftest import Recorder, make_controller

GREEDY = TurnOptions(sampling=SamplingParams(temperature=0.0), max_tokens=6)


def _ask(chats, messages):
    rec = Recorder()
    c = chats.complete(messages, rec, GREEDY)
    assert c is not None
    return c, rec


def test_requests_route_to_their_own_live_session(tiny_llama, tmp_path):
    chats = StatelessChats(make_controller(tiny_llama, tmp_path, live_sessions=4))
    a = [{"role": "user", "content": "conversation A"}]
    b = [{"role": "user", "content": "conversation B"}]
    first_a, _ = _ask(chats, a)
    first_b, _ = _ask(chats, b)
    assert first_a.source == "cold" and first_a.cached_tokens == 0
    # B's prompt shares the system turn and "conversation " with A's: a fork of A's session
    assert first_b.source == "fork" and 0 < first_b.cached_tokens < first_b.prompt_tokens
    a += [{"role": "assistant", "content": first_a.text}, {"role": "user", "content": "more A"}]
    second_a, rec = _ask(chats, a)
    assert second_a.source == "live" and second_a.cached_tokens == first_a.prompt_tokens + first_a.done.tokens
    assert rec.of(ev.PrefillStarted)[0].cached == second_a.cached_tokens
    assert chats.controller.live_count() == 2


def test_over_the_cap_a_session_parks_on_disk_and_comes_back(tiny_llama, tmp_path):
    chats = StatelessChats(make_controller(tiny_llama, tmp_path, live_sessions=1))
    a = [{"role": "user", "content": "parked conversation"}]
    first_a, _ = _ask(chats, a)
    _, rec_b = _ask(chats, [{"role": "user", "content": "another one pushes it out"}])
    saved = [e for e in rec_b.of(ev.Saved) if e.reason == "evict"]
    assert len(saved) == 1 and saved[0].tokens == first_a.prompt_tokens + first_a.done.tokens
    assert chats.controller.live_count() == 1
    # Only valid text round-trips byte for byte; the tiny model's reply may hold stray bytes.
    a += [{"role": "assistant", "content": "a clean reply"}, {"role": "user", "content": "back again"}]
    again, rec = _ask(chats, a)
    assert again.source == "disk" and 0 < again.cached_tokens < again.prompt_tokens
    assert rec.of(ev.Hit)


def test_a_new_conversation_gets_prepared_or_recycled_memory(tmp_path):
    """Under the cap the next conversation's buffers are prepared after a request; over it, the
    parked one's buffers go to the newcomer."""
    from tests.chat.test_sessions import _private_tiny_llama, _settled

    model = _private_tiny_llama()
    chats = StatelessChats(make_controller(model, tmp_path, live_sessions=2))
    _ask(chats, [{"role": "user", "content": "conversation A"}])
    _settled(model)
    spare = model._spare
    assert spare is not None
    _ask(chats, [{"role": "user", "content": "conversation B"}])
    live = {c.key: c.session for c in chats.controller.conversations.live()}
    assert any(s.kv is spare for s in live.values())
    ptrs = {k: s.kv.data_ptr() for k, s in live.items()}
    _settled(model)
    assert model._spare is None  # at the cap
    _ask(chats, [{"role": "user", "content": "conversation C"}])  # parks the oldest, takes its buffers
    after = {c.key: c.session for c in chats.controller.conversations.live()}
    gone, (new,) = [k for k in live if k not in after], [k for k in after if k not in live]
    assert len(gone) == 1 and live[gone[0]].kv is None
    assert after[new].kv.data_ptr() == ptrs[gone[0]]
