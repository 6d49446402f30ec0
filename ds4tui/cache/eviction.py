"""Choosing what to evict: scores for a directory's entries and the victim order.

Owns: which continued checkpoints are superseded (their text a strict prefix
of a newer file's text, or of the checkpoint about to be written), which
anonymous files a user's titled session already holds, filling in each
entry's `ScoreParts`, the greedy lowest-score-first victim list, and
`EvictionPlan` (the dry run the cache browser shows, from that same victim choice).
Leaves to the store: scanning (listing.py), deleting and which file is protected (saving.py).

Where ds4tui departs from ds4's score, whose code has neither an anchor weight nor a
superseded factor (docs/format.md, "Loading, saving, evicting"): cold/evict/shutdown files count
as anchors (2x), and so does a titled session, the user's own; an anonymous file whose
text a titled session of the same model also holds (equal text: a duplicate; a shorter prefix: superseded) never outranks
that session: a duplicate scores 0 and goes first, a prefix scores at most
half the session's score.

Pinned files are never victims. Files whose header does not decode, or that
are proven corrupt, score 0 and go first: they occupy the budget and can never
be loaded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ds4tui.cache.entry import KvEntry
from ds4tui.format.kvc import REASON_CONTINUED
from ds4tui.cache.policy import CachePolicy, ScoreParts
from ds4tui.cache.prefixes import PrefixTree
from ds4tui.format.display import human_bytes

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
        and f.quant_bits & 0x7F == h.quant_bits & 0x7F  # with or without ds4tui's mark
        # f dominates only if it is at least as widely reusable: a checkpoint
        # loads into a context at least as large as the one that wrote it.
        and f.ctx_size <= h.ctx_size
        and f.created_at >= h.created_at
    )


def _same_model(f, h) -> bool:
    return (f.model_id == h.model_id and f.payload_abi == h.payload_abi and f.quant_bits == h.quant_bits
            and f.ctx_size <= h.ctx_size)


def relation_key(entries: list[KvEntry]) -> str:
    """What the prefix relations of `entries` depend on: each file's name, inode, size and the
    header fields the relations read. Hits, last_used and pins (rewritten in place) are not in
    it, so a hit does not make the index's relations stale; a new save or a repair does."""
    parts = []
    for e in usable_for_relations(entries):
        x, k = e.header, e.stat_key or (0, 0)
        parts.append(f"{e.path.rpartition('/')[2]}:{k[0]}:{k[1]}:{x.text_bytes}:{x.model_id}:{x.payload_abi}:"
                     f"{x.quant_bits}:{x.ctx_size}:{x.created_at}:{x.reason_code}:{x.ext_flags & 0x7F}")
    parts.sort()
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()


def usable_for_relations(entries: list[KvEntry]) -> list[KvEntry]:
    return [e for e in entries if _usable(e) and e.sha and e.header.text_bytes > 0]


def relations(entries: list[KvEntry], texts: dict[str, bytes | None]) -> dict:
    """The prefix relations among `entries` (`texts`: path -> text), by file name, as plain data
    (the header index keeps them, index.py): "held" name -> [holder sha, duplicate], for an
    anonymous file a titled session of the same model holds; "superseded" names of continued
    checkpoints a newer untitled file strictly covers; "chats" name -> [sha, title, shared], the
    titled session an untitled file belongs to (scan.chat_of's rule). One sort of the texts
    (prefixes.PrefixTree), not every pair."""
    usable = usable_for_relations(entries)
    tree = PrefixTree({e.path: texts.get(e.path) for e in usable})
    by_path = {e.path: e for e in usable}
    order = {e.path: i for i, e in enumerate(usable)}
    held: dict[str, list] = {}
    superseded: list[str] = []
    chats: dict[str, list] = {}  # name -> [sha, title, how many sessions share it]
    for e in usable:
        h, name = e.header, e.path.rpartition("/")[2]
        if h.titled:
            continue
        same = [by_path[k] for k in tree.same(e.path) if k != e.path]
        longer = [by_path[k] for k in tree.extensions(e.path)]
        holders = [f for f in same if f.header.titled and _same_model(f.header, h)]
        if holders:
            held[name] = [min(holders, key=lambda f: order[f.path]).sha, True]
        else:
            holders = [f for f in longer if f.header.titled and _same_model(f.header, h)]
            if holders:
                held[name] = [max(holders, key=lambda f: order[f.path]).sha, False]
        if h.reason_code == REASON_CONTINUED and any(not f.header.titled and _covers(f.header, e) for f in longer):
            superseded.append(name)
        # The chat it belongs to: the session (same model id) it starts or equals, else the
        # longest one it extends; a start of several sessions is shared by them.
        mine = [f for f in same + longer if f.header.titled and f.header.model_id == h.model_id]
        if len(mine) > 1:
            chats[name] = [None, None, len(mine)]
        elif mine:
            chats[name] = [mine[0].sha, mine[0].title, 0]
        else:
            extends = [by_path[k] for k in tree.prefixes(e.path)
                       if by_path[k].header.titled and by_path[k].header.model_id == h.model_id]
            if extends:
                owner = max(extends, key=lambda t: t.header.text_bytes)
                chats[name] = [owner.sha, owner.title, 0]
    return {"held": held, "superseded": superseded, "chats": chats}


def mark_superseded(entries: list[KvEntry], read_text: Callable[[KvEntry], bytes | None],
                    incoming: Incoming | None = None, known: dict | None = None) -> None:
    """Set `superseded` on continued entries strictly covered by a newer file, and
    `held_by`/`duplicate` on anonymous entries a titled session holds.

    `known`: their `relations` already computed (the header index's); else every usable
    file's text is read once to compute them. With `incoming` (a save about to be written)
    only the texts of continued checkpoints it could cover are read besides.
    """
    usable = usable_for_relations(entries)
    if known is None:
        known = relations(usable, {e.path: read_text(e) for e in usable})
    superseded = set(known.get("superseded", ()))
    held = known.get("held", {})
    for e in usable:
        name = e.path.rpartition("/")[2]
        if name in held:
            e.held_by, e.duplicate = held[name][0], bool(held[name][1])
            e.superseded = True
        if name in superseded:
            e.superseded = True
        if (incoming is not None and not e.superseded and not e.header.titled
                and e.header.reason_code == REASON_CONTINUED and _covers(incoming, e)):
            text = read_text(e)
            if text is not None and incoming.text.startswith(text):
                e.superseded = True


def score_entries(entries: Iterable[KvEntry], policy: CachePolicy, now: float) -> None:
    entries = list(entries)
    for e in entries:
        if not _usable(e):
            e.score = _ZERO
            continue
        h = e.header
        e.score = policy.score(hits=h.hits, tokens=h.tokens, file_bytes=e.file_bytes,
                               last_used=h.last_used, created_at=h.created_at,
                               reason_code=h.reason_code, superseded=e.superseded, now=now,
                               titled=h.titled)
    by_sha = {e.sha: e for e in entries if e.sha}
    for e in entries:
        holder = by_sha.get(e.held_by) if e.held_by else None
        if holder is None or holder.score is None or e.score is None:
            continue
        cap = 0.0 if e.duplicate else holder.score.score * policy.superseded_max_factor
        if e.score.score > cap:
            factor = 0.0 if e.duplicate else e.score.superseded_factor * cap / e.score.score
            e.score = replace(e.score, superseded_factor=factor, score=cap)


def choose_victims(entries: list[KvEntry], target_bytes: int, protect: frozenset[str] = frozenset(), *,
                   total: int | None = None) -> list[KvEntry]:
    """Lowest score first (ties: least recently used first) until the total fits `target_bytes`.

    `total`: the directory's bytes when `entries` leaves some out (files kept back by an
    eviction pass still hold their space); the sum of `entries` by default.

    Entries need `score` set. Pinned and protected files, and names that are not
    regular files (a FIFO, a directory, a symlink: never ours to delete), are never chosen, so
    the result may leave the total above target when they alone exceed it.
    """
    if total is None:
        total = sum(e.file_bytes for e in entries)
    candidates = [e for e in entries if e.regular and not e.pinned and (e.sha is None or e.sha not in protect)]

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


@dataclass(frozen=True)
class EvictionPlan:
    """`order`: every evictable file, first victim first; `now`: the paths a budget pass removes today."""

    order: tuple[KvEntry, ...]
    now: frozenset[str]
    used_bytes: int
    budget_bytes: int
    pinned_count: int

    @classmethod
    def build(cls, entries: list[KvEntry], budget_bytes: int, overhead_bytes: int = 0) -> EvictionPlan:
        """`entries` must be scored (KvStore.scan). Uses the store's victim choice:
        a target of 0 bytes ranks everything that is not pinned. `overhead_bytes`: what the
        budget holds besides the files (KvStore.overhead_bytes: saves in progress, the index),
        as a budget pass counts it."""
        order = choose_victims(entries, 0)
        now = choose_victims(entries, budget_bytes - overhead_bytes)
        return cls(tuple(order), frozenset(e.path for e in now), sum(e.file_bytes for e in entries),
                   budget_bytes, sum(1 for e in entries if e.pinned))

    def summary(self) -> str:
        if self.now:
            freed = sum(e.file_bytes for e in self.order if e.path in self.now)
            return (f"Over budget: the next save or `ds4tui kv evict` removes {len(self.now)} file(s),"
                    f" {human_bytes(freed)}.")
        if not self.order:
            return "Nothing can be evicted (no files, or all pinned)."
        return "Under budget: nothing is evicted now. When space is needed, files go in this order."
