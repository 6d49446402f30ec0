"""Choosing what to evict: scores for a directory's entries and the victim order.

Owns: which continued checkpoints are superseded (their text a strict prefix
of a newer file's text, or of the checkpoint about to be written), filling in
each entry's `ScoreParts`, and the greedy lowest-score-first victim list.
Leaves to store.py: scanning, deleting, and which file is protected.

Pinned files are never victims. Files whose header does not decode, or that
are proven corrupt, score 0 and go first: they occupy the budget and can never
be loaded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ds4tui.cache.entry import KvEntry
from ds4tui.format.kvc import REASON_CONTINUED
from ds4tui.cache.policy import CachePolicy, ScoreParts

_ZERO = ScoreParts(0.0, 1.0, 1.0, 0.0)


@dataclass(frozen=True)
class Incoming:
    """The checkpoint a save is about to write, as a possible superseder.

    Field names match `KvcHeader`, so `_covers` reads either.
    """

    text: bytes
    model_id: int
    payload_abi: int
    quant_bits: int
    ctx_size: int
    created_at: int

    @property
    def text_bytes(self) -> int:
        return len(self.text)


def _usable(e: KvEntry) -> bool:
    return e.header is not None and not e.corrupt


def _covers(f, e: KvEntry) -> bool:
    """Could `f` (a KvcHeader or an Incoming) supersede the continued entry `e`?"""
    h = e.header
    return (
        f.text_bytes > h.text_bytes
        and f.model_id == h.model_id
        and f.payload_abi == h.payload_abi
        and f.quant_bits == h.quant_bits
        # f dominates only if it is at least as widely reusable: a checkpoint
        # loads into a context at least as large as the one that wrote it.
        and f.ctx_size <= h.ctx_size
        and f.created_at >= h.created_at
    )


def mark_superseded(entries: list[KvEntry], read_text: Callable[[KvEntry], bytes | None],
                    incoming: Incoming | None = None) -> None:
    """Set `superseded` on continued entries strictly covered by a newer file.

    Only texts of possible superseders are read, each at most once.
    """
    waypoints = [e for e in entries if _usable(e) and e.header.reason_code == REASON_CONTINUED
                 and not e.header.titled and e.header.text_bytes > 0 and e.sha]
    if not waypoints:
        return
    texts: dict[str, bytes | None] = {}

    def text_of(f: KvEntry | Incoming) -> bytes | None:
        if isinstance(f, Incoming):
            return f.text
        if f.path not in texts:
            texts[f.path] = read_text(f)
        return texts[f.path]

    others: list[KvEntry | Incoming] = [f for f in entries if _usable(f) and not f.header.titled]
    if incoming is not None:
        others.append(incoming)
    for e in waypoints:
        for f in others:
            if f is e or not _covers(f if isinstance(f, Incoming) else f.header, e):
                continue
            text = text_of(f)
            if text is not None and hashlib.sha1(text[:e.header.text_bytes]).hexdigest() == e.sha:
                e.superseded = True
                break


def score_entries(entries: Iterable[KvEntry], policy: CachePolicy, now: float) -> None:
    for e in entries:
        if not _usable(e):
            e.score = _ZERO
            continue
        h = e.header
        e.score = policy.score(hits=h.hits, tokens=h.tokens, file_bytes=e.file_bytes,
                               last_used=h.last_used, created_at=h.created_at,
                               reason_code=h.reason_code, superseded=e.superseded, now=now)


def choose_victims(entries: list[KvEntry], target_bytes: int, protect: frozenset[str] = frozenset()) -> list[KvEntry]:
    """Lowest score first (ties: least recently used first) until the total fits `target_bytes`.

    Entries need `score` set. Pinned and protected files are never chosen, so
    the result may leave the total above target when they alone exceed it.
    """
    total = sum(e.file_bytes for e in entries)
    candidates = [e for e in entries if not e.pinned and (e.sha is None or e.sha not in protect)]

    def key(e: KvEntry):
        return (e.score.score if e.score else 0.0, e.header.last_used if e.header else 0)

    candidates.sort(key=key)
    victims = []
    for e in candidates:
        if total <= target_bytes:
            break
        victims.append(e)
        total -= e.file_bytes
    return victims
