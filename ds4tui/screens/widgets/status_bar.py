"""The one-line status bar: model, context used/total, last speed, last cache event.

Owns: composing that line from plain values, and what each chat last showed there: a
chat's activity (prefilling, generating, queued), its last reply's speed and its last
cache event are kept per chat (`ChatLine`) and shown only while that chat is on screen
(`show_chat`), so a new chat never shows "generating…" of another. Work of no chat (loading
the model, resuming, switching models, saving at quit) shows whichever chat is on screen.
Everything shown is a `Text` (never markup), since the cache event may quote a file's title.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ds4tui.format.display import safe_lines
from ds4tui.screens.widgets import fmt


METER_CELLS = 8


def context_meter(used: int, total: int, cells: int = METER_CELLS) -> str:
    """Context use as a bar of `cells` cells, e.g. ▰▰▰▱▱▱▱▱ (rounded up: any use shows)."""
    if total <= 0:
        return ""
    full = min(cells, -(-used * cells // total)) if used > 0 else 0
    return "▰" * full + "▱" * (cells - full)


@dataclass
class ChatLine:
    """What one chat shows in the status bar."""

    activity: str = ""
    speed: str = ""
    cache: str = ""


NO_CHAT = ""  # the key of work that belongs to no chat (yet)


class StatusBar(Static):
    """`model · ctx used/total · speed · cache` (speed and cache only once known)."""

    DEFAULT_CSS = """
    StatusBar {
        height: 1;
        padding: 0 1;
    }
    """

    model_name: reactive[str] = reactive("loading model…")
    """Display name of the loaded model."""
    ctx_used: reactive[int] = reactive(0)
    """Tokens in the active conversation's session."""
    ctx_total: reactive[int] = reactive(0)
    """Context size of a session (0 before the model is loaded)."""
    speed: reactive[str] = reactive("")
    """The last turn's decode speed, already formatted."""
    cache: reactive[str] = reactive("")
    """The last cache event, one line."""
    activity: reactive[str] = reactive("")
    """What the engine is doing now (prefilling, generating, saving), or empty."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._chats: dict[str, ChatLine] = {}
        self._shown: str | None = None  # the chat on screen
        self._work = ""  # what runs for no chat

    # -- per chat --------------------------------------------------------------------------------

    def chat_line(self, key: str) -> ChatLine:
        return self._chats.setdefault(key, ChatLine())

    def show_chat(self, key: str | None) -> None:
        """`key` is on screen now: its own activity, speed and cache line."""
        self._shown = key
        self._refresh_shown()

    def set_activity(self, key: str | None, text: str) -> None:
        """What chat `key` is doing (None: work of no chat, shown whichever chat is on screen)."""
        if key is None:
            self._work = text
        else:
            self.chat_line(key).activity = text
        self._refresh_shown()

    def activity_of(self, key: str | None) -> str:
        return self._work if key is None else self.chat_line(key).activity

    def set_speed(self, key: str, text: str) -> None:
        self.chat_line(key).speed = text
        self._refresh_shown()

    def set_cache(self, key: str, text: str) -> None:
        """Chat `key`'s last cache event; NO_CHAT: an event before its chat exists (a resume's
        disk hit), shown at once and handed to the chat by `adopt`."""
        self.chat_line(key).cache = text
        if key == NO_CHAT:
            self.cache = text
        else:
            self._refresh_shown()

    def adopt(self, key: str) -> None:
        """The no-chat cache line belongs to `key` (the chat a resume opened)."""
        line = self._chats.pop(NO_CHAT, None)
        if line is not None and line.cache:
            self.chat_line(key).cache = line.cache
        self._refresh_shown()

    def forget(self, key: str | None = None) -> None:
        """Drop chat `key`'s line (a deleted chat), or every chat's (None: a new model)."""
        if key is None:
            self._chats.clear()
        else:
            self._chats.pop(key, None)
        self._refresh_shown()

    def _refresh_shown(self) -> None:
        line = self._chats.get(self._shown) if self._shown is not None else None
        line = line or ChatLine()
        self.activity = line.activity or self._work
        self.speed = line.speed
        self.cache = line.cache

    def line(self, width: int | None = None) -> str:
        """The status line; when it is longer than `width`, the context meter gives its
        cells to what the engine is doing (the numbers stay)."""
        def compose(meter: bool) -> str:
            parts = [self.model_name]
            if self.ctx_total:
                bar = f"{context_meter(self.ctx_used, self.ctx_total)} " if meter else ""
                parts.append(f"ctx {bar}{fmt.tokens(self.ctx_used)}/{fmt.tokens(self.ctx_total)}")
            if self.activity:
                parts.append(self.activity)
            if self.speed:
                parts.append(self.speed)
            if self.cache:
                parts.append(self.cache)
            return " · ".join(safe_lines(p) for p in parts)

        full = compose(meter=True)
        if width is not None and Text(full).cell_len > width:
            return compose(meter=False)
        return full

    def render(self) -> Text:
        return Text(self.line(self.content_size.width or None), no_wrap=True, overflow="ellipsis")
