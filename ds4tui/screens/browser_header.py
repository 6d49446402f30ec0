"""The cache browser's top line: the directory, the sort order, the budget gauge.

Owns: `BrowserHeader`, laying the three out in one row and giving way at 80 columns
(the gauge's numbers and the pinned count stay; the directory goes first, then the
sort label: the table underlines the sort column).
Leaves the numbers to the scan it is shown (`show_scan`).
"""

from __future__ import annotations

import os

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from ds4tui.cache import scan as cache_scan
from ds4tui.screens.widgets.budget_gauge import NARROW_BELOW, BudgetGauge
from ds4tui.screens.widgets.cache_map import by_kind
from ds4tui.screens.widgets.kv_format import safe_cell


def short_dir(path) -> str:
    """The directory as people write it: the home directory as `~`."""
    text, home = str(path), os.path.expanduser("~")
    if home not in ("", "/", "~") and (text == home or text.startswith(home + os.sep)):
        return "~" + text[len(home):]
    return text


class BrowserHeader(Horizontal):
    """`~/dir   sorted by last used   [gauge]` in one row."""

    def __init__(self, directory, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._directory = directory

    def compose(self) -> ComposeResult:
        yield Static(safe_cell(short_dir(self._directory), 200), id="browser-dir", markup=False)
        yield Static("", id="browser-sort", markup=False)
        yield BudgetGauge(id="browser-gauge")

    def on_resize(self, event) -> None:
        narrow = event.size.width < NARROW_BELOW
        self.query_one(BudgetGauge).narrow = narrow
        self.query_one("#browser-sort").display = not narrow

    def show_scan(self, scan: cache_scan.BrowserScan, budget_bytes: int) -> None:
        entries = scan.entries
        self.query_one(BudgetGauge).set_usage(
            used_bytes=sum(e.file_bytes for e in entries), budget_bytes=budget_bytes,
            file_count=len(entries), pinned_count=sum(1 for e in entries if e.pinned), shares=by_kind(entries))

    def show_sort(self, description: str) -> None:
        self.query_one("#browser-sort", Static).update(Text(f"sorted by {description}", style="dim"))
