"""A small byte-level BPE tokenizer trained in-process on text shipped in the repo.

The tiny models (tiny-dsv4, tiny-llama) use it so tests, benchmarks and the UI
run the real tokenizer path with no download. Training is deterministic for a
given corpus, vocab size and special-token list.
"""

from __future__ import annotations

from importlib import resources
from typing import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS_FILE = "tiny_corpus.txt"


def corpus_text() -> str:
    return resources.files("ds4tui.engine.text").joinpath("data", CORPUS_FILE).read_text(encoding="utf-8")


def train_tiny_tokenizer(special_tokens: Sequence[str], vocab_size: int = 512) -> Tokenizer:
    """Byte-level BPE over the repo corpus; special tokens get the lowest ids, in the given order."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = corpus_text().splitlines()
    tok.train_from_iterator(lines, trainer=trainer)
    return tok
