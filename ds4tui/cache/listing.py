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

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ds4tui.cache import eviction, files
from ds4tui.cache.entry import ANY_DS4TUI, Acceptor, KvEntry, entry_from_record, entry_record, inspect_file
from ds4tui.cache.index import FileRecord, HeaderIndex
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
        self.index = HeaderIndex(self.dir)
        self._records: dict[str, FileRecord] = {}  # path -> the index's record, as of the last scan
        self._relations_memo: tuple | None = None  # (entries list, its length, relations)

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
        """Every cache file, decoded (`verify`: checksums checked too). Files that vanish mid-scan are skipped.

        A file whose version (inode, size, mtime) the header index holds is not opened: its
        entry, raw header and text come from there (index.py); the others are read whole
        (`deep` or not) and indexed. `verify` reads every file."""
        found = self.stat_keys()
        files.remove_stale_tmp(self.dir, self.policy.stale_tmp_s)  # crashed writers' leftovers, at once
        # No text is loaded with the rows: the relations come from the index too (relations),
        # and a text is fetched only where something asks for it (text_of, indexed_texts).
        records = self.index.load(with_text=False) if not verify else {}
        fresh: dict[str, FileRecord] = {}
        entries, self._records = [], {}
        read_at = time.time()
        base = str(self.dir)
        for name in sorted(found):
            path = os.path.join(base, name)
            rec = records.get(name)
            e = None
            if rec is not None and rec.fresh_for(found[name]):
                e = entry_from_record(path, rec.head, rec.entry, acceptor, rec.extra)
            if e is None:
                keep: dict = {}
                e = inspect_file(path, acceptor=None, deep=True, verify=verify, keep=keep)
                if e.error == "file not found":
                    continue
                rec = None
                if e.regular and e.stat_key is not None and "head" in keep:
                    text = keep.get("text")
                    core, extra = entry_record(e)
                    rec = FileRecord(e.stat_key, keep["head"], core, text, keep.get("fingerprint"), read_at,
                                     hashlib.sha1(text).hexdigest() if text is not None else None, json.dumps(extra))
                    if not verify:  # a verified verdict is not what a plain listing says ("unchecked")
                        fresh[name] = rec
                    e = entry_from_record(path, rec.head, rec.entry, acceptor, rec.extra) or e
                elif acceptor is not None:
                    e = inspect_file(path, acceptor=acceptor, deep=True, verify=verify)
            if repaired(e, acceptor):
                e = inspect_file(path, acceptor=acceptor, deep=True, verify=verify)
                rec = None
            if rec is not None:
                self._records[e.path] = rec
            entries.append(e)
        if fresh or records.keys() - found.keys():
            self.index.store(fresh, keep=set(found))
        for rec in fresh.values():
            rec.text = None  # in the index now; not held in memory
        return entries

    def stat_keys(self) -> dict[str, files.StatKey]:
        """Every cache-file name in the directory with its (inode, size, mtime_ns): one scandir, no opens.

        Raises CacheDirError when the path is not a readable directory."""
        try:
            with os.scandir(self.dir) as it:
                found = {}
                for entry in it:
                    if sha_from_name(entry.name):
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        found[entry.name] = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise self.dir_error(exc) from None
        return found

    def indexed_text(self, path: str) -> bytes | None:
        """The text of the file at `path` as the last scan's index record holds it, or None."""
        return self.indexed_texts([path]).get(path)

    def chats_of(self, entries: list[KvEntry]) -> dict[str, tuple]:
        """path -> (sha, title, shared): the titled session each untitled file belongs to
        (scan.chat_of's rule), from the relations."""
        chats = self.relations(entries).get("chats", {})
        out = {}
        for e in entries:
            c = chats.get(e.path.rpartition("/")[2])
            if c is not None:
                out[e.path] = tuple(c)
        return out

    def verdict_store(self) -> "_PathVerdicts":
        """The index's checksum verdicts by path (scan.ChecksumIndex keeps them there)."""
        return _PathVerdicts(self)

    def record(self, path: str) -> FileRecord | None:
        """What the last scan knew of the file at `path` (raw header, text, fingerprint), if indexed."""
        return self._records.get(path)

    def entries(self, acceptor: Acceptor | None = ANY_DS4TUI, *, verify: bool = False) -> list[KvEntry]:
        """Every file fully inspected and scored: what `kv ls` and the cache browser show."""
        return self.score(self.scan(deep=True, acceptor=acceptor, verify=verify))

    def score(self, entries: list[KvEntry], incoming: eviction.Incoming | None = None) -> list[KvEntry]:
        """Fill in `superseded` and `score` (reads the texts of possible superseders)."""
        eviction.mark_superseded(entries, self.text_of, incoming, self.relations(entries))
        eviction.score_entries(entries, self.policy, self.now())
        return entries

    def relations(self, entries: list[KvEntry]) -> dict:
        """The prefix relations among `entries` (eviction.relations): the index's, when it holds
        them for this very set of files, else computed from the texts and kept there."""
        memo = self._relations_memo
        if memo is not None and memo[0] is entries and memo[1] == len(entries):
            return memo[2]  # the same listing asked again (its scores, then its names)
        key = eviction.relation_key(entries)
        known = self.index.relations(key)
        if known is not None:
            self._relations_memo = (entries, len(entries), known)
            return known
        held = self._fetch_texts(entries)
        try:
            usable = eviction.usable_for_relations(entries)
            known = eviction.relations(usable, {e.path: self.text_of(e) for e in usable})
        finally:
            for rec in held:
                rec.text = None  # a quick scan's texts are not kept in memory
        self.index.store_relations(key, known)
        self._relations_memo = (entries, len(entries), known)
        return known

    def indexed_texts(self, paths: list[str]) -> dict[str, bytes]:
        """path -> text for those of `paths` the last scan's index records hold (one query)."""
        want = {os.path.basename(p): rec.key for p in paths if (rec := self._records.get(p)) is not None}
        got = self.index.texts(want) if want else {}
        out = {p: got[os.path.basename(p)] for p in paths if os.path.basename(p) in got}
        for p in paths:
            rec = self._records.get(p)
            if p not in out and rec is not None and rec.text is not None:
                out[p] = rec.text
        return out

    def _fetch_texts(self, entries: list[KvEntry]) -> list[FileRecord]:
        """Give the indexed records of `entries` that lack their text (a quick scan's) the index's
        copy, in one query; the records filled."""
        want = {os.path.basename(e.path): rec.key for e in entries
                if (rec := self._records.get(e.path)) is not None and rec.text is None and e.stat_key == rec.key}
        if not want:
            return []
        got = self.index.texts(want)
        filled = []
        for e in entries:
            rec = self._records.get(e.path)
            name = os.path.basename(e.path)
            if rec is not None and rec.text is None and name in got:
                rec.text = got[name]
                filled.append(rec)
        return filled

    def text_of(self, e: KvEntry) -> bytes | None:
        """The stored text of a listed file (None when it cannot be read back): the index's
        copy when the last scan had the same version of the file."""
        rec = self._records.get(e.path)
        if rec is not None and e.stat_key == rec.key:
            text = rec.text if rec.text is not None else self.index.text(os.path.basename(e.path), rec.key)
            if text is not None and len(text) == e.header.text_bytes:
                return text
        return files.read_text(e.path, e.header.text_bytes)

    def temp_bytes(self) -> int:
        """Bytes held by temp files of saves in progress (this process's and others')."""
        return sum(t.bytes for t in files.temp_files(self.dir))

    def overhead_bytes(self) -> int:
        """What the budget holds besides the cache files: saves in progress and the header index."""
        return self.temp_bytes() + self.index.size_bytes()


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


class _PathVerdicts:
    """HeaderIndex's checksum verdicts keyed by path (the browser's keys), not by name."""

    def __init__(self, directory: CacheDirectory):
        self._d = directory

    def verdicts(self) -> dict:
        base = str(self._d.dir)
        return {os.path.join(base, name): v for name, v in self._d.index.verdicts().items()}

    def store_verdicts(self, verdicts: dict) -> None:
        self._d.index.store_verdicts({os.path.basename(p): v for p, v in verdicts.items()})
