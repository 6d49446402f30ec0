"""Stateless requests (the whole message list every time) on a chat controller's sessions.

An OpenAI-style client resends its conversation with each request. Each
request is mapped onto the live session whose text is the longest prefix of
the request's rendered prompt, so only the new part is prefilled; with none,
a new conversation starts and the turn pipeline forks the live session that
shares the most of its tokens (another client's with the same system prompt, the
same prompt sent again), restores the longest prefix from disk, or starts cold. The turn itself is the chat's own (turn.py), the
live-session cap and its evict saves the chat's own (pool.py).

A conversation whose session has left memory is forgotten here: its state is
on disk (the pool saved it on eviction) and a later request finds it there by
its text, like any other prefix.

Not thread-safe: one engine thread calls `complete` at a time (serve/worker.py).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Callable, Sequence

from ds4tui.chat.conversation import Conversation
from ds4tui.chat.events import ChatEvent, Done, PrefillStarted
from ds4tui.chat.turn import TurnOptions, render_prompt

if TYPE_CHECKING:
    from ds4tui.chat.controller import ChatController

EventFn = Callable[[ChatEvent], None]


@dataclass(frozen=True)
class Completion:
    """One answered request."""

    text: str  # the reply (stop strings cut off)
    done: Done
    prompt_tokens: int  # the whole prompt: reused plus prefilled
    cached_tokens: int  # reused from a live session or restored from disk
    source: str  # where the reused part came from: live, fork (another conversation's live session), disk or cold (nothing reused)


class StatelessChats:
    def __init__(self, controller: ChatController) -> None:
        self.controller = controller

    def context_size(self) -> int:
        return self.controller.ctx_size()

    def prompt_tokens(self, messages: list[dict], tools: Sequence[dict] = (), prompt: str | None = None) -> int:
        """Tokens of the prompt `complete` would run for `messages` (rendered and encoded as it
        does; `prompt`: that text as it is); ValueError when the chat template refuses them.
        Safe off the engine thread: it reads the template and the tokenizer only."""
        if prompt is None:
            prompt = render_prompt(self.controller.model.chat, messages, datetime.now(), tools)
        return len(self.controller.model.tokenizer.encode(prompt))

    def complete(self, messages: list[dict], on_event: EventFn,
                 options: TurnOptions | None = None) -> Completion | None:
        """Answer `messages` (ending in a user turn, usually). None when cancelled during the
        prefill. EngineError (context full, a torn file...) is raised to the caller."""
        # A request has no chat of its own to take a date from: a template's date is the
        # request's day, and the turn renders the same prompt the routing compared.
        now = datetime.now()
        if options is not None and options.prompt is not None:
            prompt = options.prompt  # a plain-text completion: no template
        else:
            prompt = render_prompt(self.controller.model.chat, messages, now, options.tools if options else ())
        conv = self._route(prompt)
        conv.messages = [dict(m) for m in messages]
        conv.template_now = now
        conv.busy = True
        conv.touch()
        started: list[PrefillStarted] = []

        def events(event: ChatEvent) -> None:
            if isinstance(event, PrefillStarted):
                started.append(event)
            on_event(event)

        try:
            done = self.controller.turns.run(conv, events, options)
        except BaseException:
            # The session may be half-way through a forward: never reuse it.
            conv.session, conv.session_text, conv.stored_upto = None, b"", 0
            raise
        finally:
            conv.busy = False
        self.controller.pool.prepare_next()  # the next new conversation's memory, in the background
        if done is None:
            return None
        first = started[0] if started else PrefillStarted(total=done.prompt_tokens, cached=0, source="cold")
        reply = conv.messages[-1]["content"] if conv.messages and conv.messages[-1]["role"] == "assistant" else ""
        return Completion(text=reply, done=done, prompt_tokens=first.cached + first.total,
                          cached_tokens=first.cached, source=first.source)

    def _route(self, prompt: str) -> Conversation:
        """The idle live conversation whose session text is the longest prefix of `prompt`,
        else a new one (the pool makes room for its session when the turn starts)."""
        registry = self.controller.conversations
        for conv in registry.all():
            if conv.session is None and not conv.busy:
                registry.remove(conv.key)  # parked on disk already; found again by its text
        best, best_len = None, -1
        for conv in registry.live():
            if conv.busy or not conv.session_text:
                continue
            have = _whole_characters(conv.session_text)
            if len(have) > best_len and prompt.startswith(have):
                best, best_len = conv, len(have)
        if best is not None:
            return best
        conv = Conversation(key=registry.new_key(), title="api")
        return registry.add(conv)


def _whole_characters(text: bytes) -> str:
    """`text` decoded up to its last whole character: a reply cut inside a character (the token
    limit) comes back from the client without it, and the turn rewinds the session to the
    token boundary before it (prefix_search.py, _rewind_live)."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(text)
