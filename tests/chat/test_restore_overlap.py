"""A disk hit through the controller: the new message's first chunk runs while the file is
read (LlamaSession.load_payload_ahead), with the same bits as restore-then-prefill, and a
file that fails at its end is rejected with its reason, nothing of it kept."""

from __future__ import annotations

import pytest
import torch

from ds4tui.chat import events as ev
from ds4tui.engine.llama import session_payload
from ds4tui.format.kvc import PREFIX_BYTES, decode_header
from tests.chat.conftest import LONG_PROMPT, Recorder, make_controller, opening_tokens

FOLLOW_UP = "Thanks. And in one word?"


class Forwards:
    """The model's forwards during a turn: (run alongside a restore, tokens)."""

    def __init__(self, model, monkeypatch) -> None:
        self.calls: list[tuple[bool, int]] = []
        inner = model.forward

        def forward(kv, tokens, *args, **kwargs):
            self.calls.append((kwargs.get("before_layer") is not None, len(tokens)))
            return inner(kv, tokens, *args, **kwargs)

        monkeypatch.setattr(model, "forward", forward)


def _chat_on_disk(model, tmp_path) -> list[dict]:
    """A conversation whose whole transcript is checkpointed on shutdown; its messages."""
    ctl = make_controller(model, tmp_path)
    conv = ctl.new_conversation()
    ctl.send(conv.key, LONG_PROMPT, Recorder())
    ctl.shutdown()
    return list(conv.messages)


def _follow_up(model, tmp_path, messages, **config):
    """The next message in a fresh controller: (events, the session after the turn)."""
    ctl = make_controller(model, tmp_path, **config)
    conv = ctl.new_conversation()
    conv.messages = [dict(m) for m in messages]
    events = Recorder()
    assert ctl.send(conv.key, FOLLOW_UP, events) is not None
    return events, conv.session


def _same_state(a, b) -> None:
    n = len(a.tokens)
    assert a.tokens == b.tokens
    assert torch.equal(a.logits, b.logits)
    assert torch.equal(a.kv[:, :, :, :n], b.kv[:, :, :, :n])


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_a_hit_runs_the_message_alongside_the_restore_with_the_same_bits(tiny_llama, tmp_path, monkeypatch, kv_dtype):
    messages = _chat_on_disk(tiny_llama, tmp_path)
    with monkeypatch.context() as m:
        m.setattr(session_payload, "_first_chunk", lambda session, t, ahead: [])  # restore, then prefill
        seq_events, seq = _follow_up(tiny_llama, tmp_path, messages, kv_dtype=kv_dtype, max_tokens=3)
    forwards = Forwards(tiny_llama, monkeypatch)
    events, session = _follow_up(tiny_llama, tmp_path, messages, kv_dtype=kv_dtype, max_tokens=3)
    started = events.of(ev.PrefillStarted)[0]
    assert started.source == "disk" and started.total >= 2
    # The message ran alongside the restore, and not again: then the 3 decode steps, then the
    # next user turn's opening (chat/next_turn.py).
    assert forwards.calls == [(True, started.total)] + [(False, 1)] * 3 + [(False, opening_tokens(tiny_llama))]
    assert events.of(ev.PrefillProgress)[-1].done == started.total  # progress as before
    assert events.reply == seq_events.reply and events.reply
    _same_state(session, seq)


def test_a_file_bad_in_its_last_layer_is_rejected_and_the_reply_is_the_cold_one(tiny_llama, tmp_path, monkeypatch):
    messages = _chat_on_disk(tiny_llama, tmp_path)
    untitled = []
    for path in sorted(tmp_path.glob("*.kv")):
        with open(path, "r+b") as fp:
            header = decode_header(fp.read(PREFIX_BYTES))
            if header.titled:
                continue
            at = PREFIX_BYTES + header.text_bytes + header.payload_bytes - 7  # the last layer's last V row
            fp.seek(at)
            byte = fp.read(1)
            fp.seek(at)
            fp.write(bytes([byte[0] ^ 0x01]))
            untitled.append(path.stem)
    assert untitled
    forwards = Forwards(tiny_llama, monkeypatch)
    events, session = _follow_up(tiny_llama, tmp_path, messages, max_tokens=3)
    rejected = {r.file: r for r in events.of(ev.Rejected)}
    assert set(rejected) == set(untitled)
    assert all("checksum mismatch" in r.reason and r.deleted for r in rejected.values())
    assert forwards.calls[0][0]  # a chunk ran alongside the bad file, and was thrown away
    started = events.of(ev.PrefillStarted)[0]
    assert not events.of(ev.Hit) and started.source == "cold" and started.cached == 0  # left empty
    monkeypatch.undo()
    cold_events, cold = _follow_up(tiny_llama, tmp_path / "none", messages, max_tokens=3, no_disk_cache=True)
    assert events.reply == cold_events.reply and events.reply
    _same_state(session, cold)
