"""Turning sampled tokens into display text: whole characters only, stop strings cut off.

Owns: the incremental UTF-8 decode of token bytes (a byte-level BPE token may
hold half of a character; showing it would print U+FFFD and then the other
half), stop-string detection across token boundaries, and holding back text
that might still become a stop string. Leaves to callers: sampling, EOS ids
and the session itself. Also `EventBatcher`, which thins the event stream
down to what a screen can redraw.
"""

from __future__ import annotations

import codecs
import time
from typing import Callable, Sequence

from ds4tui.chat.events import ReasoningText, TokenText


class ReplyStream:
    """Feed each sampled token's bytes; get back only text that is safe to show.

    `feed` returns the newly displayable text (possibly ""); once a stop string
    is seen, `stopped` is True and `text` ends right before it. `finish` flushes
    whatever was held back; the bytes of a character the reply stopped inside (the token
    limit cut it) become one U+FFFD, or with `drop_partial` are dropped (the server: an
    API reply never ends in U+FFFD). Bytes that can never be part of a character (invalid
    UTF-8) show as U+FFFD where they are either way.
    """

    def __init__(self, stop_strings: Sequence[str] = (), drop_partial: bool = False) -> None:
        self._drop_partial = drop_partial
        self._stops = tuple(s for s in stop_strings if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._emitted = 0  # characters of _text already returned
        self._searched = 0  # characters of _text already searched for stop strings
        self.stopped = False

    @property
    def text(self) -> str:
        """The reply so far (including held-back characters, excluding any stop string)."""
        return self._text

    def feed(self, data: bytes) -> str:
        if self.stopped:
            return ""
        self._text += self._decoder.decode(data)
        return self._release(final=False)

    def finish(self) -> str:
        """End of generation: decode any dangling bytes (or drop them) and release everything."""
        if self._drop_partial:
            self._decoder.reset()  # its buffer holds only the start of a character that never ended
        elif not self.stopped:
            self._text += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self._stops and not self.stopped:
            # A stop string found now must end in the new text, so it starts at
            # most len(stop) - 1 characters before the part already searched.
            start = max(0, self._searched - self._longest + 1)
            cut = -1
            for stop in self._stops:
                at = self._text.find(stop, start)
                if at != -1 and (cut == -1 or at < cut):
                    cut = at
            self._searched = len(self._text)
            if cut != -1:
                self._text = self._text[:cut]
                self.stopped = True
                final = True
        end = len(self._text)
        if not final:
            end -= self._held_back()
        end = max(end, self._emitted)
        out = self._text[self._emitted : end]
        self._emitted = end
        return out

    def _held_back(self) -> int:
        """Characters at the end of the text that begin some stop string (may complete it later)."""
        for k in range(min(self._longest - 1, len(self._text)), 0, -1):
            tail = self._text[-k:]
            if any(stop.startswith(tail) for stop in self._stops):
                return k
        return 0


class EventBatcher:
    """Coalesces streamed reply text before it crosses to the UI thread.

    Token text (the answer's and the reasoning's, each joined on its own) can arrive
    hundreds of times a second and a Markdown redraw
    costs more than that; text is joined and released at most once per
    `interval`. 0.1 s: ten updates a second. Each update redraws the reply's
    last Markdown block whole (a growing list is one block), on the UI thread
    that shares two cores and the GIL with the decode: at 0.05 s a list reply
    streamed at ~150-190 tok/s in the app, at 0.1 s ~245 (docs/perf-archive.md,
    "Streaming in the app"). The first text goes out at once.
    Every other event (progress comes once per prefill chunk, so it needs no
    thinning) first flushes the pending text, so the UI sees the same order.
    """

    def __init__(self, emit: Callable[[object], None], interval: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._emit = emit
        self._interval = interval
        self._clock = clock
        self._text: list[str] = []
        self._kind: type = TokenText  # the kind of the text being joined
        self._last = float("-inf")

    def __call__(self, event: object) -> None:
        if isinstance(event, (TokenText, ReasoningText)):
            if self._text and type(event) is not self._kind:
                self.flush()  # reasoning, then the answer: each run joined on its own, in order
            self._kind = type(event)
            self._text.append(event.text)
            if self._clock() - self._last >= self._interval:
                self.flush()
        else:
            self.flush()
            self._emit(event)

    def flush(self) -> None:
        if self._text:
            text, self._text = "".join(self._text), []
            self._emit(self._kind(text))
            self._last = self._clock()
