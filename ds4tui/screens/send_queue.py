"""Messages sent in one chat while the engine works for another: each waits its turn.

Owns: `SendQueue`, the messages waiting (one per chat, in the order they were sent) with the
bubble each shows meanwhile, and the words that say what one waits for. The engine runs one
job at a time (two prefills on a 2-4 core CPU only take turns slower), so a message sent while
another chat's reply runs is queued, visibly ("queued: after the reply in «Other chat»"), and
sent when that job ends; Escape or ctrl+c in its chat takes it back into the box.
Leaves to the chat screen when to send the next one (`ChatTurns`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ds4tui.screens.widgets.title_fit import short_title


@dataclass
class Waiting:
    text: str
    bubble: object  # the user message shown meanwhile (removed when taken back)


def waits_for(busy_title: str | None, same_chat: bool, job: str) -> str:
    """What a queued message waits for: the reply of a chat (named), or a job of no chat."""
    if same_chat:
        return "after this reply"
    if busy_title is not None:
        return f"after the reply in «{short_title(busy_title)}»"
    return f"after the running job ({job.rstrip('…')})" if job else "after the running job"


class SendQueue:
    """Chat key -> its waiting message, oldest first."""

    def __init__(self) -> None:
        self._waiting: dict[str, Waiting] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._waiting

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, key: str, text: str, bubble: object) -> None:
        assert key not in self._waiting, "one waiting message per chat"
        self._waiting[key] = Waiting(text, bubble)

    def take(self, key: str) -> Waiting | None:
        """Chat `key`'s waiting message, no longer waiting (None if it has none)."""
        return self._waiting.pop(key, None)

    def next(self) -> tuple[str, Waiting] | None:
        """The oldest waiting message, no longer waiting."""
        if not self._waiting:
            return None
        key = next(iter(self._waiting))
        return key, self._waiting.pop(key)

    def clear(self) -> list[tuple[str, Waiting]]:
        """Every waiting message, none left."""
        items = list(self._waiting.items())
        self._waiting.clear()
        return items
