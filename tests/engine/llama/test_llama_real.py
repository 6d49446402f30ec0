"""The real default model (SmolLM2-135M-Instruct Q4_1 GGUF), installed by `make test`."""

from __future__ import annotations

import gguf
import jinja2
import pytest

from ds4tui.engine.loader import load_model
from ds4tui.engine.errors import ModelNotFoundError
from ds4tui.engine.registry import DEFAULT_MODEL, resolve_registered

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def smol():
    try:
        return load_model(DEFAULT_MODEL)
    except ModelNotFoundError as exc:
        pytest.fail(f"{exc} (`make test` does this before running the tests)")


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_greedy_answer_names_paris(smol, kv_dtype):
    # fp32 arithmetic and the exact template matter: the first-token margin is thin
    # (docs/llama-engine.md, "Numerics"); f16 K/V (rounded once per row) keeps the answer.
    text = smol.chat.render([{"role": "user", "content": "What is the capital of France?"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    s = smol.new_session(256, kv_dtype=kv_dtype)
    s.prefill(smol.tokenizer.encode(text))
    out = []
    for _ in range(12):
        tok = int(s.logits.argmax())
        if tok in smol.tokenizer.eos_ids:
            break
        out.append(tok)
        s.decode(tok)
    answer = smol.tokenizer.decode(out)
    assert "Paris" in answer, answer


def test_chat_template_matches_the_gguf_jinja(smol):
    reader = gguf.GGUFReader(str(resolve_registered(DEFAULT_MODEL)))
    template = jinja2.Environment().from_string(reader.fields["tokenizer.chat_template"].contents())
    chat = [
        {"role": "user", "content": "Hi! Who are you?"},
        {"role": "assistant", "content": "I am SmolLM.\nHow can I help?"},
        {"role": "user", "content": "Name three colours."},
    ]
    for msgs in (chat, [{"role": "system", "content": "Answer in French."}, *chat]):
        for gen in (True, False):
            assert smol.chat.render(msgs, gen) == template.render(messages=msgs, add_generation_prompt=gen)
    text = smol.chat.render(chat, add_generation_prompt=False)
    assert smol.chat.render(smol.chat.parse(text), add_generation_prompt=False) == text


def test_tokenizer_ids(smol):
    tk = smol.tokenizer
    assert tk.encode("<|im_start|>user\nHi<|im_end|>") == [1, 4093, 198, 26843, 2]
    assert tk.encode("<|endoftext|>") == [0]
    assert tk.encode("12345") == [33, 34, 35, 36, 37]  # smollm pre-tokenizer: one digit per token
    assert tk.encode("Hello world") == [19556, 905]  # no BOS is added
    assert 2 in tk.eos_ids and tk.vocab_size == 49152
    assert tk.decode(tk.encode("café 3.14 ✓")) == "café 3.14 ✓"


def test_encode_equals_the_tokenizers_own_encode(smol):
    """encode() takes tokenizers' offset-free batch path: the same ids as Tokenizer.encode."""
    from ds4tui.engine.text.tiny_tokenizer import corpus_text

    text = smol.chat.render([{"role": "user", "content": corpus_text()[:6000] + " café ✓ 12345\n\n\t x"},
                             {"role": "assistant", "content": "ok <|im_end|> not special here?"}])
    assert smol.tokenizer.encode(text) == smol.tokenizer.tok.encode(text, add_special_tokens=False).ids
