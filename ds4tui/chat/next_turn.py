"""The next user turn's opening, forwarded while the user is still reading and typing.

Owns: what every next prompt of a chat starts with once its reply is in (`opening`: the
transcript, the end of the reply and the start of a user turn; ChatML's is
"...reply<|im_end|>\n<|im_start|>user\n"), putting the few tokens past the session's text
into the live session after a turn (`open_next_turn`), and the other side of that: a
stored text that ends with an opened turn reads back without an empty user message
(`without_open_turn`).

Why: the next turn then prefills only the message and the assistant header. A follow-up
to a long chat, from memory or from its file on disk, has ~5 fewer tokens to run before
its first token (18 instead of 23 for a short question to SmolLM2), and a checkpoint
saved after the turn (the titled file, the shutdown save) holds them too. The cost is
those tokens' forward after the reply, when nobody waits on it.

Done only when the opening starts with the session's exact text (a template that renders
an earlier reply differently from how it was generated, or a reply cut by a stop string,
gets nothing) and when the context has room; any other prompt (a regenerate, an edit)
rewinds past the extra tokens as it would past the reply.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime

from ds4tui.chat.conversation import Conversation

MAX_OPENING_TOKENS = 32  # a turn opening is a few template tokens; more means a template this does not fit


def opening(chat, messages: Sequence[dict], now: datetime | None = None) -> str:
    """The text every prompt for a next user message starts with: the longest common prefix
    of the prompts for two messages that differ in their first character."""
    first = chat.render([*messages, {"role": "user", "content": "a"}], add_generation_prompt=True, now=now)
    second = chat.render([*messages, {"role": "user", "content": "b"}], add_generation_prompt=True, now=now)
    return os.path.commonprefix([first, second])


def open_next_turn(conv: Conversation, chat, tokenizer, text_of: Callable[[Sequence[int]], bytes],
                   should_stop: Callable[[], bool] | None = None) -> int:
    """Prefill the opening's tokens past conv's session text into its live session; the tokens
    added (0 where it does not apply). conv.session_text stays the exact text of the tokens."""
    session = conv.session
    if session is None or not session.tokens or not conv.messages or conv.messages[-1].get("role") != "assistant":
        return 0
    have = conv.session_text.decode("utf-8", errors="replace")
    ahead = opening(chat, conv.messages, conv.template_now)
    if len(ahead) <= len(have) or not ahead.startswith(have):
        return 0
    extra = ahead[len(have):]
    tokens = tokenizer.encode(extra)
    if not tokens or len(tokens) > MAX_OPENING_TOKENS or text_of(tokens) != extra.encode("utf-8"):
        return 0
    if len(session.tokens) + len(tokens) >= session.ctx_size:
        return 0  # no room left for a message anyway: keep what the context holds
    before = len(session.tokens)
    session.prefill(tokens, should_stop=should_stop)
    conv.session_text += text_of(session.tokens[before:])  # all of them, or those done before a stop
    return len(session.tokens) - before


def without_open_turn(messages: list[dict]) -> list[dict]:
    """Messages read back from a stored text: an empty user message at the end is the opened
    next turn (open_next_turn), not something the user sent."""
    if len(messages) > 1 and messages[-1].get("role") == "user" and not messages[-1].get("content"):
        return messages[:-1]
    return messages
