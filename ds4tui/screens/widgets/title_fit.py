"""Titles cut to a width without losing what tells two of them apart.

A fork is named "title (fork)" or "title (fork 2)" after its parent, so a title cut at its
end reads exactly like the parent's. Cutting the body instead and keeping a short trailing
tag in parentheses keeps the two apart in the sidebar and the cache browser's table.
Titles are already one terminal-safe line (format.display.one_line) when they get here.
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.text import Text

from ds4tui.format.display import one_line

# A short trailing tag in parentheses: " (fork)", " (fork 12)".
_TAG = re.compile(r" \([^()]{1,12}\)$")
MIN_BODY = 4  # cells of the title body kept before the tag (else the tag goes too)


def split_tag(title: str) -> tuple[str, str]:
    """`("Trip to Lisbon", " (fork 2)")`, or `(title, "")` when it ends with no short tag."""
    match = _TAG.search(title)
    if match is None or match.start() == 0:
        return title, ""
    return title[: match.start()], match.group()


def _cut(text: str, width: int, style: str) -> Text:
    """`text` in at most `width` cells, "…" last when cut (no space before it, as format.display)."""
    out = Text(text, style=style, no_wrap=True, overflow="ellipsis")
    if out.cell_len > width:
        out.truncate(max(width - 1, 0), overflow="crop")
        out.rstrip()
        out.append("…")
    return out


def fitted_title(title: str, width: int, style: str = "") -> Text:
    """`title` in at most `width` cells: the body cut with "…" before a kept trailing tag."""
    if cell_len(title) <= width:
        return _cut(title, width, style)
    body, tag = split_tag(title)
    if not tag or width - cell_len(tag) < MIN_BODY:
        return _cut(title, width, style)
    out = _cut(body, width - cell_len(tag), style)
    out.append(tag, style=style)
    return out


def short_title(title: str, width: int = 40) -> str:
    """A title for a one-line notice: one terminal-safe line in `width` cells, tag kept."""
    return fitted_title(one_line(title), width).plain
