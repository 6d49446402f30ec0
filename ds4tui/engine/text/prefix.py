"""How much of one text another reproduces: the length of their common prefix.

Shared by the chat's turn pipeline (how much of a live session a new prompt keeps) and the
chat templates' parse (how much of a transcript a reading renders again); both compare
whole transcripts, so it halves the range instead of walking characters.
"""

from __future__ import annotations


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
