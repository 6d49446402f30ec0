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

# A short trailing tag in parentheses: " (fork)", " (fork 12)".
_TAG = re.compile(r" \([^()]{1,12}\)$")
MIN_BODY = 4  # cells of the title body kept before the tag (else the tag goes too)


def split_tag(title: str) -> tuple[str, str]:
    """`("Trip to Lisbon", " (fork 2)")`, or `(title, "")` when it ends with no short tag."""
    match = _TAG.search(title)
    if match is None or match.start() == 0:
        return title, ""
    return title[: match.start()], match.group()


def fitted_title(title: str, width: int, style: str = "") -> Text:
    """`title` in at most `width` cells: the body cut with "…" before a kept trailing tag."""
    text = Text(title, style=style, no_wrap=True, overflow="ellipsis")
    if text.cell_len <= width:
        return text
    body, tag = split_tag(title)
    if not tag or width - cell_len(tag) < MIN_BODY:
        text.truncate(width, overflow="ellipsis")
        return text
    out = Text(body, style=style, no_wrap=True, overflow="ellipsis")
    out.truncate(width - cell_len(tag), overflow="ellipsis")
    out.append(tag)
    return out
