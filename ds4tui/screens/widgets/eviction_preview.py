"""A dry run of eviction on screen: the modal that lists an `EvictionPlan`.

Owns: the modal. The plan itself (`ds4tui.cache.eviction.EvictionPlan`) is
built from the store's own victim choice, so the preview and a real budget
pass can never disagree. Deletes nothing. Leaves to callers: scanning the
directory and building the plan.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from ds4tui.cache.eviction import EvictionPlan
from ds4tui.format.display import human_bytes, score_text
from ds4tui.screens.widgets.kv_format import reason_label
from ds4tui.screens.widgets.kv_table import title_cell


class EvictionPreview(ModalScreen[None]):
    """Lists `EvictionPlan.order`; rows that would go now are marked."""

    BINDINGS = [Binding("escape,q,e", "close", "Close")]
    """
    | Key | Description |
    | :- | :- |
    | escape, q, e | Close the preview. |
    """

    DEFAULT_CSS = """
    EvictionPreview {
        align: center middle;
        & > Vertical { width: 90%; height: 80%; border: thick $warning; background: $surface; }
        & Static { padding: 0 1; height: auto; }
    }
    """

    # What a user reads first comes first (whether it goes now, which chat), and the title
    # takes what the other columns leave.
    FIXED = {"#": 3, "now": 5, "reason": 13, "size": 9, "freed so far": 12, "score": 6, "sha": 8}
    FIRST = ("#", "now", "reason", "size", "freed so far")  # in view beside the title at any width
    TITLE_MIN = 12

    def _title_width(self) -> int:
        """The title column's width from the terminal's: the table is 90% of it, less the
        frame. At mount the table has no size yet (it used to fall back to 70 columns, and a
        140-column terminal got 12-character titles). Wide, every column fits and the title
        takes the rest; at 80 columns the score and sha go off to the right, never the
        "evict" mark or the title."""
        table_width = int(self.app.size.width * 0.9) - 2 - 2  # the thick border; the scrollbar
        gaps = 2 * (len(self.FIXED) + 1)  # each column's one-cell padding on both sides
        room = table_width - gaps - sum(self.FIXED.values())
        if room >= 24:
            return room
        return max(self.TITLE_MIN, table_width - gaps - sum(self.FIXED[k] for k in self.FIRST))

    def __init__(self, plan: EvictionPlan, *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.plan = plan

    def compose(self) -> ComposeResult:
        p = self.plan
        head = Text.assemble(
            ("Eviction dry run", "bold"),
            f"  {human_bytes(p.used_bytes)} of {human_bytes(p.budget_bytes)} budget,"
            f" {p.pinned_count} pinned (never evicted)\n",
            (p.summary(), "yellow" if p.now else ""),
        )
        with Vertical():
            yield Static(head, markup=False)
            yield DataTable(cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        title_width = self._title_width()
        for label in ("#", "now"):
            table.add_column(label, width=self.FIXED[label])
        table.add_column("title / text", width=title_width)
        for label in ("reason", "size", "freed so far", "score", "sha"):
            table.add_column(label, width=self.FIXED[label])
        freed = 0
        for i, e in enumerate(self.plan.order, 1):
            freed += e.file_bytes
            table.add_row(
                str(i), Text("evict", style="bold red") if e.path in self.plan.now else "",
                title_cell(e, width=title_width), reason_label(e.header.reason) if e.header else "—",
                human_bytes(e.file_bytes), human_bytes(freed), score_text(e.score.score) if e.score else "—",
                (e.sha or "?")[:8],
                key=e.path,
            )
        table.focus()

    def action_close(self) -> None:
        self.dismiss(None)
