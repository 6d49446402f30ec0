"""The one-line status bar: model, context used/total, last speed, last cache event.

Owns: composing that line from plain values. Everything shown is a `Text`
(never markup), since the cache event may quote a file's title.
"""

from __future__ import annotations

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
