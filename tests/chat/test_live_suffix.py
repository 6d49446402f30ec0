"""The live-session check without the whole-prompt encode gives the full check's answer.

`suffix_after_live` (chat/live_suffix.py) encodes a prompt only from the last special token
the session holds. Checked here against the check it stands in for (turn.py: encode the
whole prompt, keep its suffix when the session's tokens start it, else encode the new text),
on the tiny model's tokenizer and on the real SmolLM2 (byte-level BPE) and Gemma 3
(SentencePiece) tokenizers, with sessions holding a cold encode of their text and sessions
holding other tokens for the same text (what a sampled reply leaves).
"""

from __future__ import annotations

import random

import pytest

from ds4tui.chat import next_turn
from ds4tui.chat.live_suffix import suffix_after_live
from ds4tui.engine.errors import ModelNotFoundError
from ds4tui.engine.loader import load_model

TEXTS = ["Hello!", " leading space", "two\n\nparagraphs", "Paris is the capital of France.",
         "naïve café — 東京 🙂", "```python\nprint(1)\n```", "  ", "a<|im_start|>b", "1. one\n2. two\n",
         "\ttab", "end with newline\n", "x" * 40]


def full_check(tok, tokens, session_text: bytes, prompt: str):
    """turn.py's answer: the whole-prompt encode's suffix, else the new text's encode."""
    full = tok.encode(prompt)
    if full[: len(tokens)] == list(tokens):
        return full[len(tokens):]
    have = session_text.decode("utf-8", errors="replace")
    return tok.encode(prompt[len(have):]) if prompt.startswith(have) else None


def other_tokens(tok, text: str) -> list[int]:
    """Tokens for `text` that a cold encode would not give: each character on its own."""
    return [t for ch in text for t in tok.encode(ch)]


def chats(model, rng: random.Random, n: int):
    """(session tokens, their text, the next prompt, whether the next turn is open) for random
    chats: half of them holding
    non-canonical tokens for their replies, a quarter cut inside the reply, a third with the
    next turn opened."""
    tok, chat = model.tokenizer, model.chat
    for i in range(n):
        messages = []
        for _ in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
            messages.append({"role": "assistant", "content": rng.choice(TEXTS)})
        reply = messages[-1]["content"]
        asked = chat.render(messages[:-1], add_generation_prompt=True)
        if i % 4 == 3:  # the session ends inside its reply (a word, a character's bytes)
            reply = reply[: rng.randrange(len(reply) + 1)]
        tokens = tok.encode(asked) + (other_tokens(tok, reply) if i % 2 else tok.encode(reply))
        text = asked + reply
        nxt = [*messages, {"role": "user", "content": rng.choice(TEXTS)}]
        prompt = chat.render(nxt, add_generation_prompt=True)
        if i % 3 == 0 and i % 4 != 3:  # the next turn opened after the reply (chat/next_turn.py)
            opening = next_turn.opening(chat, messages)
            extra = opening[len(text):]
            if prompt.startswith(opening) and opening.startswith(text) and extra:
                tokens += tok.encode(extra)
                text += extra
                yield tokens, text.encode(), prompt, True
                continue
        yield tokens, text.encode(), prompt, False


def check_model(model, n: int = 80) -> tuple[int, int]:
    """Every fast answer equals the full check's, and every session with the next turn open
    (the chat's usual state between turns) gets one unless its message starts with white
    space. Returns (fast answers, prompts)."""
    tok = model.tokenizer
    fast = 0
    for tokens, text, prompt, opened in chats(model, random.Random(7), n):
        quick = suffix_after_live(tok, tokens, text, prompt.encode())
        full = full_check(tok, tokens, text, prompt)
        if quick is not None:
            fast += 1
            assert quick == full, (prompt, text)
        elif opened and not prompt[len(text.decode()):][:1].isspace():
            # (a message starting with white space may join the opening's last newline)
            assert full is None, (prompt, text)
    return fast, n


def test_tiny_tokenizer_takes_the_fast_path_with_the_same_answers(tiny_llama):
    assert tiny_llama.tokenizer.boundary_ids  # <|im_start|>, <|im_end|>, ...
    fast, prompts = check_model(tiny_llama)
    assert fast >= prompts // 4


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
def test_real_tokenizers_take_the_fast_path_with_the_same_answers(name):
    try:
        model = load_model(name)
    except ModelNotFoundError as exc:
        pytest.fail(f"{exc} (`make test` does this before running the tests)")
    fast, prompts = check_model(model)
    assert fast >= prompts // 4


def test_no_boundary_token_or_a_foreign_prefix_leaves_it_to_the_full_check(tiny_llama):
    tok = tiny_llama.tokenizer
    tokens = tok.encode("plain text, no special token")
    text = b"plain text, no special token"
    assert suffix_after_live(tok, tokens, text, text + b" more") is None  # nothing to start a window at
    chat = tiny_llama.chat.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    tokens = tok.encode(chat)
    assert suffix_after_live(tok, tokens, chat.encode(), b"another prompt") is None  # not a continuation
    cut = "é".encode()[:1]  # the session's text ends inside a character
    assert suffix_after_live(tok, tokens + tok.encode("x"), chat.encode() + b"x" + cut, chat.encode() + b"x" + "é".encode()) is None


def test_a_window_that_encodes_differently_is_refused(tiny_llama):
    """The session's tokens from the boundary on must start the window's encode: tokens for
    the same text that a cold encode would not give are left to the full check."""
    tok = tiny_llama.tokenizer
    asked = tiny_llama.chat.render([{"role": "user", "content": "Paris is the capital"}], add_generation_prompt=True)
    tokens = tok.encode(asked)
    prompt = asked + "of France"
    start = asked.rindex("<|im_start|>")
    odd = tok.encode(asked[:start]) + tok.encode("<|im_start|>") + other_tokens(tok, asked[start + len("<|im_start|>"):])
    assert odd != tokens and tok.decode(odd) == tok.decode(tokens)
    assert suffix_after_live(tok, odd, asked.encode(), prompt.encode()) is None
    assert suffix_after_live(tok, tokens, asked.encode(), prompt.encode()) == full_check(tok, tokens, asked.encode(), prompt)
