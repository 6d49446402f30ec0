"""Numbers formatted for the chat screen: rates, durations, ETAs and token counts.

Byte sizes and untrusted text (model output, file-derived titles) go through
`ds4tui.format.display`, the one rule the CLI and the cache browser use too.
Timing formatters are looked up as `fmt.rate(...)` at call time so snapshot
tests can swap them for constants.
"""

from __future__ import annotations


def rate(tok_s: float) -> str:
    return f"{tok_s:.1f} tok/s" if tok_s < 100 else f"{tok_s:.0f} tok/s"


def ms(value: float) -> str:
    if value < 10:
        return f"{value:.1f} ms"
    if value < 1000:
        return f"{value:.0f} ms"
    return f"{value / 1000:.1f} s"


def eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA …"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"ETA {seconds}s"
    return f"ETA {seconds // 60}m{seconds % 60:02d}s"


def share(fraction: float) -> str:
    """A part of a whole as a percentage: `2%`, `<1%`."""
    return "<1%" if fraction < 0.01 else f"{fraction * 100:.0f}%"


def tokens(n: int) -> str:
    return f"{n:,}"
