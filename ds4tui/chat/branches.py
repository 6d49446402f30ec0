"""The message bookkeeping of the conversation moves, with no engine in it: the versions of a
regenerated reply, which one shows, a fork's title and copy, a new system prompt, the oldest
exchanges dropped, and whether a next message fits a context (by any token count).

Shared by both chat backends. The embedded controller's moves (moves.py) add on top what
its KV cache makes cheap (rewinds, a fork's copied state); the remote controller
(remote.py) needs only this, since its server re-reads the history it is sent.
"""

from __future__ import annotations

import copy
from typing import Callable, Iterable

from ds4tui.chat.conversation import MAX_TITLE_CHARS, Conversation
from ds4tui.chat.events import Done, FitCheck


def begin_regenerate(conv: Conversation) -> tuple[int, dict]:
    """Take the last reply off (kept among its versions); the turn then answers again."""
    if not conv.messages or conv.messages[-1].get("role") != "assistant":
        raise ValueError("the chat does not end with a reply: nothing to regenerate")
    index = len(conv.messages) - 1
    old = conv.messages.pop()
    versions = conv.alternatives.setdefault(index, [old["content"]])
    if old["content"] not in versions:
        versions.append(old["content"])
    return index, old


def end_regenerate(conv: Conversation, index: int, old: dict, done: Done | None) -> None:
    """After the new reply: it joins the versions; with none (cancelled or failed before a
    token) the old reply is back."""
    if done is None:
        if not conv.messages or conv.messages[-1].get("role") != "user":
            return
        conv.messages.append(old)
        return
    conv.alternatives[index].append(conv.messages[index]["content"])


def show_alternative(conv: Conversation, index: int, step: int) -> str:
    """Show the previous (-1) or next (+1) version of the last reply; returns its text."""
    if index != len(conv.messages) - 1 or conv.messages[index].get("role") != "assistant":
        raise ValueError("only the last reply can switch versions")
    versions = conv.alternatives.get(index)
    if not versions:
        raise ValueError("this reply has no other versions")
    shown, count = conv.alternative_index(index)
    pick = min(max(shown + step, 0), count - 1)
    conv.messages[index] = {"role": "assistant", "content": versions[pick]}
    return versions[pick]


def delete_alternative(conv: Conversation, index: int) -> tuple[str, str]:
    """Delete the shown version of the last reply (there must be another): the one before it
    is shown (the next, for the first). Returns (the deleted text, the text now shown)."""
    if index != len(conv.messages) - 1 or conv.messages[index].get("role") != "assistant":
        raise ValueError("only the last reply's versions can be deleted")
    versions = conv.alternatives.get(index) or []
    if len(versions) < 2:
        raise ValueError("this reply has no other version: it is the chat's only answer here")
    shown, _count = conv.alternative_index(index)
    deleted = versions.pop(shown)
    keep = versions[max(shown - 1, 0)]
    conv.messages[index] = {"role": "assistant", "content": keep}
    if len(versions) == 1:
        del conv.alternatives[index]  # one version left: it is simply the reply
    return deleted, keep


def fork_title(title: str, taken: Iterable[str | None]) -> str:
    """"title (fork)", or "title (fork N)" when a chat in `taken` has that title."""
    names = set(taken)
    base = title[: MAX_TITLE_CHARS - 12]
    name, n = f"{base} (fork)", 2
    while name in names:
        name, n = f"{base} (fork {n})", n + 1
    return name


def branch(conv: Conversation, key: str, title: str, upto: int, kind: type[Conversation] = Conversation,
           *, keep_created: bool = False) -> Conversation:
    """A new chat of `kind` holding conv.messages[:upto] and their reply versions, its settings
    and its template date; `keep_created`: it keeps conv's start time (the old continuation of
    an edited chat is the same chat, not a new one)."""
    fork = kind(key=key, title=title, messages=copy.deepcopy(conv.messages[:upto]),
                overrides=dict(conv.overrides),
                alternatives={i: list(v) for i, v in conv.alternatives.items() if i < upto},
                forked_from=(conv.display_title, upto), template_now=conv.template_now)
    if keep_created:
        fork.created_at = conv.created_at
    return fork


def drop_oldest(conv: Conversation, turns: int) -> None:
    """Drop the oldest `turns` user/assistant exchanges, keeping the system prompt."""
    system = 1 if conv.messages and conv.messages[0].get("role") == "system" else 0
    starts = [i for i, m in enumerate(conv.messages) if i >= system and m.get("role") == "user"]
    if not 0 < turns <= len(starts):
        raise ValueError(f"cannot drop {turns} of {len(starts)} exchanges")
    cut = starts[turns] if turns < len(starts) else len(conv.messages)
    dropped = cut - system
    conv.messages = conv.messages[:system] + conv.messages[cut:]
    conv.alternatives = {i - dropped: v for i, v in conv.alternatives.items() if i >= cut}


def set_system_prompt(conv: Conversation, prompt: str | None) -> None:
    """Make `prompt` the chat's first message (None or empty: no system prompt), keeping the
    reply versions on the messages they belong to."""
    has = conv.system_prompt is not None
    if prompt:
        if has:
            conv.messages[0] = {"role": "system", "content": prompt}
        else:
            conv.messages.insert(0, {"role": "system", "content": prompt})
            conv.alternatives = {i + 1: v for i, v in conv.alternatives.items()}
    elif has:
        del conv.messages[0]
        conv.alternatives = {i - 1: v for i, v in conv.alternatives.items()}


def fit_check(messages: list[dict], text: str, count: Callable[[list[dict]], int], ctx: int,
              reserve: int) -> FitCheck:
    """Whether `text` after `messages` fits `ctx` with `reserve` left for the reply, by
    `count` (the tokens of a message list); when not, how many of the oldest exchanges to
    drop (system prompt kept) and what is then sent again, and the size of a fresh chat."""
    user = {"role": "user", "content": text}
    n = count(messages + [user])
    if n + reserve <= ctx:
        return FitCheck(True, n, reserve, ctx)
    system = [m for m in messages[:1] if m.get("role") == "system"]
    rest = messages[len(system):]
    starts = [i for i, m in enumerate(rest) if m.get("role") == "user"]
    system_tokens = count(system) if system else 0
    drop_turns = drop_prefill = None
    for d in range(1, len(starts) + 1):
        kept = rest[starts[d]:] if d < len(starts) else []
        nd = count(system + kept + [user])
        if nd + reserve <= ctx:
            drop_turns, drop_prefill = d, nd - system_tokens
            break
    return FitCheck(False, n, reserve, ctx, drop_turns, drop_prefill, count(system + [user]))
