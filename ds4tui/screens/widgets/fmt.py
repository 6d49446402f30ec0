"""Numbers and untrusted text, formatted for the chat screen.

Owns: how rates, durations, sizes and token counts read on screen, and
`display_text`, which makes model output and file-derived text safe to show
(control codes become visible symbols; nothing here is ever parsed as markup:
callers wrap the result in `rich.text.Text` or a Markdown widget). Timing
formatters are looked up as `fmt.rate(...)` at call time so snapshot tests can
swap them for constants.
"""

from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, C1 controls, and the bidi controls
# that can make a terminal show text in another order than it is stored.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode "control pictures": ␀ ␁ ... ␟
    if code == 0x7F:
        return "\u2421"  # ␡
    return "\ufffd"


def display_text(text: str) -> str:
    """`text` with every control code (but tab and newline) replaced by a visible symbol."""
    return _UNSAFE.sub(_visible, text)


def one_line(text: str, limit: int | None = None) -> str:
    """A title or preview on one line: whitespace collapsed, clipped with an ellipsis."""
    out = display_text(" ".join(text.split()))
    if limit is not None and len(out) > limit:
        out = out[: max(limit - 1, 0)].rstrip() + "…"
    return out


def rate(tok_s: float) -> str:
    return f"{tok_s:.1f} tok/s" if tok_s < 100 else f"{tok_s:.0f} tok/s"


def ms(value: float) -> str:
    if value < 10:
        return f"{value:.1f} ms"
    if value < 10_000:
        return f"{value:.0f} ms"
    return f"{value / 1000:.1f} s"


def eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA …"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"ETA {seconds}s"
    return f"ETA {seconds // 60}m{seconds % 60:02d}s"


def size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def tokens(n: int) -> str:
    return f"{n:,}"
