"""How file-derived text, byte counts and eviction scores are shown: one terminal-safety rule,
one size format, one score format.

Owns the rule every screen, CLI verb and cache message uses for text that came
from a file or a model, and the one byte-size format. Pure functions (stdlib
only), so the CLI, the cache and the Textual screens share them.

The rule: no C0 control, DEL, C1 control or bidi embedding/override/isolate
control (U+202A-U+202E, U+2066-U+2069) reaches the terminal. ESC starts
terminal sequences; the bidi controls can make a terminal show text in another
order than it is stored. Each such character is shown as a visible backslash
escape: `\\e` for ESC, `\\n` `\\t` `\\r`, else `\\xNN` or `\\uNNNN`. Bytes
that are not UTF-8 become U+FFFD. The one-line form escapes newline and tab
too; the multi-line form (`safe_lines`) keeps them as they are.
"""

from __future__ import annotations

import re
import time

# C0 controls, DEL, C1 controls and the bidi controls that can reorder what a terminal shows.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# The same set less newline and tab: text that is shown over several lines.
_UNSAFE_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\x1b": "\\e"}


def _escape_one(match: re.Match) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def _as_str(text: str | bytes | None) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        return text.decode("utf-8", errors="replace")
    return text


def _clip(text: str, limit: int | None) -> str:
    """At most `limit` characters of `text`, then "…" when some were cut (no space before it)."""
    if limit is not None and len(text) > limit:
        return text[:limit].rstrip() + "…"
    return text


def safe_text(text: str | bytes | None, limit: int | None = None) -> str:
    """One line, exactly as stored: every control escaped (newline and tab included).

    `limit` cuts the text before escaping (to `limit` characters plus "…"). None reads as "".
    """
    return _UNSAFE.sub(_escape_one, _clip(_as_str(text), limit))


def one_line(text: str | bytes | None, limit: int | None = None) -> str:
    """A title or preview on one line: runs of whitespace become one space, then as `safe_text`."""
    return safe_text(" ".join(_as_str(text).split()), limit)


def safe_lines(text: str | bytes | None) -> str:
    """Text over several lines (model replies, stored transcripts): newline and tab kept,
    every other control escaped as in `safe_text`."""
    return _UNSAFE_IN_LINES.sub(_escape_one, _as_str(text))


def human_bytes(n: int) -> str:
    """A byte count in binary units: `512 B`, `1.5 KiB`, `183.0 MiB`, `4.0 GiB` (GiB is the largest)."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


def score_text(score: float) -> str:
    """An eviction score for people: the score per MiB of file, so the SmolLM2-sized files of a
    chat read `22.6` rather than `2.16e-05` (a file's score is hits x tokens / bytes x weights,
    and a token's KV takes tens of KB). Never scientific notation; same order as the raw score."""
    value = score * 1024 * 1024
    if value <= 0:
        return "0"
    if value < 0.01:
        return "<0.01"
    if value < 10:
        return f"{value:.2f}"
    if value < 1000:
        return f"{value:.1f}"
    if value < 10_000:
        return f"{value:,.0f}"
    if value < 1_000_000:
        return f"{value / 1000:.0f}k"  # tiny files score high; keep the column narrow
    return f"{value / 1_000_000:.1f}M"


def count_text(n: int, width: int) -> str:
    """A count in at most `width` characters, never cut: whole when it fits, else with a unit
    (4294967295 in 4 columns: `4.3G`; 12345: `12k`). A count no unit can fit shows whole."""
    whole = str(n)
    if len(whole) <= width or n < 0:
        return whole
    for unit, size in (("k", 10**3), ("M", 10**6), ("G", 10**9), ("T", 10**12)):
        v = n / size
        for shown in (f"{v:.1f}{unit}", f"{v:.0f}{unit}"):
            if len(shown) <= width and not shown.startswith("1000"):
                return shown
    return whole


NO_TIME = "-"  # a time that is not there (0 or None), wherever a time is written out


def local_time(ts: float | None, *, seconds: bool = False) -> str:
    """Unix seconds as local `YYYY-MM-DD HH:MM` (`:SS` too with `seconds`): the one way every
    command, export and screen writes a point in time. 0 and None read as `NO_TIME`; a stamp
    the platform cannot convert (a corrupt header's) as `@<ts>`."""
    if not ts:
        return NO_TIME
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return f"@{ts}"


def relative_time(ts: int | None, now: float, never: str = "never") -> str:
    """`just now`, `5m ago`, `3h ago`, `2d ago`; a future stamp (a writer with a skewed
    clock) reads `in 5m`. Below a minute it is "just now", never "0m ago"."""
    if not ts:
        return never
    delta = now - ts
    ahead, delta = delta < 0, abs(delta)
    if delta < 60:
        return "just now"
    for limit, div, unit in ((3600, 60, "m"), (86400, 3600, "h"), (86400 * 365, 86400, "d")):
        if delta < limit:
            amount = f"{int(delta // div)}{unit}"
            break
    else:
        amount = f"{int(delta // (86400 * 365))}y"
    return f"in {amount}" if ahead else f"{amount} ago"
