"""A GGUF's vocabulary -> a `tokenizers.Tokenizer` that splits text as llama.cpp does.

Owns the two vocabulary kinds of `tokenizer.ggml.model`:
- "gpt2": byte-level BPE from the vocab and merges, with the pre-tokenizer regex named
  by `tokenizer.ggml.pre` (PRE_TOKENIZERS: default/gpt2, smollm, llama3/llama-bpe,
  qwen2, deepseek-v3/joyai-llm; the regexes are llama.cpp's for those names; DeepSeek V3's
  and V4's are three applied in turn: digit runs, CJK and kana runs, then the rest).
- "llama": SentencePiece-style BPE over scored pieces (Llama 2, Gemma): spaces become
  "▁", the pair whose merged piece has the highest score merges first, and characters
  outside the vocab fall back to their <0xXX> byte pieces. `tokenizers` applies merges
  by rank, so the merges are every split (a, b) of a piece ranked by the piece's score.
Control tokens are registered as special (a chat template's `<start_of_turn>` is one
id); user-defined ones (Gemma's runs of spaces, tabs and newlines) are matched in the
text before anything else, as llama.cpp partitions on them first.
"""

from __future__ import annotations

from typing import Sequence

from ds4tui.engine.errors import WeightsError

# llama_token_type values of `tokenizer.ggml.token_type`.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# Split regexes by `tokenizer.ggml.pre` name (None: GPT-2's, which ByteLevel applies itself;
# a tuple: several splits in turn, each over the pieces the one before left).
PRE_TOKENIZERS: dict[str, str | tuple[str, ...] | None] = {
    "default": None,
    "gpt2": None,
    "smollm": None,  # GPT-2's, after every digit is split off on its own
    "llama3": _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "deepseek-v3": (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
}
PRE_ALIASES = {"llama-bpe": "llama3", "llama-v3": "llama3", "deepseek-r1-qwen": "qwen2", "joyai-llm": "deepseek-v3",
               "hunyuan-dense": "deepseek-v3", "": "default"}
# Pre-tokenizers whose BPE takes a word found whole in the vocab without merging (llama.cpp: ignore_merges).
_IGNORE_MERGES = {"llama3"}
VOCAB_KINDS = ("gpt2", "llama")


def build_gguf_tokenizer(model: str, tokens: Sequence[str], token_types: Sequence[int], *, merges: Sequence[str] = (),
                         scores: Sequence[float] = (), pre: str | None = None, add_space_prefix: bool = False,
                         source: str = "GGUF"):
    """The tokenizer for a GGUF's `tokenizer.ggml.*` fields; WeightsError naming what is
    unsupported (another vocabulary kind or pre-tokenizer)."""
    if model == "gpt2":
        tok = _byte_level_bpe(tokens, merges, pre, source)
    elif model == "llama":
        tok = _sentencepiece_bpe(tokens, token_types, scores, add_space_prefix, source)
    else:
        raise WeightsError(f"{source}: tokenizer model {model!r} is not supported ({', '.join(VOCAB_KINDS)})")
    _add_special(tok, tokens, token_types)
    return tok


def _vocab(tokens: Sequence[str], source: str) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicate piece keeps its first id, as llama.cpp's text->token map
    if not vocab:
        raise WeightsError(f"{source}: empty vocabulary")
    return vocab


def _bpe(source: str, vocab: dict[str, int], merges: list[tuple[str, str]], **options):
    """tokenizers' BPE model; a merge whose pieces or result the vocabulary lacks is refused in
    one line (tokenizers raises a bare Exception for it)."""
    from tokenizers import models

    try:
        return models.BPE(vocab, merges, **options)
    except Exception as exc:  # noqa: BLE001 - tokenizers' own error type is Exception
        raise WeightsError(f"{source}: the vocabulary and its merges do not form a BPE model ({exc})") from None


def _byte_level_bpe(tokens: Sequence[str], merges: Sequence[str], pre: str | None, source: str):
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers

    name = PRE_ALIASES.get(pre or "", pre or "default")
    if name not in PRE_TOKENIZERS:
        raise WeightsError(f"{source}: pre-tokenizer {pre!r} is not supported ({', '.join(sorted(set(PRE_TOKENIZERS) | set(PRE_ALIASES) - {''}))})")
    pairs = []
    for m in merges:
        parts = m.split(" ")
        if len(parts) != 2:
            raise WeightsError(f"{source}: bad merge {m!r}")
        pairs.append((parts[0], parts[1]))
    tok = Tokenizer(_bpe(source, _vocab(tokens, source), pairs, fuse_unk=False, byte_fallback=False,
                         ignore_merges=name in _IGNORE_MERGES))
    regex = PRE_TOKENIZERS[name]
    if regex is None:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        tok.pre_tokenizer = byte_level if name != "smollm" else pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        splits = [regex] if isinstance(regex, str) else list(regex)
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            *(pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in splits),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    return tok


def spm_merges(tokens: Sequence[str], token_types: Sequence[int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Every split (a, b) of a normal or user-defined piece into two pieces of the vocab,
    ordered by the merged piece's score (highest first), then its id."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for i, piece in enumerate(tokens):
        kind = token_types[i] if i < len(token_types) else TOKEN_NORMAL
        if kind not in (TOKEN_NORMAL, TOKEN_USER_DEFINED) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            a, b = piece[:cut], piece[cut:]
            if a in vocab and b in vocab:
                ranked.append((-float(scores[i]), i, cut, a, b))
    ranked.sort()
    return [(a, b) for _, _, _, a, b in ranked]


def _sentencepiece_bpe(tokens: Sequence[str], token_types: Sequence[int], scores: Sequence[float],
                       add_space_prefix: bool, source: str):
    from tokenizers import Tokenizer, decoders, normalizers

    if len(scores) != len(tokens):
        raise WeightsError(f"{source}: a SentencePiece vocabulary needs one score per token")
    unk = next((tokens[i] for i, k in enumerate(token_types) if k == TOKEN_UNKNOWN), None)
    tok = Tokenizer(_bpe(source, _vocab(tokens, source), spm_merges(tokens, token_types, scores), unk_token=unk,
                         fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Replace(" ", "▁")]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend("▁"))
    tok.normalizer = normalizers.Sequence(steps)
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(dec)
    return tok


def _add_special(tok, tokens: Sequence[str], token_types: Sequence[int]) -> None:
    from tokenizers import AddedToken

    added = []
    for i, kind in enumerate(token_types):
        if kind == TOKEN_CONTROL:
            added.append(AddedToken(tokens[i], special=True, normalized=False))
        elif kind == TOKEN_USER_DEFINED:
            added.append(AddedToken(tokens[i], special=False, normalized=False))
    if added:
        tok.add_tokens(added)
