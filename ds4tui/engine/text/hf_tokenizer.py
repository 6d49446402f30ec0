"""Tokenizer and ChatML template wrappers over a `tokenizers.Tokenizer` (the engine protocols).

Owns: `HFTokenizer` (the `Tokenizer` protocol for any byte-level BPE or other
`tokenizers.Tokenizer`, generic over the special ids a family declares) and
`ChatMLTemplate` (the `ChatTemplate` protocol for `<|im_start|>role\\n...<|im_end|>\\n`
prompts, including the default system prompt that SmolLM2's template adds).
Where the weights come from, and which ids stop generation, is the loader's call.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from tokenizers import Tokenizer as _HfTok

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-unicode stand-in for each byte, inverted (char -> byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class HFTokenizer:
    """The `Tokenizer` protocol over a `tokenizers.Tokenizer`.

    No special tokens are added by `encode` (chat templates write them as text,
    e.g. `<|im_start|>`, and the tokenizer maps registered special tokens to
    their ids). `byte_level` says whether vocab strings use GPT-2's byte-to-char
    map, which `token_bytes` must undo to give the exact bytes of a token.
    """

    def __init__(self, tok: _HfTok, eos_ids: Iterable[int], byte_level: bool = True, spm: bool = False) -> None:
        """spm: pieces are SentencePiece's ("▁" for a space, "<0xXX>" for a raw byte)."""
        self.tok = tok
        self.spm = spm
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.byte_level = byte_level
        added = tok.get_added_tokens_decoder()
        self._special = {tid: t.content for tid, t in added.items() if t.special}
        # Special tokens the text is split at before anything else, with nothing reaching
        # across them (no strip or whole-word flags): text on either side encodes on its own.
        self.boundary_ids = frozenset(tid for tid, t in added.items()
                                      if t.special and not (t.lstrip or t.rstrip or t.single_word))
        self._bytes_cache: dict[int, bytes] = {}
        self._decoder_map = _byte_decoder() if byte_level and not spm else None
        self._encode_fast = getattr(tok, "encode_batch_fast", None)  # tokenizers >= 0.21
        # The last text encoded and its ids: a message's text after the cached prefix is
        # encoded by the context-fit check and again by the turn that follows it at once.
        self._last: tuple[str, tuple[int, ...]] = ("", ())

    def encode(self, text: str) -> list[int]:
        last_text, last_ids = self._last  # one tuple: read whole even with other threads encoding
        if text == last_text:
            return list(last_ids)
        # encode_batch_fast skips the character offsets encode() computes and nothing here
        # reads: a 4K-token prompt in 3.7 ms instead of 5.2 (docs/perf-archive.md, "Disk hit with a hot and a cold page cache").
        if self._encode_fast is not None:
            ids = self._encode_fast([text], add_special_tokens=False)[0].ids
        else:
            ids = self.tok.encode(text, add_special_tokens=False).ids
        self._last = (text, tuple(ids))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} outside vocab of {self.vocab_size}")
        piece = self.tok.id_to_token(token_id)
        if piece is None:
            out = b""
        elif token_id in self._special:
            out = piece.encode("utf-8")
        elif self.spm:
            m = _BYTE_PIECE.fullmatch(piece)
            out = bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode("utf-8")
        elif self._decoder_map is None:
            out = piece.encode("utf-8")
        else:
            dm = self._decoder_map
            # A piece outside the byte alphabet (an added non-special token) is its own UTF-8.
            out = bytes(dm[c] for c in piece) if all(c in dm for c in piece) else piece.encode("utf-8")
        self._bytes_cache[token_id] = out
        return out


# `{{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}` inside a ChatML jinja template:
# the default system prompt is the literal between the system header and <|im_end|>.
_DEFAULT_SYSTEM_RE = re.compile(r"<\|im_start\|>system\\?n?\n?(.*?)<\|im_end\|>", re.S)


def default_system_from_template(template: str | None) -> str | None:
    """The literal default system prompt of a ChatML jinja template, or None if it has none."""
    if not template:
        return None
    m = _DEFAULT_SYSTEM_RE.search(template)
    if m is None:
        return None
    text = m.group(1)
    if re.search(r"['\"]\s*\+|\{\{|\{%", text):
        return None  # the system text is an expression (e.g. messages[0]), not a literal default
    # The template is jinja source: undo the string-literal escapes it uses.
    return text.replace("\\n", "\n").replace("\\'", "'").replace('\\"', '"')


class ChatMLTemplate:
    """`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`.

    Same output as SmolLM2's jinja template: when the first message is not a
    system message, the default system prompt is inserted before it (and an
    empty conversation gets none, exactly as the template's `loop.first` does).
    """

    stop_strings: tuple[str, ...] = (IM_END, ENDOFTEXT)

    def __init__(self, default_system_prompt: str | None) -> None:
        self.default_system_prompt = default_system_prompt

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True, *, now=None) -> str:
        """now: unused (this layout writes no date); the ChatTemplate protocol passes it."""
        parts: list[str] = []
        for i, msg in enumerate(messages):
            if i == 0 and msg["role"] != "system" and self.default_system_prompt is not None:
                parts.append(f"{IM_START}system\n{self.default_system_prompt}{IM_END}\n")
            parts.append(f"{IM_START}{msg['role']}\n{msg['content']}{IM_END}\n")
        if add_generation_prompt:
            parts.append(f"{IM_START}assistant\n")
        return "".join(parts)

    def written_on(self, text: str) -> None:
        return None

    def parse(self, text: str) -> list[dict]:
        """Messages of a rendered transcript; a trailing open turn (no <|im_end|>) is returned too,
        except an empty trailing generation prompt. The default system prompt, if present, is
        returned as a system message (rendering it again gives the same text)."""
        out: list[dict] = []
        pos = 0
        while pos < len(text):
            if not text.startswith(IM_START, pos):
                raise ValueError(f"not a ChatML transcript at offset {pos}")
            head_end = text.find("\n", pos)
            if head_end < 0:
                raise ValueError(f"unterminated role line at offset {pos}")
            role = text[pos + len(IM_START) : head_end]
            end = text.find(IM_END, head_end + 1)
            if end < 0:
                content = text[head_end + 1 :]
                if content:
                    out.append({"role": role, "content": content})
                break
            out.append({"role": role, "content": text[head_end + 1 : end]})
            pos = end + len(IM_END)
            if text.startswith("\n", pos):
                pos += 1
        return out
