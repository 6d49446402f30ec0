"""The prefill progress line: a bar, tokens done/total, speed and ETA.

Owns: showing one prefill's progress. Hidden until a prefill needs more than
one chunk (short prompts would only flash it). Leaves to the screen: when a
prefill starts and ends.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from ds4tui.screens.widgets import fmt


class PrefillBar(Horizontal):
    """`Prefill [=====     ] 1,024/4,096 tokens · 300 tok/s · ETA 10s`; class `-active` shows it."""

    DEFAULT_CSS = """
    PrefillBar {
        height: 1;
        padding: 0 1;
        display: none;
        &.-active { display: block; }
        & > #prefill-label { width: auto; padding: 0 1 0 0; }
        /* The numbers come first: the bar takes what they leave, up to 16 cells
           (at 80 columns with the sidebar open that is about 7). */
        & > ProgressBar { width: 1fr; max-width: 16; & > Bar { width: 1fr; min-width: 3; } }
        & > #prefill-info { width: auto; padding: 0 0 0 1; }
    }
    """

    def compose(self) -> ComposeResult:
        yield Label("Prefill", id="prefill-label")
        yield ProgressBar(total=1, show_eta=False, show_percentage=False, id="prefill-progress")
        yield Label("", id="prefill-info")

    def show_progress(self, done: int, total: int, tok_s: float, eta_s: float | None) -> None:
        self.add_class("-active")
        self.query_one(ProgressBar).update(total=max(total, 1), progress=done)
        info = f"{fmt.tokens(done)}/{fmt.tokens(total)} tokens · {fmt.rate(tok_s)} · {fmt.eta(eta_s)}"
        self.query_one("#prefill-info", Label).update(Text(info))

    def hide(self) -> None:
        self.remove_class("-active")

    @property
    def active(self) -> bool:
        return self.has_class("-active")
