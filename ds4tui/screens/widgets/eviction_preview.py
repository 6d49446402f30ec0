"""A dry run of eviction: the order in which files would go, and which go now.

Owns: `EvictionPlan` (built from the store's own victim choice, so the preview
and a real budget pass can never disagree) and the modal that lists it.
Deletes nothing. Leaves to callers: scanning the directory.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from ds4tui.cache import eviction
from ds4tui.cache.entry import KvEntry
from ds4tui.format.display import human_bytes
from ds4tui.screens.widgets.kv_table import title_cell


@dataclass(frozen=True)
class EvictionPlan:
    """`order`: every evictable file, first victim first; `now`: the SHAs a budget pass removes today."""

    order: tuple[KvEntry, ...]
    now: frozenset[str]
    used_bytes: int
    budget_bytes: int
    pinned_count: int

    @classmethod
    def build(cls, entries: list[KvEntry], budget_bytes: int) -> EvictionPlan:
        """`entries` must be scored (KvStore.scan). Uses the store's victim choice:
        a target of 0 bytes ranks everything that is not pinned."""
        order = eviction.choose_victims(entries, 0)
        now = eviction.choose_victims(entries, budget_bytes)
        return cls(tuple(order), frozenset(e.path for e in now), sum(e.file_bytes for e in entries),
                   budget_bytes, sum(1 for e in entries if e.pinned))

    def summary(self) -> str:
        if self.now:
            freed = sum(e.file_bytes for e in self.order if e.path in self.now)
            return (f"Over budget: the next save or `ds4tui kv evict` removes {len(self.now)} file(s),"
                    f" {human_bytes(freed)}.")
        if not self.order:
            return "Nothing can be evicted (no files, or all pinned)."
        return "Under budget: nothing is evicted now. When space is needed, files go in this order."


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
        table.add_columns("#", "sha", "title / text", "reason", "size", "score", "freed so far", "now")
        freed = 0
        for i, e in enumerate(self.plan.order, 1):
            freed += e.file_bytes
            table.add_row(
                str(i), (e.sha or "?")[:8], title_cell(e), e.header.reason if e.header else "—",
                human_bytes(e.file_bytes), f"{e.score.score:.3g}" if e.score else "—", human_bytes(freed),
                Text("evict", style="bold red") if e.path in self.plan.now else "",
                key=e.path,
            )
        table.focus()

    def action_close(self) -> None:
        self.dismiss(None)
