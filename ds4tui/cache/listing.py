"""Which cache files a directory holds, decoded and scored: what every other part of the store reads.

Owns: `CacheDirectory`, one directory of `<sha1>.kv` files with its policy, byte
budget and clock; a SHA's path, the cache-file names in the directory, every file
decoded (`scan`, repairing the header bytes a ds4 hit zeroed) and scored
(`entries`, `score`), and the bytes held by saves in progress.
Leaves to the modules beside it (which take a `CacheDirectory`) the prompt lookup
(lookup.py), loading (loading.py), saving and eviction (saving.py) and changes to
existing files (edits.py); `KvStore` (store.py) puts them together.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from ds4tui.cache import eviction, files
from ds4tui.cache.entry import ANY_DS4TUI, Acceptor, KvEntry, inspect_file
from ds4tui.cache.policy import DEFAULT_POLICY, MIB, CachePolicy
from ds4tui.cache.safe_open import CacheDirError, dir_problem
from ds4tui.format.kvc import kv_name, sha_from_name


class CacheDirectory:
    """One cache directory under a byte budget (default 4096 MiB)."""

    def __init__(self, directory: str | os.PathLike, policy: CachePolicy = DEFAULT_POLICY, *,
                 budget_mb: float | None = None, clock: Callable[[], float] = time.time):
        self.dir = Path(directory)
        self.policy = policy
        self.budget_bytes = int((budget_mb if budget_mb is not None else policy.budget_mb) * MIB)
        self._clock = clock

    def now(self) -> float:
        """The injected clock (Unix seconds): last_used, created_at and scores read it."""
        return self._clock()

    def path_for(self, sha: str) -> Path:
        return self.dir / kv_name(sha)

    def problem(self, *, write: bool = True) -> str | None:
        """Why this directory cannot be used (not a directory, unreadable, read-only), or None."""
        return dir_problem(self.dir, write=write)

    def dir_error(self, exc: OSError) -> CacheDirError:
        """A listing failure as CacheDirError with a one-line reason."""
        return CacheDirError(exc.errno, self.problem(write=False)
                             or f"cache directory {self.dir}: {exc.strerror or exc}")

    def shas(self) -> list[str]:
        """SHA of every cache file name in the directory (none if it does not exist).

        Raises CacheDirError, with a one-line reason, when the path is not a
        readable directory."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self.dir_error(exc) from None
        return sorted(s for s in map(sha_from_name, names) if s)

    def find(self, prefix: str) -> list[str]:
        prefix = prefix.lower()
        return [s for s in self.shas() if s.startswith(prefix)]

    def scan(self, *, deep: bool = False, acceptor: Acceptor | None = None, verify: bool = False) -> list[KvEntry]:
        """Every cache file, decoded (`verify`: checksums checked too). Files that vanish mid-scan are skipped."""
        entries = []
        shas = self.shas()
        files.remove_stale_tmp(self.dir, self.policy.stale_tmp_s)  # crashed writers' leftovers, at once
        for sha in shas:
            e = inspect_file(self.path_for(sha), acceptor=acceptor, deep=deep, verify=verify)
            if repaired(e, acceptor):
                e = inspect_file(self.path_for(sha), acceptor=acceptor, deep=deep, verify=verify)
            if e.error != "file not found":
                entries.append(e)
        return entries

    def entries(self, acceptor: Acceptor | None = ANY_DS4TUI, *, verify: bool = False) -> list[KvEntry]:
        """Every file fully inspected and scored: what `kv ls` and the cache browser show."""
        return self.score(self.scan(deep=True, acceptor=acceptor, verify=verify))

    def score(self, entries: list[KvEntry], incoming: eviction.Incoming | None = None) -> list[KvEntry]:
        """Fill in `superseded` and `score` (reads the texts of possible superseders)."""
        eviction.mark_superseded(entries, self.text_of, incoming)
        eviction.score_entries(entries, self.policy, self.now())
        return entries

    def text_of(self, e: KvEntry) -> bytes | None:
        """The stored text of a listed file (None when it cannot be read back)."""
        return files.read_text(e.path, e.header.text_bytes)

    def temp_bytes(self) -> int:
        """Bytes held by temp files of saves in progress (this process's and others')."""
        return sum(t.bytes for t in files.temp_files(self.dir))


def repaired(e: KvEntry, acceptor: Acceptor | None) -> bool:
    """Repair one of this model's files whose header bytes 7/20 a ds4 hit zeroed (see
    files.repair_zeroed_header); only an acceptor that knows its model's fingerprint can."""
    h = e.header
    if acceptor is None or acceptor.fingerprint is None or acceptor.model_id is None or h is None:
        return False
    if h.model_id != 0 or h.payload_abi != 0 or not e.not_loadable:
        return False
    return files.repair_zeroed_header(Path(e.path), model_id=acceptor.model_id,
                                      payload_abi=acceptor.payload_abi, fingerprint=acceptor.fingerprint)
