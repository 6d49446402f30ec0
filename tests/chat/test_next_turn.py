"""The next user turn's opening, forwarded after a reply (chat/next_turn.py): the follow-up
prefills only its message, live or from disk, answers as without it, and files holding an
opened turn read back without an empty user message."""

from __future__ import annotations

import torch

from ds4tui.chat import controller as controller_module
from ds4tui.chat import events as ev
from ds4tui.chat.next_turn import open_next_turn, opening, without_open_turn
from ds4tui.chat.transcript import parse_text
from tests.chat.conftest import CHATML_OPENING, Recorder, make_controller, opening_tokens

FIRST, FOLLOW_UP = "Name a large city in France.", "And one in Italy?"


def _no_opening(monkeypatch) -> None:
    monkeypatch.setattr(controller_module, "open_next_turn", lambda *args, **kwargs: 0)


def _two_turns(model, tmp_path):
    ctl = make_controller(model, tmp_path)
    conv = ctl.new_conversation()
    first = ctl.send(conv.key, FIRST, Recorder())
    after_first = (len(conv.session.tokens), conv.session_text)
    events = Recorder()
    second = ctl.send(conv.key, FOLLOW_UP, events)
    return first, after_first, second, events, conv


def test_the_opening_is_the_end_of_the_reply_and_the_start_of_a_user_turn(tiny_llama):
    messages = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    ahead = opening(tiny_llama.chat, messages)
    assert ahead == tiny_llama.chat.render(messages, add_generation_prompt=False) + "<|im_start|>user\n"
    assert ahead.endswith("Hello." + CHATML_OPENING)
    # every next message's prompt starts with it
    assert tiny_llama.chat.render(messages + [{"role": "user", "content": "Another."}]).startswith(ahead)


def test_a_follow_up_prefills_only_its_message_and_answers_as_without_the_opening(tiny_llama, tmp_path, monkeypatch):
    first, (held, text), second, events, conv = _two_turns(tiny_llama, tmp_path / "on")
    assert held == first.context_tokens + opening_tokens(tiny_llama)
    assert text.endswith(CHATML_OPENING.encode())
    with monkeypatch.context() as m:
        _no_opening(m)
        first_b, (held_b, _), second_b, events_b, conv_b = _two_turns(tiny_llama, tmp_path / "off")
    assert held_b == first_b.context_tokens
    # The follow-up: the opening's tokens came from the session, the rest was prefilled.
    assert second.cache.source == second_b.cache.source == "live"
    assert second.cache.reused == second_b.cache.reused + opening_tokens(tiny_llama)
    assert second.cache.prefilled == second_b.cache.prefilled - opening_tokens(tiny_llama)
    # Same tokens in the session, the same greedy reply, logits within float noise
    # (the opening ran as its own chunk).
    assert events.reply == events_b.reply and events.reply
    n = second.context_tokens
    assert conv.session.tokens[:n] == conv_b.session.tokens[:n]
    for a, b in zip(conv.session.kv, conv_b.session.kv):
        assert torch.allclose(a[..., :n, :].float(), b[..., :n, :].float(), atol=2e-3)


def test_a_resumed_chat_continues_from_the_opened_turn_on_disk(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path)
    conv = ctl.new_conversation()
    # A message whose reply (8 greedy tokens of the seeded tiny model) is valid UTF-8: the
    # transcript then renders to the file's exact bytes, which a new chat's lookup needs.
    ctl.send(conv.key, "Hello.", Recorder())
    assert conv.session_text.decode("utf-8").encode() == conv.session_text
    messages, held = list(conv.messages), len(conv.session.tokens)
    ctl.shutdown()
    message_tokens = len(tiny_llama.tokenizer.encode(f"{FOLLOW_UP}<|im_end|>\n<|im_start|>assistant\n"))
    # A new chat with the same messages finds the titled file by its text: only the message is left.
    other = make_controller(tiny_llama, tmp_path)
    conv2 = other.new_conversation()
    conv2.messages = [dict(m) for m in messages]
    from_disk = Recorder()
    other.send(conv2.key, FOLLOW_UP, from_disk)
    started = from_disk.of(ev.PrefillStarted)[0]
    assert started.source == "disk" and started.cached == held and started.total == message_tokens
    # The chat resumed by its title: the transcript as sent (the template's own system prompt
    # aside), no empty user message from the opened turn; the next message prefills only itself.
    fresh = make_controller(tiny_llama, tmp_path)
    resumed = fresh.resume(conv.display_title)
    assert [m for m in resumed.messages if m["role"] != "system"] == messages
    assert len(resumed.session.tokens) == held and resumed.session_text.endswith(CHATML_OPENING.encode())
    events = Recorder()
    done = fresh.send(resumed.key, FOLLOW_UP, events)
    assert done.cache.source == "live" and done.cache.reused == held and done.cache.prefilled == message_tokens
    assert events.reply == from_disk.reply


def test_a_stored_text_with_an_opened_turn_reads_back_without_it():
    text = ("<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\n")
    assert parse_text(text) == [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    alone = [{"role": "user", "content": ""}]
    assert without_open_turn(alone) == alone  # nothing before it: not an opened turn


def test_no_opening_without_room_after_a_cancel_or_when_the_template_rewrites_the_reply(tiny_llama, tmp_path,
                                                                                         monkeypatch):
    _no_opening(monkeypatch)
    ctl = make_controller(tiny_llama, tmp_path)
    conv = ctl.new_conversation()
    ctl.send(conv.key, FIRST, Recorder())
    held, text_of = len(conv.session.tokens), ctl.turns.text_of
    session = conv.session
    # No room: the context ends within the opening.
    full = session.ctx_size
    session.ctx_size = held + opening_tokens(tiny_llama)
    assert open_next_turn(conv, tiny_llama.chat, tiny_llama.tokenizer, text_of) == 0
    session.ctx_size = full
    # Cancelled before it ran.
    assert open_next_turn(conv, tiny_llama.chat, tiny_llama.tokenizer, text_of, lambda: True) == 0
    assert len(session.tokens) == held

    class Rewriting:  # a template that renders an earlier reply other than it was generated
        def render(self, messages, add_generation_prompt=True, now=None):
            changed = [dict(m, content=m["content"].upper()) if m["role"] == "assistant" else m for m in messages]
            return tiny_llama.chat.render(changed, add_generation_prompt, now=now)

    assert open_next_turn(conv, Rewriting(), tiny_llama.tokenizer, text_of) == 0
    assert len(session.tokens) == held and conv.session_text == text_of(session.tokens)
    # The real template: the opening goes in, the text follows the tokens.
    assert open_next_turn(conv, tiny_llama.chat, tiny_llama.tokenizer, text_of) == opening_tokens(tiny_llama)
    assert conv.session_text == text_of(session.tokens) and conv.session_text.endswith(CHATML_OPENING.encode())
