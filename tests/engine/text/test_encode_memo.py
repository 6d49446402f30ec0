"""HFTokenizer.encode remembers its last text: the same ids, as a list of the caller's own."""

from __future__ import annotations

from ds4tui.engine.text.hf_tokenizer import HFTokenizer
from ds4tui.engine.text.tiny_tokenizer import train_tiny_tokenizer


def test_the_last_text_is_encoded_once_and_each_caller_gets_its_own_list():
    tok = HFTokenizer(train_tiny_tokenizer(["<|im_start|>", "<|im_end|>"]), [])
    calls = []
    fast = tok._encode_fast

    def counted(batch, **kw):
        calls.append(batch[0])
        return fast(batch, **kw)

    tok._encode_fast = counted
    first = tok.encode("In one sentence, what was that text about?")
    first.append(-1)  # a caller's list is its own: the next answer must not see this
    again = tok.encode("In one sentence, what was that text about?")
    assert again == first[:-1] and again is not first
    assert len(calls) == 1
    other = tok.encode("Something else.")
    assert tok.encode("In one sentence, what was that text about?") == again and other != again
    assert len(calls) == 3  # only the last text is remembered
