"""A byte-level BPE vocabulary of DeepSeek V4's size for true-shape slices (no download).

Owns `slice_vocab(size, seed)`: tokens, token types and ranked merges of a valid BPE whose
first ids are the V4 chat tokens ds4 looks up by name (BOS 0, EOS 1, as the real
vocabulary), then the tiny tokenizer's (trained on the repo corpus, so English text
splits into real subwords), then seeded synthetic merges (a lowercase word piece + a short
letter piece) until the vocabulary has `size` tokens. Every merge's two pieces and its
result are tokens, so ds4's BPE (merge ranks over "a b" strings) and ds4tui's
(`tokenizers`) split text the same way; sampled ids decode to letter garbage, which is what
a slice with random weights should say.
"""

from __future__ import annotations

import numpy as np

from ds4tui.engine.text.dsv4_chat import SPECIAL_TOKENS
from ds4tui.engine.text.tiny_tokenizer import train_tiny_tokenizer

V4_VOCAB = 129280
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
_SPACE = "Ġ"  # the byte-level alphabet's space
_LETTERS = set("abcdefghijklmnopqrstuvwxyz")


def _is_word(piece: str) -> bool:
    body = piece[1:] if piece.startswith(_SPACE) else piece
    return bool(body) and set(body) <= _LETTERS


def slice_vocab(size: int = V4_VOCAB, seed: int = 0) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges "a b" in rank order) of a `size`-token byte-level BPE."""
    import json

    base = train_tiny_tokenizer(SPECIAL_TOKENS, 1024)
    vocab = base.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    if size < len(tokens):
        raise ValueError(f"a slice vocabulary needs at least {len(tokens)} tokens, not {size}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(base.to_str())["model"]["merges"]]
    known = set(tokens)
    heads = [t for t in tokens if _is_word(t)]  # grows: new words can be extended again
    tails = [t for t in tokens if _is_word(t) and not t.startswith(_SPACE) and len(t) <= 3]
    rng = np.random.default_rng(seed)
    while len(tokens) < size:
        picks_a = rng.integers(0, 1 << 30, size=4096)
        picks_b = rng.integers(0, len(tails), size=4096)
        for ia, ib in zip(picks_a.tolist(), picks_b.tolist()):
            a, b = heads[ia % len(heads)], tails[ib]
            new = a + b
            if new in known or len(new.lstrip(_SPACE)) > 10:
                continue
            known.add(new)
            tokens.append(new)
            merges.append(f"{a} {b}")
            heads.append(new)
            if len(tokens) == size:
                break
    special = set(SPECIAL_TOKENS)
    types = [TOKEN_CONTROL if t in special else TOKEN_NORMAL for t in tokens]
    return tokens, types, merges
