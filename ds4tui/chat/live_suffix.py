"""The tokens a live session still needs for a prompt, without encoding the whole transcript.

Owns: `suffix_after_live`, the fast form of the turn's live-session check (prefix_search.py,
`PrefixSearch.prepare`). That check encodes the whole prompt and keeps the session when its tokens start
the result: the suffix is then what a cold prefill would run after them (bit-identical
answers); otherwise only the text after the session's is encoded. In a 4K-token chat the
whole-prompt encode is ~4 ms of every message's first-token time, growing with the chat.

Why it can be skipped: a `tokenizers` tokenizer splits text at its added special tokens
before anything else, so the text on either side of one encodes on its own (for tokens with
no strip or whole-word flags: the tokenizer's `boundary_ids`). Encode the prompt from the
last such token the session holds, drop as many tokens as the session has from there on,
and compare the rest with the new text's own encode. Equal, that is the full check's answer
either way: when the session's tokens start the whole-prompt encode, its suffix is exactly
this rest (the window encodes as the whole prompt does after the boundary); when they do not,
the full check encodes the new text alone, which is equal. Not equal (the session ends inside
a word, or its tokens from the boundary on are not what the window encodes to), or no
boundary token: None, and the caller runs the full check.
"""

from __future__ import annotations

from typing import Sequence

MAX_WINDOW_TOKENS = 4096  # how far back to look for a boundary token (a chat has one per message)


def suffix_after_live(tok, tokens: Sequence[int], session_text: bytes, prompt_bytes: bytes) -> list[int] | None:
    """The prompt's tokens after the live session's `tokens` (whose exact text is
    `session_text`), or None when the caller must decide with the whole-prompt encode."""
    boundary = getattr(tok, "boundary_ids", None)
    if not boundary or not tokens or not prompt_bytes.startswith(session_text):
        return None
    held_bytes = 0
    for k in range(len(tokens) - 1, max(-1, len(tokens) - 1 - MAX_WINDOW_TOKENS), -1):
        held_bytes += len(tok.token_bytes(tokens[k]))
        if tokens[k] in boundary:
            break
    else:
        return None
    start = len(session_text) - held_bytes
    try:  # a boundary token is whole characters; the session's text may end inside one
        window = prompt_bytes[start:].decode("utf-8")
        new_text = prompt_bytes[len(session_text):].decode("utf-8")
    except UnicodeDecodeError:
        return None
    suffix = list(tok.encode(window)[len(tokens) - k :])
    return suffix if suffix == list(tok.encode(new_text)) else None
