"""Writing a checkpoint within the budget, and evicting to keep the directory under it.

Owns: `save` (the header a ds4tui file gets, skipping an identical untitled file
already on disk, the budget check beside pinned files and saves in progress,
evicting before the write so the directory stays under budget while the file
grows, the atomic write, settling the budget again after it) and `evict` /
`apply_eviction` (deleting the victims eviction.py chooses, or only listing them
for a dry run).
Leaves to files.py the bytes on disk (tmp + fsync + rename) and to eviction.py the
order in which files go.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ds4tui.cache import eviction, files
from ds4tui.cache.entry import Acceptor, KvEntry, inspect_file
from ds4tui.cache.events import Evicted, EvictedFile, Saved, SaveFailed
from ds4tui.cache.files import WritePayload
from ds4tui.cache.listing import CacheDirectory
from ds4tui.cache.safe_open import CacheDirError
from ds4tui.format.display import human_bytes
from ds4tui.format.payload import DS4_PAYLOAD_ABI
from ds4tui.format.kvc import (
    CHECKSUM_TRAILER_BYTES,
    EXT_CHECKSUM,
    EXT_PINNED,
    EXT_SESSION_TITLE,
    EXT_TOOL_MAP,
    EXT_TRAILERS,
    QUANT_DS4TUI_MARK,
    KvcHeader,
    reason_code,
    text_sha,
    title_sha,
    trailer_bytes,
)


@dataclass(frozen=True)
class SaveResult:
    """`event` is the Saved or the SaveFailed; `events` adds any eviction."""

    event: Saved | SaveFailed
    events: tuple

    @property
    def ok(self) -> bool:
        return isinstance(self.event, Saved)


def save(directory: CacheDirectory, text: bytes, *, tokens: int, reason: str, engine: Acceptor,
         payload_bytes: int, write_payload: WritePayload, title: bytes | None = None,
         created_at: int | None = None, tool_map=None, ext_flags: int = 0,
         pinned: bool = False, fresh: bool = False) -> SaveResult:
    """`KvStore.save`, with `text` and `title` already bytes (see there)."""
    d = directory
    if engine.model_id is None or engine.ctx_size is None:
        raise ValueError("save needs engine.model_id and engine.ctx_size")
    now = int(d.now())
    created = now if created_at is None else created_at
    sha = text_sha(text) if title is None else title_sha(title, created)
    tail = trailer_bytes(tool_map, title)
    flags = (ext_flags & ~(EXT_TRAILERS | EXT_PINNED)) | EXT_CHECKSUM
    flags |= (EXT_TOOL_MAP if tool_map is not None else 0) | (EXT_SESSION_TITLE if title is not None else 0)
    flags |= EXT_PINNED if pinned else 0
    header = _new_header(engine, reason, flags, tokens, created, now, payload_bytes, len(text))
    file_bytes = header.body_bytes + len(tail) + CHECKSUM_TRAILER_BYTES

    def failed(why: str, *extra) -> SaveResult:
        ev = SaveFailed(why, tokens, file_bytes)
        return SaveResult(ev, (*extra, ev))

    reused = _reusable(d, sha, header, text, engine)
    if reused is not None:
        return SaveResult(reused, (reused,))
    required = d.policy.required_bytes(file_bytes)
    try:
        entries = d.scan()
    except CacheDirError as exc:
        return failed(str(exc))
    # Re-saving a session (the same name) keeps what belongs to the file, not to this
    # state: its pin and its hit counter (each resume counted one). files.write_atomic
    # carries them over from the file it replaces, read under that file's lock.
    too_big = _does_not_fit(d, entries, sha, required, file_bytes)
    if too_big is not None:
        return failed(too_big)
    # Make room before writing (ds4 does the same), so the directory stays
    # under budget while the new file grows; the file being replaced is not counted.
    others = [e for e in entries if e.sha != sha]
    incoming = eviction.Incoming(text, engine.model_id, engine.payload_abi, header.quant_bits,
                                 engine.ctx_size, created)
    pre = apply_eviction(d, others, d.budget_bytes - file_bytes - d.overhead_bytes(), incoming=incoming)
    evicted: tuple[Evicted, ...] = (pre,) if pre.files else ()
    t0 = time.perf_counter()
    # A fresh titled save is named by its title and the creation time the write stamps.
    new_name = (lambda created_at: d.path_for(title_sha(title, created_at))) if fresh and title is not None else None
    try:
        final, created = files.write_atomic(d.path_for(sha), header, text, write_payload, tail,
                                            new_name=new_name)
    except Exception as exc:
        return failed(files.describe_failure(exc), *evicted)
    sha = final.name[:40]
    saved = Saved(sha=sha, path=str(d.path_for(sha)), reason=header.reason, tokens=tokens,
                  bytes=file_bytes, ms=(time.perf_counter() - t0) * 1000.0, created_at=created)
    # Another process may have saved meanwhile: settle the budget again,
    # never evicting what was just written.
    post = evict(d, protect=(sha,))
    if post.files:
        evicted += (post,)
    return SaveResult(saved, (*evicted, saved))


def _new_header(engine: Acceptor, reason: str, flags: int, tokens: int, created: int, now: int,
                payload_bytes: int, text_bytes: int) -> KvcHeader:
    # ds4tui's mark keeps ds4 away from its files; a file in ds4's own layout is meant for ds4
    mark = 0 if engine.payload_abi == DS4_PAYLOAD_ABI else QUANT_DS4TUI_MARK
    assert engine.model_id is not None and engine.ctx_size is not None  # save checked
    return KvcHeader(quant_bits=(engine.quant_bits or 0) | mark, reason_code=reason_code(reason),
                     ext_flags=flags, model_id=engine.model_id, tokens=tokens, hits=0,
                     ctx_size=engine.ctx_size, payload_abi=engine.payload_abi,
                     created_at=created, last_used=now, payload_bytes=payload_bytes,
                     text_bytes=text_bytes)


def _does_not_fit(d: CacheDirectory, entries, sha: str, required: int, file_bytes: int) -> str | None:
    """Why a file of `file_bytes` (`required` with the headroom) cannot be saved however much is
    evicted, or None. Pinned files stay, and so do the other saves in progress and the header
    index (they count as if pinned); the file being replaced (`sha`) does not count."""
    pinned_bytes = sum(e.file_bytes for e in entries if e.pinned and e.sha != sha) + d.overhead_bytes()
    if required + pinned_bytes <= d.budget_bytes:
        return None
    return (f"file of {human_bytes(file_bytes)} (+{d.policy.headroom_percent}% headroom)"
            f" does not fit the {human_bytes(d.budget_bytes)} budget"
            + (f" beside {human_bytes(pinned_bytes)} of pinned files" if pinned_bytes else ""))


def _reusable(d: CacheDirectory, sha: str, header: KvcHeader, text: bytes, engine: Acceptor) -> Saved | None:
    """An identical untitled checkpoint already on disk: skip rewriting gigabytes."""
    if header.titled:
        return None
    e = inspect_file(d.path_for(sha), acceptor=engine, deep=True, preview_bytes=0)
    h = e.header
    if not e.valid or h.tokens != header.tokens or h.text_bytes != len(text):
        return None
    if d.text_of(e) != text:
        return None
    return Saved(sha=sha, path=e.path, reason=h.reason, tokens=h.tokens, bytes=e.file_bytes,
                 ms=0.0, created_at=h.created_at, reused=True)


def evict(directory: CacheDirectory, *, budget_bytes: int | None = None, dry_run: bool = False,
          protect: tuple[str, ...] = ()) -> Evicted:
    """Delete the lowest-scoring files until the directory fits the budget."""
    d = directory
    budget = d.budget_bytes if budget_bytes is None else budget_bytes
    entries = d.scan()  # removes dead writers' temp files; live ones count toward the budget
    return apply_eviction(d, entries, budget - d.overhead_bytes(), frozenset(protect), dry_run=dry_run, budget=budget)


def apply_eviction(directory: CacheDirectory, entries: list[KvEntry], target: int,
                   protect: frozenset[str] = frozenset(), *, dry_run: bool = False, budget: int | None = None,
                   incoming: eviction.Incoming | None = None) -> Evicted:
    """Delete (or, `dry_run`, only list) the victims that bring `entries` down to `target` bytes.

    Each victim is removed under its header lock and only as the version scanned
    (files.remove_checked): one pinned, hit, or replaced by a newer save since the scan
    stays, and the next candidate is taken instead."""
    gone: list[EvictedFile] = []
    kept: set[str] = set()
    if sum(e.file_bytes for e in entries) > target:
        directory.score(entries, incoming)  # only now: scoring may read texts
    titles: dict[str, str | None] = {e.sha: e.title for e in entries if e.sha and e.title is not None}

    def title_of(sha: str | None) -> str | None:
        """A holder's title (a quick scan did not read it: one file read per holder)."""
        if sha is None:
            return None
        if sha not in titles:
            titles[sha] = inspect_file(directory.path_for(sha), acceptor=None, preview_bytes=0).title
        return titles[sha]
    while True:
        victims = eviction.choose_victims([e for e in entries if e.path not in kept], target, protect,
                                          total=sum(e.file_bytes for e in entries)
                                          - sum(f.bytes for f in gone))
        if not victims:
            break
        for e in victims:
            titled = bool(e.header and e.header.titled)
            own_title = title_of(e.sha) if titled else None  # read before the file goes
            if not dry_run:
                why = _remove(e)
                if why is not None and why != files.GONE:  # gone: someone else evicted it, the space is free
                    kept.add(e.path)
                    continue
            kept.add(e.path)
            h = e.header
            gone.append(EvictedFile(sha=e.sha or Path(e.path).name, reason=h.reason if h else "unknown",
                                    tokens=h.tokens if h else 0, hits=h.hits if h else 0,
                                    bytes=e.file_bytes, score=e.score.score if e.score else 0.0,
                                    titled=titled, title=own_title, held_by=e.held_by,
                                    held_by_title=title_of(e.held_by)))
    return Evicted(tuple(gone), sum(f.bytes for f in gone),
                   directory.budget_bytes if budget is None else budget, dry_run)


def _remove(e: KvEntry) -> str | None:
    """Remove one victim as scanned; why not, or None when it was removed."""
    try:
        return files.remove_checked(e.path, e.stat_key)
    except OSError:
        return "cannot remove"
