"""The one text progress bar: rich's, on stderr, for a command's long step outside the TUI
(a model's extraction on `models pull`, a GGUF's first conversion).

Owns `TextProgress`, a `progress(what, fraction)` callable (the shape `load_model` and
`registry.pull` take) over `rich.progress.Progress`. Here because only the UI layer imports
rich (tests/test_layers.py); the command line imports it inside the command that draws it.
Outside a terminal rich draws nothing while it runs and prints the last state once, so a
log holds one line, not a line per percent.
"""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn


class TextProgress:
    """progress(what, fraction) -> `<title> <what> ━━━━━━━╺━━━━━━  42%`, redrawn in place."""

    def __init__(self, title: str, out: TextIO | None = None) -> None:
        self.title = title
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=25), TaskProgressColumn(),
                                  console=Console(file=out or sys.stderr), transient=False)
        self._task: TaskID | None = None

    def __call__(self, what: str, fraction: float) -> None:
        shown = f"{self.title} {what}".strip()
        done = max(0.0, min(1.0, fraction))
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task(shown, total=1.0, completed=done)
        else:
            self._progress.update(self._task, description=shown, completed=done)

    def close(self, failed: bool = False) -> None:
        """End the bar's line; on failure erase it instead, so the error is the only line."""
        if self._task is None:
            return
        if failed:  # stop() then clears what it drew; outside a terminal nothing was drawn yet
            self._progress.live.transient = True
            self._progress.console.quiet = not self._progress.console.is_terminal
        self._progress.stop()
        self._task = None
