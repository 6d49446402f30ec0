"""The cache browser's file list: one row per `.kv` file, sortable, cursor kept on a SHA.

Owns: the columns, how each cell is written (through `kv_format`, so nothing
from a file is read as markup), the sort order, and keeping the cursor on the
same file across refreshes (rows are keyed by SHA; a vanished file leaves
the cursor on the row that took its place).
Leaves to callers: scanning, filtering and what selecting a row does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from ds4tui.cache.entry import KvEntry
from ds4tui.format.display import human_bytes
from ds4tui.screens.widgets.kv_format import relative_time, safe_cell


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int | None
    sort_key: Callable[[KvEntry], Any]
    numeric: bool = False


def _h(e: KvEntry, name: str, default: Any = -1) -> Any:
    return getattr(e.header, name) if e.header is not None else default


def _score(e: KvEntry) -> float:
    return e.score.score if e.score is not None else -1.0


def _title_key(e: KvEntry) -> str:
    return (e.title or e.text_preview or "").casefold()


COLUMNS: tuple[Column, ...] = (
    Column("title", "title / text", 18, _title_key),
    Column("last_used", "last used", 9, lambda e: _h(e, "last_used"), True),
    Column("created", "created", 8, lambda e: _h(e, "created_at"), True),
    Column("size", "size", 9, lambda e: e.file_bytes, True),
    Column("tokens", "tokens", 6, lambda e: _h(e, "tokens"), True),
    Column("hits", "hits", 4, lambda e: _h(e, "hits"), True),
    Column("reason", "reason", 13, lambda e: e.header.reason if e.header else ""),
    Column("model", "model", 17, lambda e: e.model),
    Column("pinned", "pin", 3, lambda e: e.pinned),
    Column("score", "score", 8, _score, True),
    Column("status", "status", 21, lambda e: (e.valid, e.error or "")),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
_BY_KEY = {c.key: c for c in COLUMNS}
DEFAULT_SORT = "last_used"


def status_text(e: KvEntry) -> Text:
    """A short verdict for the table (the detail pane shows the whole error):
    the reason up to its first comma, e.g. `payload ABI 2 (ds4)`, or
    `corrupt: truncated file`."""
    if e.valid:
        return Text("ok", style="green")
    if e.corrupt:
        return safe_cell("corrupt: " + (e.error or "").split(",")[0].split(":")[0], 40, "red")
    # Intact but not for this engine (another ABI, model, version): yellow, never "corrupt".
    return safe_cell((e.not_loadable or e.error or "").split(",")[0], 40, "yellow")


TITLE_CHARS = 120  # the column is as wide as the table allows; the cell ellipsizes beyond it


def title_cell(e: KvEntry) -> Text:
    if e.title is not None:
        return safe_cell(e.title, TITLE_CHARS, "bold")
    first = (e.text_preview or "").lstrip().split("\n", 1)[0]
    return safe_cell(first, TITLE_CHARS, "dim")


def row_cells(e: KvEntry, now: float) -> list[Text]:
    h = e.header

    def num(v: int | None) -> Text:
        return Text("—" if v is None else str(v), justify="right")

    return [
        title_cell(e),
        Text(relative_time(h.last_used, now) if h else "—"),
        Text(relative_time(h.created_at, now) if h else "—"),
        Text(human_bytes(e.file_bytes), justify="right"),
        num(h.tokens if h else None),
        num(h.hits if h else None),
        Text(h.reason if h else "—"),
        Text(e.model if h else "—"),
        Text("●" if e.pinned else "", style="bold magenta"),
        Text(f"{e.score.score:.3g}" if e.score is not None else "—", justify="right"),
        status_text(e),
    ]


class KvTable(DataTable):
    """Rows of `KvEntry`, keyed by SHA. Click a header or press `s`/`S` to sort."""

    BINDINGS = [
        Binding("s", "next_sort", "Sort", show=True),
        Binding("S", "reverse_sort", "Reverse", show=False),
    ]
    """
    | Key | Description |
    | :- | :- |
    | s | Sort by the next column. |
    | S | Reverse the sort order. |
    """

    class Sorted(Message):
        """The user changed the sort order. Handler: `on_kv_table_sorted`."""

        def __init__(self, table: KvTable, description: str) -> None:
            super().__init__()
            self.table = table
            self.description = description

        @property
        def control(self) -> KvTable:
            return self.table

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, name=name, id=id, classes=classes)
        self._entries: list[KvEntry] = []
        self._now = 0.0
        self.sort_column = DEFAULT_SORT
        # Newest first is what a user opening the browser wants to see.
        self.sort_reverse = True

    def on_mount(self) -> None:
        for c in COLUMNS:
            self.add_column(c.label, key=c.key, width=c.width)
        self._fit_title()

    def on_resize(self) -> None:
        self._fit_title()

    def _fit_title(self) -> None:
        """The title column takes the width the fixed columns leave (2 cells of padding each,
        2 for the scrollbar): at 160 columns a 60-character title shows whole."""
        if "title" not in self.columns or not self.size.width:
            return
        fixed = sum((c.width or 0) + 2 for c in COLUMNS if c.key != "title")
        width = max(_BY_KEY["title"].width or 18, self.size.width - fixed - 2 - 2)
        column = self.columns["title"]
        if column.width != width:
            column.width = width
            self._require_update_dimensions = True
            self.refresh()

    @on(DataTable.HeaderSelected)
    def _on_header(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        key = event.column_key.value
        if key == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column, self.sort_reverse = key, _BY_KEY[key].numeric
        self._resort()

    def action_next_sort(self) -> None:
        i = COLUMN_KEYS.index(self.sort_column)
        key = COLUMN_KEYS[(i + 1) % len(COLUMN_KEYS)]
        self.sort_column, self.sort_reverse = key, _BY_KEY[key].numeric
        self._resort()

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._resort()

    def _resort(self) -> None:
        self._rebuild()
        self.post_message(self.Sorted(self, self.sort_description))

    # -- public API ------------------------------------------------------------

    @property
    def sort_description(self) -> str:
        """E.g. `last used ▼` (descending)."""
        return f"{_BY_KEY[self.sort_column].label} {'▼' if self.sort_reverse else '▲'}"

    @property
    def selected_sha(self) -> str | None:
        """SHA of the row under the cursor, None when the table is empty."""
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value
        except Exception:  # cursor outside the rows while they are rebuilt
            return None

    @property
    def shas(self) -> list[str]:
        """SHAs in display order."""
        return [row.key.value for row in self.ordered_rows]

    def show(self, entries: Sequence[KvEntry], now: float, *, select: str | None = None) -> None:
        """Replace the rows; the cursor stays on `select` (default: the current SHA) if it is still listed."""
        self._entries = list(entries)
        self._now = now
        self._rebuild(select)

    def _sorted(self) -> list[KvEntry]:
        col = _BY_KEY[self.sort_column]
        # SHA as the tie-breaker keeps the order stable between refreshes.
        out = sorted(self._entries, key=lambda e: e.sha or "")
        return sorted(out, key=col.sort_key, reverse=self.sort_reverse)

    def _rebuild(self, select: str | None = None) -> None:
        keep = select or self.selected_sha
        old_row = self.cursor_row
        self.clear()
        for e in self._sorted():
            self.add_row(*row_cells(e, self._now), key=e.sha or e.path)
        for c in COLUMNS:
            # Underlined rather than an arrow in the label: the widths are tight at 140 columns.
            self.columns[c.key].label = Text(c.label, style="underline" if c.key == self.sort_column else "")
        if not self.row_count:
            return
        if keep is not None and keep in self.rows:
            row = self.get_row_index(keep)
        else:
            # The file went away: stay where it was, on the row that moved up.
            row = min(max(old_row, 0), self.row_count - 1)
        self.move_cursor(row=row, animate=False)
