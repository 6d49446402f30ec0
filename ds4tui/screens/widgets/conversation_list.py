"""The sidebar: open chats (live in memory or parked on disk) and the stored chats to reopen.

Owns: the list items, their markers and the `ChatChosen` message, and telling rows
with the same title apart (`twin_tags`: when each was last used, then a number).
Titles come from files, so they are shown as `Text` after `format.display.one_line`,
never as markup.
Leaves to the screen: opening, resuming and switching.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Label, ListItem, ListView

from ds4tui.format.display import one_line, relative_time
from ds4tui.screens.widgets.title_fit import split_tag

LIVE, PARKED, SAVED, BUSY = "●", "○", "↺", "▶"
TEXT_ONLY = "◌"  # a stored chat whose KV was evicted: its text is kept, the next message re-prefills
BROKEN = "⚠"  # a saved session that cannot be resumed (the reason shows when chosen)
AGE_REFRESH_S = 5.0  # how often the rows' ages are worked out again (they count in minutes)


@dataclass(frozen=True)
class ChatEntry:
    """One row: an open chat (`key`), a stored chat (`chat_id`) or a saved session (`sha`)."""

    title: str
    key: str | None = None
    sha: str | None = None
    chat_id: str | None = None
    text_only: bool = False  # a stored chat whose .kv file is gone (on disk: text only)
    model: str = ""  # the model a stored chat was made with, when it is not the one loaded
    live: bool = False
    busy: bool = False
    problem: str | None = None  # a saved session that cannot be resumed, and why
    other_model: bool = False  # ... only because another model of the family wrote it
    when: float | None = None  # last used (stored) or last written (open): tells same-titled rows apart


def twin_tags(entries: list[ChatEntry], now: float | None = None) -> list[str]:
    """A tag for each row whose title (and model) another row shares, "" for the others: when
    it was last used (" · 5m ago"), and where that is the same too, its place among them
    (" #2"). Two "New chat" rows, or an imported chat beside its original, then read apart."""
    now = time.time() if now is None else now
    def key(e: ChatEntry) -> tuple[str, str]:
        return one_line(e.title).casefold(), e.model
    count: dict[tuple[str, str], int] = {}
    for e in entries:
        count[key(e)] = count.get(key(e), 0) + 1
    tags = [f" · {relative_time(int(e.when or 0), now, never='new')}" if count[key(e)] > 1 else ""
            for e in entries]
    seen: dict[tuple, int] = {}
    for i, e in enumerate(entries):
        if not tags[i]:
            continue
        full = (*key(e), tags[i])
        seen[full] = seen.get(full, 0) + 1
        if seen[full] > 1:
            tags[i] += f" #{seen[full]}"
    return tags


class ChatItem(ListItem):
    """A marker and a title; a trailing tag such as " (fork 2)" has a label of its own, so a
    title cut by the sidebar's width still tells a fork from its parent."""

    def __init__(self, entry: ChatEntry, active: bool, twin: str = "") -> None:
        title, tag = self._labels(entry, active, twin)
        super().__init__(Label(title, classes="title"), Label(tag, classes="tag"))
        self.entry = entry
        self.twin = twin
        self.set_class(entry.key is None, "-saved")

    @staticmethod
    def _labels(entry: ChatEntry, active: bool, twin: str = "") -> tuple[Text, Text]:
        if entry.key is None:
            marker = BROKEN if entry.problem else (TEXT_ONLY if entry.text_only else SAVED)
        else:
            marker = BUSY if entry.busy else (LIVE if entry.live else PARKED)
        style = "bold" if active else ("dim" if entry.problem else "")
        body, tag = split_tag(one_line(entry.title))
        # Cut by the label's width with "…" (the sidebar's width, whatever it is now).
        label = Text(f"{marker} ", no_wrap=True, overflow="ellipsis")
        label.append(body, style=style)
        tag_text = Text(tag, style=style, no_wrap=True)
        if entry.model:  # made with another model: opening it continues on this one
            tag_text.append(f" {one_line(entry.model, 16)}", style="dim italic")
        if twin:
            tag_text.append(twin, style="dim")
        return label, tag_text

    def show(self, entry: ChatEntry, active: bool, twin: str = "") -> None:
        """Redraw this row for `entry` (same position, new title or state)."""
        self.entry = entry
        self.twin = twin
        self.set_class(entry.key is None, "-saved")
        title, tag = self._labels(entry, active, twin)
        self.query_one(".title", Label).update(title)
        self.query_one(".tag", Label).update(tag)


class ConversationList(ListView):
    """Open chats first (● live in memory, ○ saved to disk, ▶ generating), then stored chats
    (↺ with their KV on disk, ◌ text only: the next message re-prefills)."""

    BINDINGS = [Binding("delete", "delete_chat", "Delete chat", show=False)]
    """
    | Key | Description |
    | :- | :- |
    | delete | Delete the highlighted chat (asks first). |
    """

    DEFAULT_CSS = """
    ConversationList {
        width: 32;
        & > ChatItem.-saved { color: $text-muted; }
        & > ChatItem { layout: horizontal; }
        & > ChatItem > Label.title { width: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }
        & > ChatItem > Label.tag { width: auto; text-wrap: nowrap; }
    }
    """

    @dataclass
    class ChatChosen(Message):
        """The user picked a row; handle with `on_conversation_list_chat_chosen`."""

        conversation_list: ConversationList
        entry: ChatEntry

        @property
        def control(self) -> ConversationList:
            return self.conversation_list

    @dataclass
    class DeleteRequested(Message):
        """The user asked to delete the row `entry`; handle with `on_conversation_list_delete_requested`."""

        conversation_list: ConversationList
        entry: ChatEntry

        @property
        def control(self) -> ConversationList:
            return self.conversation_list

    @dataclass
    class Redrawn(Message):
        """The rows now show `entries`; handle with `on_conversation_list_redrawn`."""

        conversation_list: ConversationList
        entries: tuple[ChatEntry, ...]

        @property
        def control(self) -> ConversationList:
            return self.conversation_list

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        # Redraws are queued, never cancelled: cancelling a ListView while it removes
        # its items cancels the items' message pumps mid-prune.
        self._redraw = asyncio.Lock()
        self._shown: tuple[list[ChatEntry], str | None] = ([], None)  # the last show_entries
        self.clock = time.time  # "now" for the ages (tests move it)

    def on_mount(self) -> None:
        # A row's " · 5m ago" is worked out when it is drawn: without this it stayed as drawn
        # while `ds4tui chats ls` (same formatter, same stamps) counted on.
        self.set_interval(AGE_REFRESH_S, self._refresh_ages)

    async def _refresh_ages(self) -> None:
        entries, active = self._shown
        async with self._redraw:
            items = list(self.query(ChatItem))
            if not self.is_attached or len(items) != len(entries):
                return
            for item, entry, twin in zip(items, entries, twin_tags(entries, self.clock())):
                if twin != item.twin:
                    item.show(entry, entry.key is not None and entry.key == active, twin)

    async def show_entries(self, entries: list[ChatEntry], active_key: str | None) -> None:
        """Replace the rows (in place when their number is unchanged); highlight the active chat."""
        async with self._redraw:
            if not self.is_attached:
                return
            self._shown = (list(entries), active_key)
            items = list(self.query(ChatItem))
            twins = twin_tags(entries, self.clock())
            if len(items) == len(entries):
                for item, entry, twin in zip(items, entries, twins):
                    item.show(entry, entry.key is not None and entry.key == active_key, twin)
            else:
                await self.clear()
                await self.extend([ChatItem(e, e.key is not None and e.key == active_key, twin)
                                   for e, twin in zip(entries, twins)])
            for i, e in enumerate(entries):
                if e.key is not None and e.key == active_key:
                    self.index = i
                    break
        self.post_message(self.Redrawn(self, tuple(entries)))

    def action_delete_chat(self) -> None:
        item = self.highlighted_child
        if isinstance(item, ChatItem):
            self.post_message(self.DeleteRequested(self, item.entry))

    @on(ListView.Selected)
    def _chosen(self, event: ListView.Selected) -> None:
        event.stop()
        if isinstance(event.item, ChatItem):
            self.post_message(self.ChatChosen(self, event.item.entry))
