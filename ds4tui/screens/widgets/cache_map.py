"""A picture of the cache directory: what its bytes are, by kind and by save reason.

Owns: splitting a scan's files into shares (`Share`, pure functions, testable without a
terminal), the stacked bar drawn from them, and `CacheMap`, the one-line legend under
the browser's header (by kind: titled / anonymous / pinned; by reason). Bars are drawn
with block characters: a plotting library needs several rows to draw a bar chart and
the browser has one row to spare at 80x24.
Leaves to callers: the scan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from ds4tui.cache.entry import KvEntry
from ds4tui.format.display import human_bytes
from ds4tui.screens.widgets.kv_format import reason_label

KIND_STYLES = {"pinned": "magenta", "titled": "green", "anonymous": "yellow", "damaged": "red"}
REASON_STYLES = {"agent-session": "green", "shutdown": "cyan", "evict": "blue", "cold": "yellow",
                 "continued": "bright_yellow", "agent-system": "bright_green"}


@dataclass(frozen=True)
class Share:
    label: str
    bytes: int
    style: str


def kind_of(e: KvEntry) -> str:
    """Pinned first (whatever else it is), then titled (a user's chat), anonymous, or damaged."""
    if e.header is None or e.corrupt:
        return "damaged"
    if e.pinned:
        return "pinned"
    return "titled" if e.header.titled else "anonymous"


def by_kind(entries: Iterable[KvEntry]) -> list[Share]:
    sizes: dict[str, int] = {}
    for e in entries:
        sizes[kind_of(e)] = sizes.get(kind_of(e), 0) + e.file_bytes
    return [Share(k, sizes[k], KIND_STYLES[k]) for k in KIND_STYLES if sizes.get(k)]


def by_reason(entries: Iterable[KvEntry]) -> list[Share]:
    """Largest first; files whose header does not decode count as `unknown`."""
    sizes: dict[str, int] = {}
    for e in entries:
        reason = e.header.reason if e.header is not None else "unknown"
        sizes[reason] = sizes.get(reason, 0) + e.file_bytes
    return [Share(reason_label(r), n, REASON_STYLES.get(r, "white"))
            for r, n in sorted(sizes.items(), key=lambda kv: -kv[1])]


def stacked_bar(shares: list[Share], total: int, width: int) -> Text:
    """`width` cells: each share as many cells as its part of `total` (at least one when it has
    bytes), the rest dim as free room."""
    out = Text()
    if width <= 0:
        return out
    cells = []
    for s in shares:
        n = round(s.bytes / total * width) if total else 0
        cells.append(max(1, n) if s.bytes else 0)
    while sum(cells) > width and max(cells, default=0) > 1:  # rounding up the small ones
        cells[cells.index(max(cells))] -= 1
    for s, n in zip(shares, cells):
        out.append("█" * n, s.style)
    out.append("░" * max(0, width - sum(cells)), "dim")
    return out


def legend(shares: list[Share]) -> Text:
    out = Text()
    for i, s in enumerate(shares):
        if i:
            out.append("  ")
        out.append("■ ", s.style)
        out.append(f"{s.label} {human_bytes(s.bytes)}")
    return out


class CacheMap(Static):
    """`■ titled 1.1 GiB  ■ anonymous 90 MiB │ by reason ▕████▒▒░▏ ■ chat 1.1 GiB ...`"""

    DEFAULT_CSS = """
    CacheMap { height: 1; padding: 0 1; background: $panel; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    REASON_BAR = 12

    def show(self, entries: list[KvEntry]) -> None:
        total = sum(e.file_bytes for e in entries)
        if not entries:
            self.update(Text("no files", style="dim"))
            return
        out = legend(by_kind(entries))
        out.append("  │ by reason ", "dim")
        reasons = by_reason(entries)
        out.append_text(stacked_bar(reasons, total, self.REASON_BAR))
        out.append(" ")
        out.append_text(legend(reasons))
        self.update(out)
