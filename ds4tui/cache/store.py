"""The disk cache directory: scan, lookup, load, save, touch, pin, delete, evict.

`KvStore` is the one object the rest of ds4tui holds: a `CacheDirectory` (listing.py:
the directory, its policy, budget and clock, listing and scoring its files) plus these
operations, each delegated to the module whose one job it is:

    lookup.py   which files' text prefixes a prompt (a stat-keyed header memo, titled text SHAs)
    loading.py  the load validation chain (docs/format.md, "Loading, saving, evicting")
    saving.py   atomic saves within the budget, and eviction
    edits.py    hit counts, pins, deletes and retitles of existing files

Leaves to callers: the payload (opaque, streamed through `write_payload(fp)` /
`load_payload(fp, nbytes)` callbacks), when to save (policy.py helps) and how
to show the returned events. Text and titles may be given as str (UTF-8) or bytes.

Rules that keep a shared directory consistent, even with another process (or
ds4 itself) saving and evicting in it at the same time:
- only `<40 hex>.kv` names are cache files; `*.tmp.*` and the rest are ignored;
- a save writes `<sha>.kv.tmp.<pid>.<rand>`, fsyncs it and renames it into place,
  so a reader sees either no file or a whole one;
- a file may vanish between scan and open: FileNotFoundError is a skip, not damage;
- only a file proven corrupt (truncated, hash or token-count mismatch) is
  deleted, and only if the name still points at the file that was read;
  a file that is intact but not loadable here (ds4's ABI, another model) is left alone;
- in-place writes touch only hits/last_used (on a hit) and ext_flags bit 7 (pin);
- every step that changes or removes an existing file holds its `flock` and re-checks,
  under it, that the name still points at that file; an eviction also that it is the
  version scanned and not pinned (files.locked, files.remove_checked).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ds4tui.cache import edits, loading, saving
from ds4tui.cache.entry import Acceptor, KvEntry
from ds4tui.cache.events import Evicted
from ds4tui.cache.files import WritePayload
from ds4tui.cache.listing import CacheDirectory
from ds4tui.cache.loading import LoadPayload, LoadResult
from ds4tui.cache.lookup import PrefixLookup
from ds4tui.cache.policy import DEFAULT_POLICY, CachePolicy
from ds4tui.cache.safe_open import CacheDirError
from ds4tui.cache.saving import SaveResult

__all__ = ["KvStore", "LoadPayload", "LoadResult", "SaveResult"]


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)


class KvStore(CacheDirectory):
    """One cache directory under a byte budget (default 4096 MiB)."""

    def __init__(self, directory: str | os.PathLike, policy: CachePolicy = DEFAULT_POLICY, *,
                 budget_mb: float | None = None, clock: Callable[[], float] = time.time):
        super().__init__(directory, policy, budget_mb=budget_mb, clock=clock)
        self._lookup = PrefixLookup(self)

    # -- reading (listing, scan, entries, score: CacheDirectory) ------------------------

    def lookup(self, prompt: str | bytes, acceptor: Acceptor) -> list[KvEntry]:
        """Candidates whose text is a byte prefix of `prompt`, longest first (lookup.py).

        A titled session counts by its text, so a chat's titled file is also the disk hit
        for any prompt extending it. Files the acceptor refuses are skipped."""
        return self._lookup.candidates(_as_bytes(prompt), acceptor)

    def prime_lookup(self, acceptor: Acceptor) -> None:
        """Read what the first lookup would (headers, titled texts) ahead of it: PrefixLookup.prime."""
        try:
            self._lookup.prime(acceptor)
        except CacheDirError:
            pass  # the lookup itself reports it

    def load(self, prompt: str | bytes, acceptor: Acceptor, load_payload: LoadPayload) -> LoadResult:
        """Restore the longest cached prefix of `prompt`; try shorter ones if it is rejected."""
        prompt = _as_bytes(prompt)
        try:
            candidates = self.lookup(prompt, acceptor)
        except CacheDirError as exc:
            return loading.missed(str(exc))
        return loading.load_first(self, candidates, prompt, acceptor, load_payload)

    def load_file(self, sha: str, acceptor: Acceptor, load_payload: LoadPayload,
                  prompt: str | bytes | None = None) -> LoadResult:
        """Restore one named file (a titled session); with `prompt`, its text must prefix it."""
        prompt_b = None if prompt is None else _as_bytes(prompt)
        return loading.load_named(self, sha, prompt_b, acceptor, load_payload)

    # -- changing existing files ------------------------------------------------------

    def touch(self, sha: str) -> bool:
        """Count a hit: hits+1 and last_used=now, in place."""
        return edits.touch(self, sha)

    def set_pinned(self, sha: str, pinned: bool) -> bool:
        """Pin (never evicted) or unpin: ext_flags bit 7, in place."""
        return edits.set_pinned(self, sha, pinned)

    def delete(self, sha: str) -> bool:
        """Remove one name (a symlink itself, never its target); False when already gone.

        Raises OSError for what cannot be removed (a directory under that name, a read-only directory)."""
        return edits.delete(self, sha)

    def rename_title(self, sha: str, title: str | bytes) -> str:
        """Retitle a titled session; returns its new SHA, SHA-1(new title || created_at).

        A titled file's name is derived from its title, so renaming writes a
        copy under the new name (tmp + atomic rename, like a save; header,
        text, payload and tool map unchanged, the title trailer replaced) and
        only then removes the old file: at every moment at least one whole
        copy exists. The copy is transient, so the budget is not consulted.
        Raises ValueError (not titled, undecodable, new name taken) or OSError.
        """
        return edits.rename_title(self, sha, _as_bytes(title))

    # -- saving and evicting ----------------------------------------------------------

    def save(self, text: str | bytes, *, tokens: int, reason: str, engine: Acceptor,
             payload_bytes: int, write_payload: WritePayload, title: str | bytes | None = None,
             created_at: int | None = None, tool_map=None, ext_flags: int = 0,
             pinned: bool = False, fresh: bool = False) -> SaveResult:
        """Write a checkpoint of `tokens` tokens whose rendered text is `text`.

        `engine` names the writer (model_id, payload_abi, ctx_size, quant_bits).
        `write_payload(fp)` must write exactly `payload_bytes`. A titled session
        is named SHA-1(title || created_at): pass the same `created_at` to
        re-save it under the same name. `fresh` (a titled session's first save,
        or one under a new title): never replace an existing file; when the name
        is taken (another session with the same title created in the same second,
        in this process or another) created_at is bumped by a second until the
        name is free, and the Saved event carries the created_at used. Never
        raises for I/O or callback failures: they come back as a SaveFailed and
        leave no trace on disk.
        """
        return saving.save(self, _as_bytes(text), tokens=tokens, reason=reason, engine=engine,
                           payload_bytes=payload_bytes, write_payload=write_payload,
                           title=None if title is None else _as_bytes(title), created_at=created_at,
                           tool_map=tool_map, ext_flags=ext_flags, pinned=pinned, fresh=fresh)

    def evict(self, *, budget_bytes: int | None = None, dry_run: bool = False,
              protect: tuple[str, ...] = ()) -> Evicted:
        """Delete the lowest-scoring files until the directory fits the budget."""
        return saving.evict(self, budget_bytes=budget_bytes, dry_run=dry_run, protect=protect)
