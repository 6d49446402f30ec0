"""A one-line gauge of the cache directory: bytes used against the budget, files, pins.

Owns: the bar and its numbers. Leaves to callers: measuring the directory
(the browser sets the reactives after each scan).
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ds4tui.format.display import human_bytes

# Past this share of the budget the bar turns from green to yellow: the next
# save will likely evict something.
WARN_FRACTION = 0.9
BAR_WIDTH = 24


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

    def render(self) -> Text:
        frac = self.used_bytes / self.budget_bytes if self.budget_bytes else 0.0
        style = "red" if frac > 1.0 else "yellow" if frac >= WARN_FRACTION else "green"
        filled = min(BAR_WIDTH, round(frac * BAR_WIDTH))
        out = Text()
        out.append("█" * filled, style)
        out.append("░" * (BAR_WIDTH - filled), "dim")
        out.append(f" {human_bytes(self.used_bytes)} / {human_bytes(self.budget_bytes)} ({frac:.0%})", style)
        files = "file" if self.file_count == 1 else "files"
        out.append(f" · {self.file_count} {files} · {self.pinned_count} pinned")
        return out

    def set_usage(self, *, used_bytes: int, budget_bytes: int, file_count: int, pinned_count: int) -> None:
        self.used_bytes = used_bytes
        self.budget_bytes = budget_bytes
        self.file_count = file_count
        self.pinned_count = pinned_count
