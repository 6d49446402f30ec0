"""Choosing what to evict: scores for a directory's entries and the victim order.

Owns: which continued checkpoints are superseded (their text a strict prefix
of a newer file's text, or of the checkpoint about to be written), which
anonymous files a user's titled session already holds, filling in each
entry's `ScoreParts`, the greedy lowest-score-first victim list, and
`EvictionPlan` (the dry run the cache browser shows, from that same victim choice).
Leaves to the store: scanning (listing.py), deleting and which file is protected (saving.py).

Where ds4tui departs from ds4's score, whose code has neither an anchor weight nor a
superseded factor (README, "Loading, saving, evicting"): cold/evict/shutdown files count
as anchors (2x), and so does a titled session, the user's own; an anonymous file whose
text a titled session of the same model also holds (equal text: a duplicate; a shorter prefix: superseded) never outranks
that session: a duplicate scores 0 and goes first, a prefix scores at most
half the session's score.

Pinned files are never victims. Files whose header does not decode, or that
are proven corrupt, score 0 and go first: they occupy the budget and can never
be loaded.
"""

from __future__ import annotations

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


def mark_superseded(entries: list[KvEntry], read_text: Callable[[KvEntry], bytes | None],
                    incoming: Incoming | None = None) -> None:
    """Set `superseded` on continued entries strictly covered by a newer file, and
    `held_by`/`duplicate` on anonymous entries a titled session holds.

    Texts are read only when there is something to decide (a titled session beside
    anonymous files, or a continued checkpoint), each once; the relations come from one
    sort of them (prefixes.PrefixTree), not from comparing every pair.
    """
    usable = [e for e in entries if _usable(e) and e.sha and e.header.text_bytes > 0]
    waypoints = [e for e in usable if e.header.reason_code == REASON_CONTINUED and not e.header.titled]
    has_titled = any(e.header.titled for e in usable)
    if not waypoints and not (has_titled and any(not e.header.titled for e in usable)):
        return
    tree = PrefixTree({id(e): read_text(e) for e in usable})
    by_id = {id(e): e for e in usable}
    _mark_held_by_titled(usable, tree, by_id)
    for e in waypoints:
        for k in tree.extensions(id(e)):
            f = by_id[k]
            if not f.header.titled and _covers(f.header, e):
                e.superseded = True
                break
        else:
            text = tree.text(id(e))
            if (incoming is not None and text is not None and _covers(incoming, e)
                    and incoming.text.startswith(text)):
                e.superseded = True


def _mark_held_by_titled(usable: list[KvEntry], tree: PrefixTree, by_id: dict[int, KvEntry]) -> None:
    """Anonymous entries whose text a titled session of the same model starts with: the one
    whose text equals it when there is one (a duplicate), else the last such session listed."""
    order = {id(e): i for i, e in enumerate(usable)}
    for e in usable:
        h = e.header
        if h.titled:
            continue
        same = [by_id[k] for k in tree.same(id(e)) if by_id[k].header.titled and _same_model(by_id[k].header, h)]
        if same:
            holder = min(same, key=lambda f: order[id(f)])
            e.held_by, e.duplicate, e.superseded = holder.sha, True, True
            continue
        longer = [by_id[k] for k in tree.extensions(id(e)) if by_id[k].header.titled
                  and _same_model(by_id[k].header, h)]
        if longer:
            holder = max(longer, key=lambda f: order[id(f)])
            e.held_by, e.duplicate, e.superseded = holder.sha, False, True


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
    def build(cls, entries: list[KvEntry], budget_bytes: int) -> EvictionPlan:
        """`entries` must be scored (KvStore.scan). Uses the store's victim choice:
        a target of 0 bytes ranks everything that is not pinned."""
        order = choose_victims(entries, 0)
        now = choose_victims(entries, budget_bytes)
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
