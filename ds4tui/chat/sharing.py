"""Where prompts share a prefix: the stable point of a first prompt, and the live session to fork.

Owns three small rules the turn pipeline (turn.py) applies:
- `anchor_tokens`: where a first prompt's cold checkpoint goes, as ds4 picks it
  (ds4_kvstore.c, `ds4_kvstore_chat_anchor_pos`): the end of the stable chat prefix, just
  before the turn of the message that asks this particular task (the last user message before
  the first assistant one: clients put stable user-role scaffolding first). Agents sharing a
  system prompt then all find that prefix on disk, whatever they ask after it;
- `best_share`: which idle live session shares the most leading tokens with a prompt's own
  tokenization (other chats' sessions: a chat's own is the turn's live path), and where to fork
  it: the whole prompt when the session kept a mark there (its logits are the prompt's, bit
  for bit), else all but the last token, which the turn prefills for the logits;
- `stable_point`: where the point two prompts first diverge may be checkpointed for others:
  just before a boundary token (a special token the tokenizer splits at first, so the text on
  either side encodes on its own) in the last `trim` tokens, else `trim` tokens back (ds4's
  trim of an unstable tail: a third prompt's tokenizer may merge text across the point).

A fork of a session shares its rows, computed in that session's prefill chunks; what that
changes in the answer is stated (and tested on the real model) in docs/chat.md, "Shared
prefixes".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from ds4tui.chat.conversation import Conversation

# Two contents for the task message that differ in their first character: where their renders
# part is where that message's text starts.
_PROBES = ("A", "B")


def task_message(messages: Sequence[dict]) -> int | None:
    """Index of the message that asks this task: the last user message before the first
    assistant message; None without one."""
    found = None
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            break
        if role == "user":
            found = i
    return found


def anchor_tokens(render, tok, messages: Sequence[dict], prompt: str, tokens: Sequence[int]) -> int:
    """Tokens of `prompt` (rendered from `messages` by `render(messages)`, encoded as `tokens`)
    before the turn of its task message: the start of the last boundary token before that
    message's text. 0 when there is none (no user message, a tokenizer without boundary tokens,
    a template that renders the probes apart from the prompt)."""
    boundary = getattr(tok, "boundary_ids", None)
    i = task_message(messages)
    if not boundary or i is None:
        return 0
    renders = []
    for probe in _PROBES:
        probed = [dict(m) for m in messages]
        probed[i]["content"] = probe
        try:
            renders.append(render(probed))
        except Exception:  # noqa: BLE001 - a template that refuses the probe: no anchor, ds4's fallback applies
            return 0
    a, b = renders
    start = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if prompt[:start] != a[:start]:
        return 0
    limit = len(prompt[:start].encode("utf-8"))
    pos, anchor = 0, 0
    for j, t in enumerate(tokens):
        if pos >= limit:
            break
        if t in boundary:
            anchor = j
        pos += len(tok.token_bytes(t))
    return anchor


@dataclass(frozen=True)
class Share:
    """A live session to fork for a prompt: `donor`'s first `tokens` tokens."""

    donor: Conversation
    tokens: int
    whole: bool  # the whole prompt, at a mark: the fork keeps its logits, nothing is prefilled


def common_tokens(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def best_share(donors: Iterable[Conversation], prompt_tokens: Sequence[int]) -> Share | None:
    """The donor whose live session shares the most leading tokens with `prompt_tokens`, and
    where to fork it; None when none shares any."""
    n = len(prompt_tokens)
    best: Share | None = None
    for conv in donors:
        session = conv.session
        if session is None or not session.tokens:
            continue
        k = common_tokens(session.tokens, prompt_tokens)
        whole = k == n and n in session.marks()
        if not whole:
            k = min(k, n - 1)  # the last token is prefilled: the logits come from the prompt's own chunk
        if k <= 0:
            continue
        # On a tie the whole prompt, then the most recently used: the cap's least recently
        # used session still goes first (a donor stays in memory for this turn).
        rank = (k, whole, conv.last_active)
        if best is None or rank > (best.tokens, best.whole, best.donor.last_active):
            best = Share(conv, k, whole)
    return best


def stable_point(tok, tokens: Sequence[int], at: int, trim: int) -> int:
    """The last point at or before `at` that is safe to store for other prompts: the start of a
    boundary token among the last `trim` tokens before `at`, else `at - trim`."""
    boundary = getattr(tok, "boundary_ids", None) or ()
    for j in range(at - 1, max(-1, at - 1 - trim), -1):
        if tokens[j] in boundary:
            return j
    return max(0, at - trim)
