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
from ds4tui.format.display import count_text, human_bytes, relative_time, score_text
from ds4tui.chat.file_names import BELONGS, FileName, name_of
from ds4tui.screens.widgets.kv_format import reason_label, safe_cell
from ds4tui.screens.widgets.title_fit import fitted_title


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
    Column("title", "title / chat", 18, _title_key),
    Column("last_used", "last used", 9, lambda e: _h(e, "last_used"), True),
    Column("created", "created", 8, lambda e: _h(e, "created_at"), True),
    Column("size", "size", 9, lambda e: e.file_bytes, True),
    Column("tokens", "tokens", 6, lambda e: _h(e, "tokens"), True),
    Column("hits", "hits", 4, lambda e: _h(e, "hits"), True),
    Column("reason", "reason", 13, lambda e: reason_label(e.header.reason) if e.header else ""),
    Column("model", "model", 17, lambda e: e.model),
    Column("pinned", "pin", 3, lambda e: e.pinned),
    Column("score", "score", 8, _score, True),
    Column("status", "status", 21, lambda e: (e.valid, e.error or "")),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
_BY_KEY = {c.key: c for c in COLUMNS}
DEFAULT_SORT = "last_used"

# Which columns stay when the table is narrow, most important first: what a file is (title),
# why it was saved, whether it loads, then pin (so pinning shows), age, size, score.
PRIORITY = ("title", "reason", "status", "pinned", "last_used", "tokens", "size", "score", "hits", "model", "created")
TITLE_MIN, TITLE_MAX = 22, 64
WIDE_TITLE_MIN, WIDE_FROM = 40, 120  # on a wide table the title comes before model and created
NARROW_STATUS = 12  # the status column's width when the table is narrow (the detail has it all)
CELL_PADDING = 2  # DataTable pads each cell by one column on each side
SCROLLBAR = 2


def fit_columns(width: int) -> tuple[tuple[str, ...], dict[str, int]]:
    """The columns that fit `width` (by PRIORITY, in COLUMNS order) and their widths; the
    title takes what is left, up to TITLE_MAX."""
    widths = {c.key: c.width or 8 for c in COLUMNS}
    room = width - SCROLLBAR
    if room < 110:
        widths["status"] = NARROW_STATUS
    title_min = WIDE_TITLE_MIN if room >= WIDE_FROM else TITLE_MIN
    chosen, used = [], 0
    for key in PRIORITY:
        need = (title_min if key == "title" else widths[key]) + CELL_PADDING
        if used + need <= room or key == "title":
            chosen.append(key)
            used += need
    widths["title"] = max(title_min, min(TITLE_MAX, title_min + room - used))
    return tuple(k for k in COLUMN_KEYS if k in chosen), widths


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


_NAME_STYLES = {"title": "bold", "chat": "italic", "shared": "dim italic", "message": "", "text": "dim"}


def title_cell(e: KvEntry, name: FileName | None = None, width: int | None = None) -> Text:
    """The file's name (file_names.py): its title, the chat it belongs to, or its first message.
    Already one terminal-safe line; cut to `width` with "…" before a trailing "(fork)" tag,
    which tells a fork from its parent (else the cell cuts it at its end)."""
    if name is None:
        name = name_of(e, None, None)
    style = _NAME_STYLES.get(name.kind, "")
    if width is not None:
        return fitted_title(name.text, width, style)
    return Text(name.text, style=style, no_wrap=True, overflow="ellipsis")


def row_cells(e: KvEntry, now: float, name: FileName | None = None, title_width: int | None = None
              ) -> dict[str, Text]:
    h = e.header

    def num(v: int | None, key: str) -> Text:
        # Within the column's width, never cut: 4294967295 hits read `4.3G`, not `4294`.
        return Text("—" if v is None else count_text(v, _BY_KEY[key].width), justify="right")

    cells = [
        title_cell(e, name, title_width),
        Text(relative_time(h.last_used, now) if h else "—"),
        Text(relative_time(h.created_at, now) if h else "—"),
        Text(human_bytes(e.file_bytes), justify="right"),
        num(h.tokens if h else None, "tokens"),
        num(h.hits if h else None, "hits"),
        Text(reason_label(h.reason) if h else "—"),
        Text(e.model if h else "—"),
        Text("●" if e.pinned else "", style="bold magenta"),
        Text(score_text(e.score.score) if e.score is not None else "—", justify="right"),
        status_text(e),
    ]
    return dict(zip(COLUMN_KEYS, cells))


class KvTable(DataTable):
    """Rows of `KvEntry`, keyed by SHA. Click a header or press `s`/`S` to sort."""

    BINDINGS = [
        # DataTable's own enter (select the row: the browser resumes it) is hidden from the
        # footer, which then never said how to open a file: shown here under the browser's name.
        Binding("enter", "select_cursor", "Resume"),
        # Not in the footer (the underlined header shows the sort): it is full at 80 columns.
        Binding("s", "next_sort", "Sort", show=False),
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
        self._names: dict[str, FileName] = {}
        self._now = 0.0
        self._shown_columns: tuple[str, ...] = ()
        self._widths: dict[str, int] = {}
        self.sort_column = DEFAULT_SORT
        # Newest first is what a user opening the browser wants to see.
        self.sort_reverse = True

    def on_mount(self) -> None:
        self._fit(self.size.width or 140)

    def on_resize(self, event) -> None:
        self._fit(event.size.width)

    def _fit(self, width: int) -> None:
        """Show the columns that fit (PRIORITY), the title as wide as what is left."""
        keys, widths = fit_columns(width)
        if keys == self._shown_columns and widths == self._widths:
            return
        self._shown_columns, self._widths = keys, widths
        self.clear(columns=True)
        for key in keys:
            self.add_column(_BY_KEY[key].label, key=key, width=widths[key])
        self._rebuild()

    @property
    def shown_columns(self) -> tuple[str, ...]:
        """Keys of the columns on screen now."""
        return self._shown_columns

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
        keys = self._shown_columns or COLUMN_KEYS
        i = keys.index(self.sort_column) if self.sort_column in keys else -1
        key = keys[(i + 1) % len(keys)]
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

    def show(self, entries: Sequence[KvEntry], now: float, *, select: str | None = None,
             names: dict[str, FileName] | None = None) -> None:
        """Replace the rows; the cursor stays on `select` (default: the current SHA) if it is still listed.
        `names`: path -> what the title column calls the file (file_names.py)."""
        self._entries = list(entries)
        self._names = names or {}
        self._now = now
        self._rebuild(select)

    def _sorted(self) -> list[KvEntry]:
        if self.sort_column == "title":
            def sort_key(e: KvEntry):
                name = self._names.get(e.path)
                return name.text.removeprefix(BELONGS).casefold() if name else _title_key(e)
        else:
            sort_key = _BY_KEY[self.sort_column].sort_key
        # SHA as the tie-breaker keeps the order stable between refreshes.
        out = sorted(self._entries, key=lambda e: e.sha or "")
        return sorted(out, key=sort_key, reverse=self.sort_reverse)

    def _rebuild(self, select: str | None = None) -> None:
        keep = select or self.selected_sha
        old_row = self.cursor_row
        if not self._shown_columns:
            return  # not mounted yet: on_mount adds the columns, then comes back here
        self.clear()
        for e in self._sorted():
            cells = row_cells(e, self._now, self._names.get(e.path), self._widths.get("title"))
            self.add_row(*(cells[k] for k in self._shown_columns), key=e.sha or e.path)
        for key in self._shown_columns:
            # Underlined rather than an arrow in the label: the widths are tight at 140 columns.
            label = _BY_KEY[key].label
            self.columns[key].label = Text(label, style="underline" if key == self.sort_column else "")
        if not self.row_count:
            return
        if keep is not None and keep in self.rows:
            row = self.get_row_index(keep)
        else:
            # The file went away: stay where it was, on the row that moved up.
            row = min(max(old_row, 0), self.row_count - 1)
        self.move_cursor(row=row, animate=False)
