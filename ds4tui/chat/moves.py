"""Conversation moves the KV cache makes cheap: regenerate, edit and resend, fork, and the
context-fit check with its choices.

Owns the message bookkeeping of each move (alternatives of a regenerated reply, the fork
that keeps an edited chat's old continuation, a branch's copied state) and the check that
a next message fits the context. The rewinds themselves happen where every turn finds its
prefix (turn.py: the live session rewinds to the last token the new prompt shares with
it), so a move costs what really changed: regenerate prefills nothing on the llama
family, an edit prefills the edited message and what follows, a fork copies state and
prefills nothing.
"""

from __future__ import annotations

import copy
import time
from typing import Callable

from ds4tui.chat import branches
from ds4tui.chat.checkpoints import Checkpoints
from ds4tui.chat.conversation import Conversation
from ds4tui.chat.events import ChatEvent, Done, FitCheck, Forked
from ds4tui.chat.next_turn import opening
from ds4tui.chat.pool import SessionPool
from ds4tui.chat.registry import Conversations
from ds4tui.chat.saved import SavedSessions
from ds4tui.chat.settings import Settings
from ds4tui.chat.prefix_search import shared_tokens
from ds4tui.chat.turn import TurnPipeline
from ds4tui.engine.model import Model

EventFn = Callable[[ChatEvent], None]

# Tokens a message must leave for its reply: this, max_tokens or an eighth of the context,
# whichever is smallest (a reply that then runs out stops with a visible "context full").
REPLY_RESERVE = 256


class Moves:
    def __init__(self, model: Model, settings: Settings, pool: SessionPool, checkpoints: Checkpoints | None,
                 conversations: Conversations, saved: SavedSessions, turns: TurnPipeline) -> None:
        self.model = model
        self.settings = settings
        self.pool = pool
        self.checkpoints = checkpoints
        self.conversations = conversations
        self.saved = saved
        self.turns = turns

    # -- regenerate ------------------------------------------------------------------------------

    def begin_regenerate(self, conv: Conversation) -> tuple[int, dict]:
        """Take the last reply off (kept among its versions); the turn then answers again."""
        return branches.begin_regenerate(conv)

    def end_regenerate(self, conv: Conversation, index: int, old: dict, done: Done | None) -> None:
        branches.end_regenerate(conv, index, old, done)

    def show_alternative(self, conv: Conversation, index: int, step: int) -> str:
        return branches.show_alternative(conv, index, step)

    # -- edit and fork -------------------------------------------------------------------------------

    def fork_title(self, title: str) -> str:
        """"title (fork)", or "title (fork N)" when an open or saved chat has that title."""
        taken = {c.title for c in self.conversations.all()} | {s.title for s in self.saved.listing()}
        return branches.fork_title(title, taken)

    def keep_continuation(self, conv: Conversation, index: int, on_event: EventFn) -> Conversation | None:
        """Before an edit of message `index`: the chat as it is becomes a fork (its titled file,
        which holds this state, moves to the fork's title). None when nothing follows."""
        if not 0 <= index < len(conv.messages) or conv.messages[index].get("role") != "user":
            raise ValueError(f"message {index} is not a user message")
        fork = Conversation(key=self.conversations.new_key(), title=self.fork_title(conv.display_title),
                            created_at=conv.created_at, messages=copy.deepcopy(conv.messages),
                            overrides=dict(conv.overrides), alternatives=copy.deepcopy(conv.alternatives),
                            forked_from=(conv.display_title, index), template_now=conv.template_now)
        if conv.saved_sha and self.checkpoints is not None:
            new_sha = self.checkpoints.retitle(conv.saved_sha, fork.display_title, conv.created_at, on_event)
            if new_sha is not None:
                # The fork is parked on that file: its context is the file's tokens (the meter
                # read 0 for a fork holding 203), and the chat no longer has a titled file.
                fork.saved_sha, conv.saved_sha = new_sha, None
                fork.saved_upto = fork.parked_tokens = conv.saved_upto
                conv.saved_upto = 0
        return self.conversations.add(fork)

    def fork(self, conv: Conversation, upto: int, on_event: EventFn) -> Conversation:
        if not 0 < upto <= len(conv.messages):
            raise ValueError(f"cannot fork at {upto} of {len(conv.messages)} messages")
        t0 = time.perf_counter()
        fork = Conversation(key=self.conversations.new_key(), title=self.fork_title(conv.display_title),
                            messages=copy.deepcopy(conv.messages[:upto]), overrides=dict(conv.overrides),
                            alternatives={i: list(v) for i, v in conv.alternatives.items() if i < upto},
                            forked_from=(conv.display_title, upto), template_now=conv.template_now)
        self.conversations.add(fork)
        prefix = self.model.chat.render(fork.messages, add_generation_prompt=False, now=fork.template_now)
        if fork.messages[-1].get("role") == "assistant":  # the parent may hold the next turn's opening
            ahead = opening(self.model.chat, fork.messages, fork.template_now)
            prefix = ahead if ahead.startswith(prefix) else prefix
        source, tokens, replayed = "none", 0, 0
        parent = conv.session
        if parent is not None and parent.tokens:
            k, nb = self._shared(parent.tokens, conv.session_text, prefix)
            if k:
                replayed = parent.rewind_cost(k).replay
                self.pool.adopt(fork, parent.fork(k), on_event)
                fork.session_text = conv.session_text[:nb]
                source, tokens = "memory", k
        elif conv.saved_sha and self.checkpoints is not None:
            saved = self.checkpoints.describe(conv.saved_sha)
            session = self.pool.ensure(fork, on_event)
            text = self.checkpoints.load_saved(saved, session, on_event)
            k, nb = self._shared(session.tokens, text, prefix)
            if k:
                replayed = session.rewind(k).replay
                fork.session_text = text[:nb]
                source, tokens = "disk", k
            else:
                self.pool.free(fork, "evict", on_event)
        if fork.live:
            fork.stored_upto = len(fork.session.tokens)
            self.saved.save(fork, on_event)
        on_event(Forked(conversation=fork.key, parent=conv.key, at_message=upto, tokens=tokens, source=source,
                        replayed=replayed, ms=(time.perf_counter() - t0) * 1000.0))
        return fork

    def _shared(self, tokens: list[int], text: bytes, prefix: str) -> tuple[int, int]:
        k, nbytes, _ = shared_tokens(self.model.tokenizer, tokens, text, prefix)
        return k, nbytes

    # -- the context ---------------------------------------------------------------------------------

    def _count(self, messages: list[dict], generation: bool = True, conv: Conversation | None = None) -> int:
        """Tokens of the rendered messages. With `conv`: the tokens the turn will hold (_held),
        so a message into a long chat encodes only the new text, not the whole transcript again."""
        prompt = self.model.chat.render(messages, add_generation_prompt=generation,
                                        now=conv.template_now if conv is not None else None)
        held = self._held(conv, prompt) if conv is not None else None
        return held if held is not None else len(self.model.tokenizer.encode(prompt))

    def _held(self, conv: Conversation, prompt: str) -> int | None:
        """What the turn will hold for `prompt` when it starts from state it has (prefix_search.py,
        PrefixSearch.prepare): the live session's tokens when its text starts the prompt, or, with no live
        session, those of the cached file it restores first; plus the rest, encoded. None: the
        turn prefills the whole prompt (or rewinds the live session), so count all of it."""
        session = conv.session
        if session is not None and session.tokens:
            have = conv.session_text.decode("utf-8", errors="replace")
            if not prompt.startswith(have):
                return None
            base, rest = len(session.tokens), prompt[len(have):]
        else:
            found = None
            if self.checkpoints is not None:
                found = self.checkpoints.first_prefix(prompt, conv.saved_sha, self.pool.ctx_size())
            if found is None:
                return None
            base, rest = found
        return base + len(self.model.tokenizer.encode(rest))

    def check_fit(self, conv: Conversation, text: str, upto: int | None = None) -> FitCheck:
        msgs = list(conv.messages[:upto] if upto is not None else conv.messages)
        ctx = self.pool.ctx_size()
        reserve = min(self.settings.max_tokens(conv), REPLY_RESERVE, max(1, ctx // 8))
        user = {"role": "user", "content": text}
        n = self._count(msgs + [user], conv=conv)
        if n + reserve <= ctx:
            return FitCheck(True, n, reserve, ctx)
        system = [m for m in msgs[:1] if m.get("role") == "system"]
        rest = msgs[len(system):]
        starts = [i for i, m in enumerate(rest) if m.get("role") == "user"]
        system_tokens = self._count(system, generation=False) if system else 0
        drop_turns = drop_prefill = None
        for d in range(1, len(starts) + 1):
            kept = rest[starts[d]:] if d < len(starts) else []
            nd = self._count(system + kept + [user])
            if nd + reserve <= ctx:
                drop_turns, drop_prefill = d, nd - system_tokens
                break
        return FitCheck(False, n, reserve, ctx, drop_turns, drop_prefill, self._count(system + [user]))

    def drop_oldest(self, conv: Conversation, turns: int) -> None:
        branches.drop_oldest(conv, turns)
