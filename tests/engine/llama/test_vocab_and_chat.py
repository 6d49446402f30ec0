"""GGUF vocabularies and chat templates: SentencePiece-style BPE against the sentencepiece
library itself, the byte-level pre-tokenizers by name, and templates in a jinja sandbox."""

from __future__ import annotations

import io
from pathlib import Path

import jinja2
import pytest

from ds4tui.engine.errors import WeightsError
from ds4tui.engine.text.chat_templates import TURN_FORMATS, TurnFormatTemplate, JinjaChatTemplate, chat_template_for
from ds4tui.engine.text.gguf_vocab import build_gguf_tokenizer
from ds4tui.engine.text.hf_tokenizer import HFTokenizer

CORPUS = (Path(__file__).resolve().parents[3] / "ds4tui" / "engine" / "text" / "data" / "tiny_corpus.txt").read_text()


def test_sentencepiece_bpe_equals_the_sentencepiece_library():
    """A BPE model trained by sentencepiece (byte fallback, a dummy prefix as in Llama 2);
    its pieces, scores and types as a GGUF stores them; the same ids for every line."""
    spm = pytest.importorskip("sentencepiece")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS.splitlines()), model_writer=buf, vocab_size=400,
                                   model_type="bpe", byte_fallback=True, add_dummy_prefix=True,
                                   remove_extra_whitespaces=False, normalization_rule_name="identity", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    n = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(n)]
    tok = build_gguf_tokenizer("llama", [sp.id_to_piece(i) for i in range(n)], types,
                               scores=[sp.get_score(i) for i in range(n)], add_space_prefix=True)
    wrapped = HFTokenizer(tok, [], spm=True)
    lines = CORPUS.splitlines()[:300] + ["naïve café – 東京 🚀", "  two  spaces", "x**2 + 1234567"]
    for line in lines:
        ids = sp.encode(line)
        assert wrapped.encode(line) == ids, line
        assert wrapped.decode(ids) == sp.decode(ids)
    text = "café 東京"  # outside the vocab: byte pieces, whose bytes rebuild the UTF-8
    assert b"".join(wrapped.token_bytes(i) for i in wrapped.encode(text)) == b" " + text.encode()


def _byte_vocab() -> list[str]:
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet())


@pytest.mark.parametrize("pre, text, pieces", [
    ("llama-bpe", "I'd pay 12345 now", ["I", "'d", "Ġpay", "Ġ", "123", "45", "Ġnow"]),
    ("qwen2", "I'd pay 123 now", ["I", "'d", "Ġpay", "Ġ", "1", "2", "3", "Ġnow"]),
    ("smollm", "pay 123", ["pay", "Ġ", "1", "2", "3"]),
    ("default", "pay 123", ["pay", "Ġ123"]),
])
def test_byte_level_pre_tokenizers_by_name(pre, text, pieces):
    tok = build_gguf_tokenizer("gpt2", _byte_vocab(), [1] * 256, pre=pre)
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)] == pieces


def test_unknown_vocabularies_and_pre_tokenizers_are_named():
    with pytest.raises(WeightsError, match="pre-tokenizer 'chameleon' is not supported.*llama3"):
        build_gguf_tokenizer("gpt2", _byte_vocab(), [1] * 256, pre="chameleon")
    with pytest.raises(WeightsError, match="tokenizer model 'rwkv' is not supported \\(gpt2, llama\\)"):
        build_gguf_tokenizer("rwkv", ["a"], [1])


# A Gemma-style turn template written for this test (system text heads the first user turn).
GEMMA_STYLE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set head = messages[0]['content'] + '\\n\\n' %}"
    "{% set rest = messages[1:] %}{% else %}{% set head = '' %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}"
    "{{ (head if loop.first else '') + m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}]


def test_a_file_template_renders_in_the_sandbox_and_parses_back_by_its_family():
    chat, line = chat_template_for(GEMMA_STYLE, lambda t: False, "gemma3", "<bos>", "<eos>")
    assert isinstance(chat, JinjaChatTemplate) and line == "gemma (the model's own template)"
    builtin = TurnFormatTemplate(TURN_FORMATS["gemma"], "<bos>")
    for gen in (True, False):
        assert chat.render(CHAT, gen) == builtin.render(CHAT, gen)
    text = chat.render(CHAT, add_generation_prompt=False)
    assert chat.render(chat.parse(text), add_generation_prompt=False) == text
    assert chat.stop_strings[0] == "<end_of_turn>"


def test_llama3_turns_without_a_template():
    chat, line = chat_template_for(None, lambda t: t == "<|start_header_id|>", "llama", "<|begin_of_text|>")
    assert "built in" in line
    text = chat.render(CHAT[1:2])
    assert text == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" \
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert chat.parse(text) == CHAT[1:2]


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% set _ = messages.append(1) %}<|im_start|>",
])
def test_templates_cannot_reach_python(template):
    chat, _ = chat_template_for(template + "<|im_end|>", lambda t: False, "llama")
    with pytest.raises(jinja2.exceptions.SecurityError):
        chat.render(CHAT)


def test_no_template_and_no_known_format_is_an_error():
    with pytest.raises(WeightsError, match="no chat template and no known turn format"):
        chat_template_for(None, lambda t: False, "llama")


def test_stored_gemma_and_llama3_transcripts_read_back_without_a_model():
    """The cache browser names and shows files with no model loaded (engine/text/transcripts.py)."""
    from ds4tui.engine.text.transcripts import first_user_message, parse_transcript

    gemma = TurnFormatTemplate(TURN_FORMATS["gemma"], "<bos>").render(CHAT[1:3], add_generation_prompt=False)
    llama3 = TurnFormatTemplate(TURN_FORMATS["llama3"], "<|begin_of_text|>").render(CHAT[1:3], add_generation_prompt=False)
    for text in (gemma, llama3):
        assert parse_transcript(text) == CHAT[1:3]
        assert first_user_message(text) == "Hi"
