"""A one-line gauge of the cache directory: bytes used against the budget, files, pins.

Owns: the bar (split by kind of file: pinned, titled, anonymous, damaged; colours of
cache_map.py) and its numbers, shorter when the terminal is narrow (the pinned count
always stays). Leaves to callers: measuring the directory (the browser calls
`set_usage` after each scan).
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ds4tui.format.display import human_bytes
from ds4tui.screens.widgets.cache_map import Share, stacked_bar

# Past this share of the budget the bar turns from green to yellow: the next
# save will likely evict something.
WARN_FRACTION = 0.9
BAR_WIDTH = 24
NARROW_BAR_WIDTH = 10
NARROW_BELOW = 110  # screen columns under which the gauge drops words


class BudgetGauge(Widget):
    """`used / budget` as a bar plus counts; red when over budget."""

    DEFAULT_CSS = """
    BudgetGauge { height: 1; width: auto; padding: 0 1; }
    """

    # layout=True: the widget is `width: auto`, so a longer text must re-measure it
    # (without it the tail, e.g. the pin count, was clipped depending on timing).
    used_bytes: reactive[int] = reactive(0, layout=True)
    """Bytes of all `.kv` files in the directory."""
    budget_bytes: reactive[int] = reactive(0, layout=True)
    """The directory's byte budget (eviction starts above it)."""
    file_count: reactive[int] = reactive(0, layout=True)
    """Number of `.kv` files, valid or not."""
    pinned_count: reactive[int] = reactive(0, layout=True)
    """Number of pinned files (never evicted)."""

    narrow: reactive[bool] = reactive(False, layout=True)
    """Fewer words and a shorter bar (an 80-column terminal)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.shares: list[Share] = []  # the bar's parts, by kind of file

    def render(self) -> Text:
        frac = self.used_bytes / self.budget_bytes if self.budget_bytes else 0.0
        style = "red" if frac > 1.0 else "yellow" if frac >= WARN_FRACTION else "green"
        width = NARROW_BAR_WIDTH if self.narrow else BAR_WIDTH
        shares = self.shares or [Share("used", self.used_bytes, style)]
        out = stacked_bar(shares, max(self.budget_bytes, self.used_bytes), width)
        sep = "/" if self.narrow else " / "
        out.append(f" {human_bytes(self.used_bytes)}{sep}{human_bytes(self.budget_bytes)}", style)
        if not self.narrow:
            out.append(f" ({frac:.0%})", style)
        files = "file" if self.file_count == 1 else "files"
        out.append(f" · {self.file_count} {files} · {self.pinned_count} pinned")
        return out

    def set_usage(self, *, used_bytes: int, budget_bytes: int, file_count: int, pinned_count: int,
                  shares: list[Share] | None = None) -> None:
        self.shares = shares or []
        self.used_bytes = used_bytes
        self.budget_bytes = budget_bytes
        self.file_count = file_count
        self.pinned_count = pinned_count
        self.refresh(layout=True)
