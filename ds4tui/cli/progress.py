"""A one-line text progress bar on stderr for long steps outside the TUI (a GGUF's first conversion)."""

from __future__ import annotations

import sys
from typing import TextIO


class ProgressBar:
    """progress(what, fraction) -> one redrawn line: `<title> <what> [#####    ]  42%`."""

    def __init__(self, title: str, out: TextIO | None = None, width: int = 25) -> None:
        self.title, self.out, self.width = title, out or sys.stderr, width
        self._shown = -1

    def __call__(self, what: str, fraction: float) -> None:
        pct = max(0, min(100, int(fraction * 100)))
        if pct == self._shown:
            return
        self._shown = pct
        bar = "#" * (pct * self.width // 100)
        print(f"\r{self.title} {what} [{bar:<{self.width}}] {pct:3d}%", end="", file=self.out, flush=True)

    def close(self, failed: bool = False) -> None:
        """End the bar's line; on failure erase it instead, so the error is the only line."""
        if self._shown >= 0:
            print("\r\033[K" if failed else "", end="" if failed else "\n", file=self.out, flush=True)
            self._shown = -1
