"""Which titled sessions a `--resume` query names: one rule for the CLI check and the controller.

Owns: the order of the tests, most exact first, so a query that names one
session exactly is never ambiguous with others that merely start like it:
a file-name (SHA) prefix when the query is hex, else the exact title, else the
title ignoring case, else the titles that start with the query (ignoring case
and runs of whitespace). Pure Python: the CLI calls it before loading anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
_HEX = set("0123456789abcdefABCDEF")


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def match_sessions(query: str, sessions: Sequence[T], sha_of: Callable[[T], str],
                   title_of: Callable[[T], str]) -> list[T]:
    """The sessions `query` names under the first test that matches any (see the module doc)."""
    q = query.strip()
    if not q:
        return []
    if all(c in _HEX for c in q):
        by_sha = [s for s in sessions if sha_of(s).startswith(q.lower())]
        if by_sha:
            return by_sha
    for test in (lambda t: t == q, lambda t: t.casefold() == q.casefold(),
                 lambda t: _norm(t).startswith(_norm(q))):
        found = [s for s in sessions if test(title_of(s))]
        if found:
            return found
    return []
