"""Llama 3 GGUFs through the chat controller. Their templates write a system turn into every chat
("Cutting Knowledge Date: December 2023\\nToday Date: ..."); Llama 3.2's dates it with the
day it renders on. A chat saved after two turns and resumed by a fresh controller, on another
day than it started, continues from its whole stored state: nothing of the history is
prefilled again, and the reply is the one the original chat gives.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from ds4tui.chat import events as ev
from tests.chat.conftest import Recorder, make_controller
from tests.engine.llama.arch_models import hf_model, write_gguf

TEMPLATES = Path(__file__).resolve().parents[1] / "engine" / "text" / "templates"
# Llama 3's specials, the end of turn as id 2 (the GGUF's EOS, as in the instruct models).
LLAMA3_SPECIALS = ("<|end_of_text|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>")
STARTED = datetime(2025, 3, 1, 9, 30)  # the day the chat began: not the day the test resumes it


def trimmed(messages: list[dict]) -> list[dict]:
    """Messages as Llama 3's template writes them: each content trimmed (the stored text of a
    reply that began with a space holds it without, as the next turn rendered it)."""
    return [{**m, "content": m["content"].strip()} for m in messages]


@pytest.fixture(scope="module", params=["llama3_1", "llama3_2"])
def llama3(request, tmp_path_factory):
    from ds4tui.engine.loader import load_model

    root = tmp_path_factory.mktemp(request.param)
    path = write_gguf(hf_model("llama"), "llama", root / f"{request.param}.gguf", specials=LLAMA3_SPECIALS,
                      chat_template=(TEMPLATES / f"{request.param}.jinja").read_text(), bos_id=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_DATA_DIR", str(root / "data"))  # the converted copy goes here
        yield load_model(str(path))


def test_a_resumed_llama3_chat_continues_from_its_whole_state(llama3, tmp_path):
    first = make_controller(llama3, tmp_path)
    conv = first.new_conversation()
    conv.template_now = STARTED
    first.send(conv.key, "Hello there, tiny model.", Recorder())
    turn2 = Recorder()
    first.send(conv.key, "Tell me more.", turn2)
    assert turn2.of(ev.PrefillStarted)[0].source == "live"
    text = conv.session_text.decode("utf-8", errors="replace")
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                           "Cutting Knowledge Date: December 2023\nToday Date: ")
    if llama3.chat.source.count("strftime_now"):  # Llama 3.2: the chat's day, not today's
        assert "Today Date: 01 Mar 2025\n" in text and datetime.now().date() != STARTED.date()
    saved = [s for s in turn2.of(ev.Saved) if s.reason == "agent-session"][-1]

    second, events = make_controller(llama3, tmp_path), Recorder()
    resumed = second.resume(saved.sha[:10], events)
    assert trimmed(resumed.messages) == trimmed(conv.messages)  # the header is not read as a system message
    assert resumed.messages[0]["role"] == "user"
    restored = len(resumed.session.tokens)
    assert events.of(ev.Hit) and restored == len(conv.session.tokens)

    a, b = Recorder(), Recorder()
    first.send(conv.key, "One more thing.", a)
    second.send(resumed.key, "One more thing.", b)
    # Exactly what the chat that never left memory reuses: all of the history. (The template
    # trims a reply: one that starts or ends with whitespace is prefilled again, trimmed, in
    # both; a random tiny model's replies often do.)
    started, original = b.of(ev.PrefillStarted)[0], a.of(ev.PrefillStarted)[0]
    assert started.source == "live" and (started.cached, started.total) == (original.cached, original.total)
    assert started.cached >= restored - turn2.of(ev.Done)[0].tokens
    assert b.reply == a.reply
    assert resumed.session_text == conv.session_text


def test_a_system_prompt_reads_back_without_the_header(llama3, tmp_path):
    """With a system prompt the template writes its header in front of it: the resumed chat
    has the user's system prompt, and its next turn still reuses the whole state."""
    first = make_controller(llama3, tmp_path)
    conv = first.new_conversation("Answer in one word.")
    first.send(conv.key, "Hello there, tiny model.", Recorder())
    turn = Recorder()
    first.send(conv.key, "Tell me more.", turn)
    saved = [s for s in turn.of(ev.Saved) if s.reason == "agent-session"][-1]

    second = make_controller(llama3, tmp_path)
    resumed = second.resume(saved.sha[:10], Recorder())
    assert resumed.system_prompt == "Answer in one word." and trimmed(resumed.messages) == trimmed(conv.messages)
    restored = len(resumed.session.tokens)
    a, b = Recorder(), Recorder()
    first.send(conv.key, "One more thing.", a)
    second.send(resumed.key, "One more thing.", b)
    started, original = b.of(ev.PrefillStarted)[0], a.of(ev.PrefillStarted)[0]
    assert started.source == "live" and (started.cached, started.total) == (original.cached, original.total)
    assert started.cached >= restored - turn.of(ev.Done)[0].tokens


def test_a_resumed_chat_whose_session_left_memory_restores_its_own_file(llama3, tmp_path, monkeypatch):
    """The disk path: a resumed chat parked by the live-session cap comes back from its own
    file, whole. Every reply is "Blue." (a scripted sampler: the template trims replies, and a
    random one that starts with a space would not be a prefix of the next prompt anyway)."""
    reply = llama3.tokenizer.encode("Blue.") + [llama3.tokenizer.token_to_id("<|eot_id|>")]

    class Scripted:
        def __init__(self, params):
            self.left = list(reply)

        def __call__(self, logits):
            return self.left.pop(0)

    monkeypatch.setattr("ds4tui.chat.turn.Sampler", Scripted)
    first = make_controller(llama3, tmp_path)
    conv = first.new_conversation()
    conv.template_now = STARTED
    first.send(conv.key, "Hello there, tiny model.", Recorder())
    turn = Recorder()
    first.send(conv.key, "Tell me more.", turn)
    assert turn.reply == "Blue."
    saved = [s for s in turn.of(ev.Saved) if s.reason == "agent-session"][-1]

    second = make_controller(llama3, tmp_path, live_sessions=1)
    resumed = second.resume(saved.sha[:10], Recorder())
    stored = len(resumed.session.tokens)
    other, parked = second.new_conversation(), Recorder()
    second.send(other.key, "Something else.", parked)
    assert [f.conversation for f in parked.of(ev.SessionFreed)] == [resumed.key]

    back = Recorder()
    second.send(resumed.key, "One more thing.", back)
    started = back.of(ev.PrefillStarted)[0]
    assert [h.sha for h in back.of(ev.Hit)] == [saved.sha]  # its own file, by the prompt's text
    assert started.source == "disk" and started.cached == stored
