"""Chat templates round-trip, for every template the app ships or knows: the real templates of
SmolLM2, Gemma 3, Qwen 2.5, Llama 3.1 and Llama 3.2, the built-in turn formats and DeepSeek V4.

templates/*.jinja are the models' published `chat_template` texts (facts, kept verbatim):
SmolLM2-135M-Instruct's as its GGUF stores it, google/gemma-3-*-it, Qwen/Qwen2.5-*-Instruct,
meta-llama/Llama-3.1-8B-Instruct and meta-llama/Llama-3.2-1B-Instruct (its date from
strftime_now).

The chat caches a conversation as its rendered text and parses stored text back into messages
(a resumed chat). Two properties keep the next turn on the cache:
- a turn's prompt plus its reply is a prefix of the next turn's prompt;
- parsing a transcript and rendering the messages again gives the same text.
transformers renders the same templates as the reference for our sandboxed rendering.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from ds4tui.engine.text.chat_templates import TURN_FORMATS, TurnFormatTemplate, JinjaChatTemplate, chat_template_for
from ds4tui.engine.text.dsv4_chat import Dsv4ChatTemplate
from ds4tui.engine.text.hf_tokenizer import ChatMLTemplate

TEMPLATES = Path(__file__).parent / "templates"
BOS = {"llama3_1": "<|begin_of_text|>", "llama3_2": "<|begin_of_text|>", "gemma3": "<bos>", "qwen2_5": "",
       "smollm2": ""}
DAY = datetime(2025, 3, 1, 9, 30)  # the chat's own time: not today, so a leaked clock shows


def jinja(name: str) -> JinjaChatTemplate:
    chat, line = chat_template_for((TEMPLATES / f"{name}.jinja").read_text(), lambda t: False, "llama", BOS[name])
    assert isinstance(chat, JinjaChatTemplate) and "model's own template" in line
    return chat


def builtin(name: str):
    return {"chatml": ChatMLTemplate(None), "chatml+default": ChatMLTemplate("You are a tiny test model."),
            "gemma": TurnFormatTemplate(TURN_FORMATS["gemma"], "<bos>"),
            "llama3": TurnFormatTemplate(TURN_FORMATS["llama3"], "<|begin_of_text|>"), "dsv4": Dsv4ChatTemplate()}[name]


ALL = [*BOS, "chatml", "chatml+default", "gemma", "llama3", "dsv4"]


def template(name: str):
    return jinja(name) if name in BOS else builtin(name)


SYSTEM = {"role": "system", "content": "Be brief."}
TURNS = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
         {"role": "user", "content": "Another one?"}]
CHATS = {"no system": TURNS, "system": [SYSTEM, *TURNS]}


def read_back(name: str, messages: list[dict]) -> list[dict]:
    """The messages a transcript of `messages` parses back to: the same ones, but for what a
    family's layout cannot tell apart (documented in docs/chat.md)."""
    has_system = messages[0]["role"] == "system"
    if name in ("gemma3", "gemma") and has_system:  # the system text heads the first user turn
        first = {"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}
        return [first, *messages[2:]]
    defaults = {"smollm2": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                "qwen2_5": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                "chatml+default": "You are a tiny test model."}
    if name in defaults and not has_system:  # a ChatML default system prompt reads as a system message
        return [{"role": "system", "content": defaults[name]}, *messages]
    return messages


@pytest.mark.parametrize("name", list(BOS))
def test_sandboxed_rendering_equals_transformers(name, monkeypatch):
    """Our sandbox renders each real template exactly as transformers does (its strftime_now
    set to the same day as our `now`)."""
    import transformers.utils.chat_template_utils as ctu

    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return DAY

    monkeypatch.setattr(ctu, "datetime", Clock)
    chat = jinja(name)
    for messages in CHATS.values():
        for end in range(1, len(messages) + 1):
            if messages[end - 1]["role"] == "system":
                continue
            for generation in (True, False):
                expected, _ = ctu.render_jinja_template([messages[:end]], chat_template=chat.source,
                                                        add_generation_prompt=generation, bos_token=BOS[name],
                                                        eos_token="")
                assert chat.render(messages[:end], generation, now=DAY) == expected[0]


@pytest.mark.parametrize("chat_name", list(CHATS))
@pytest.mark.parametrize("name", ALL)
def test_each_prompt_and_reply_is_a_prefix_of_the_next_prompt(name, chat_name):
    chat, messages = template(name), CHATS[chat_name]
    for end, m in enumerate(messages):
        if m["role"] != "user" or end + 2 >= len(messages):
            continue
        reply, following = messages[end + 1], messages[end + 2]
        held = chat.render(messages[: end + 1], True, now=DAY) + reply["content"]
        assert chat.render(messages[: end + 3], True, now=DAY).startswith(held), (reply, following)


@pytest.mark.parametrize("chat_name", list(CHATS))
@pytest.mark.parametrize("name", ALL)
def test_a_parsed_transcript_renders_the_same_text_again(name, chat_name):
    """Stored text as a session holds it: after a reply (no turn end yet), after a closed turn,
    and a prompt checkpoint (ending in the generation prompt)."""
    chat, messages = template(name), CHATS[chat_name]
    for end, m in enumerate(messages):
        if m["role"] != "user":
            continue
        upto = messages[: end + 1]
        texts = [chat.render(upto, True, now=DAY)]
        if end + 1 < len(messages):
            texts += [texts[0] + messages[end + 1]["content"], chat.render(messages[: end + 2], False, now=DAY)]
        for text in texts:
            parsed = chat.parse(text)
            when = chat.written_on(text) or datetime.now()  # no date read back: the clock must not matter
            assert any(chat.render(parsed, g, now=when).startswith(text) for g in (True, False)), text
            whole = messages[: end + 2] if text is not texts[0] else upto
            assert parsed == read_back(name, whole)


@pytest.mark.parametrize("name", ["llama3_1", "llama3_2"])
def test_the_turn_format_alone_reads_llama_s_own_header_as_a_system_message(name):
    """The defect the probes undo: Llama 3's template writes a system turn ("Cutting Knowledge
    Date: ...") into every chat; read as the chat's system message it is written twice."""
    chat = jinja(name)
    for messages in CHATS.values():
        text = chat.render(messages[:2], False, now=DAY)
        plain = chat.format.parse(text)
        assert plain[0]["role"] == "system" and plain[0]["content"].startswith("Cutting Knowledge Date: December 2023")
        assert not chat.render(plain, False, now=DAY).startswith(text)
        assert chat.parse(text) == messages[:2]


def test_a_chat_keeps_the_date_it_started_with():
    """Llama 3.2 dates its header with strftime_now: a chat renders its own day on every turn,
    and the day is read back from stored text, so a chat resumed later renders the same prompt."""
    chat = jinja("llama3_2")
    text = chat.render(TURNS[:1], True, now=DAY) + "Hello!"
    assert "Today Date: 01 Mar 2025\n" in text
    assert chat.render(TURNS[:1], True, now=datetime(2025, 3, 2)) != chat.render(TURNS[:1], True, now=DAY)
    assert chat.written_on(text).date() == DAY.date()
    again = chat.render(chat.parse(text) + [TURNS[2]], True, now=chat.written_on(text))
    assert again.startswith(text)
    assert jinja("llama3_1").written_on(jinja("llama3_1").render(TURNS[:1], now=DAY)) is None  # a fixed date


def test_a_template_failing_on_the_probes_parses_as_its_turn_format():
    """A template that refuses a lone user message (here: it demands a system one) gets no probe
    results and reads back with its family's turn format."""
    source = ("{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
              "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat, _ = chat_template_for(source, lambda t: False, "llama")
    messages = [SYSTEM, *TURNS[:2]]
    text = chat.render(messages, False)
    assert chat.parse(text) == messages
