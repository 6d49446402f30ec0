"""Finding the cached files whose text is a byte prefix of a prompt, longest first.

Owns: `PrefixLookup`, the per-message lookup and the two memos that keep it to one
stat per file: each file's decoded header keyed by (inode, size, mtime_ns), and a
titled file's text SHA-1 under the same key (a titled session is named by its title,
so what it holds must be hashed from its text, once per file version). A file the memo
does not know is taken from the header index (index.py) when it holds that version, so
the first message after a start opens no file that has not changed, and a file whose indexed
text length and SHA-1 (from the row for the version the stat sees) rule it out is never built
into an entry at all (a chat's first message at 10,000 files, docs/perf.md).
Leaves to loading.py checking and restoring the file it picks (which re-reads the
header, so a stale memo can cost a hit, never load a wrong file).
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

from ds4tui.cache import files
from ds4tui.cache.entry import Acceptor, KvEntry, entry_from_record, inspect_file
from ds4tui.cache.index import RACY_S
from ds4tui.cache.listing import CacheDirectory, repaired
from ds4tui.format.kvc import PREFIX_BYTES, sha_from_name

StatKey = tuple[int, int, int]  # (inode, size, mtime_ns): a file version


class PrefixLookup:
    """The lookup over one `CacheDirectory`, with its header and text-SHA memos."""

    def __init__(self, directory: CacheDirectory):
        self.directory = directory
        self._text_shas: dict[str, tuple[StatKey, str | None]] = {}  # name -> (stat key, sha)
        # The lookup's view of each file: name -> (stat key, acceptor, entry).
        self._headers: dict[str, tuple[StatKey, Acceptor, KvEntry]] = {}
        # name -> (stat key, text length, SHA-1s its text may be named by), from the index
        # row of that version: enough to rule a file out of a lookup without building it.
        self._ruled: dict[str, tuple[StatKey, int, frozenset]] = {}

    def candidates(self, prompt: bytes, acceptor: Acceptor) -> list[KvEntry]:
        """Candidates whose text is a byte prefix of `prompt`, longest first.

        An anonymous file is named by the SHA-1 of its text; a titled session by its
        title, so its text hash comes from `_text_sha` (read once per file version).
        That way a chat's titled file is also the disk hit for any prompt extending
        it, and quitting need not write an anonymous copy of the same state.
        Files the acceptor refuses are skipped.
        """
        entries = [e for e in self._entries(acceptor, prompt)
                   if e.valid and e.header.text_bytes <= len(prompt)]
        # One incremental SHA-1 over the prompt, shortest candidate first.
        entries.sort(key=lambda e: e.header.text_bytes)
        h, fed, found = hashlib.sha1(), 0, []
        for e in entries:
            n = e.header.text_bytes
            h.update(prompt[fed:n])
            fed = n
            if h.copy().hexdigest() == (self._text_sha(e) if e.header.titled else e.sha):
                found.append(e)
        found.sort(key=lambda e: (e.header.text_bytes, e.header.tokens), reverse=True)
        return found

    def prime(self, acceptor: Acceptor) -> int:
        """Fill both memos now (every header, every titled file's text SHA-1), so that the
        first message's lookup is as quick as the later ones (~1.4 ms less on a hit after a
        start, docs/perf-archive.md). The files read: how many titled texts were hashed."""
        hashed = 0
        for e in self._entries(acceptor):
            if e.valid and e.header.titled:
                self._text_sha(e)
                hashed += 1
        return hashed

    def _text_sha(self, e: KvEntry) -> str | None:
        """SHA-1 of a file's stored text, memoized per file version (the stat key the
        lookup's listing already took): the index of titled sessions by what they hold."""
        name = Path(e.path).name
        listed = self._headers.get(name)
        if listed is None:
            return None
        key = listed[0]
        memo = self._text_shas.get(name)
        if memo is not None and memo[0] == key:
            return memo[1]
        text = self.directory.text_of(e)
        sha = hashlib.sha1(text).hexdigest() if text is not None else None
        self._text_shas[name] = (key, sha)
        return sha

    def _ruled_out(self, prompt: bytes, found: dict[str, StatKey], skip) -> set[str]:
        """The names of `found` (but not those `skip(name, key)` keeps) whose index row for
        exactly that version shows the file cannot be a prefix of `prompt`: a text longer than
        it, or a text SHA-1 that the prompt's prefix of that length does not have. Such a file
        would be built only to be dropped: at 10,000 files building every entry was most of a
        lookup. Files whose header a ds4 hit zeroed (bytes 7/20) are never ruled out, so they
        are still repaired; a row the index cannot vouch for (stale, racy, short) rules
        nothing out, and neither does a titled file whose row lacks its text SHA-1."""
        rows: dict | None = None
        facts: list[tuple[int, str, frozenset]] = []
        for name, key in found.items():
            if skip(name, key):
                continue
            known = self._ruled.get(name)
            if known is None or known[0] != key:
                self._ruled.pop(name, None)
                if rows is None:
                    rows = self.directory.index.prefix_rows()
                row = rows.get(name)
                if row is None or tuple(row[0]) != tuple(key) or row[1] - key[2] / 1e9 < RACY_S:
                    continue
                head, text_sha = row[2], row[3]
                if len(head) < PREFIX_BYTES or head[7] == 0 or head[20] == 0:
                    continue
                shas = frozenset(s for s in (sha_from_name(name), text_sha) if s)
                if not shas:
                    continue
                known = (key, struct.unpack_from("<I", head, PREFIX_BYTES - 4)[0], shas)
                self._ruled[name] = known
            facts.append((known[1], name, known[2]))
        facts.sort()
        out: set[str] = set()
        h, fed, sha = hashlib.sha1(), -1, ""
        for n, name, shas in facts:
            if n > len(prompt):
                out.add(name)
                continue
            if n != fed:  # one incremental SHA-1 over the prompt, shortest first
                h.update(prompt[max(fed, 0):n])
                fed, sha = n, h.copy().hexdigest()
            if sha not in shas:
                out.add(name)
        return out

    def _entries(self, acceptor: Acceptor, prompt: bytes | None = None) -> list[KvEntry]:
        """What `scan(acceptor=...)` returns, re-reading a file's header only when its inode,
        size or mtime changed since the last lookup: one stat per file per message instead
        of an open and a read (a lookup in 300 files: 6.3 ms -> ~1 ms, docs/perf-archive.md).

        A header written in place within the filesystem's timestamp tick may go unseen until
        the next change; the load re-reads and checks the header of the file it picks, so a
        stale view can cost a hit, never load a wrong file.

        Long because the index rows' ruling-out (text length and SHA-1 before any entry is
        built) and the per-file-version memo share the stat results, file by file, in one pass."""
        d = self.directory
        found = self._stat_keys()
        files.remove_stale_tmp(d.dir, d.policy.stale_tmp_s)
        memo, self._headers = self._headers, {}
        entries = []
        indexed: dict | None = None  # the header index, read (without texts) at the first miss
        base = str(d.dir)
        ruled_out: set[str] = set()
        if prompt is not None:
            def memoized(name: str, key: StatKey) -> bool:
                old = memo.get(name)
                return old is not None and old[0] == key and old[1] == acceptor
            ruled_out = self._ruled_out(prompt, found, memoized)
        # The index rows (without texts) of the files to build, read at the first miss.
        to_build = [name for name in found if name not in ruled_out
                    and not (memo.get(name) is not None and memo[name][0] == found[name] and memo[name][1] == acceptor)]
        for name in sorted(found):
            key = found[name]
            old = memo.get(name)
            if old is not None and old[0] == key and old[1] == acceptor:
                e = old[2]
                self._headers[name] = (key, acceptor, e)
                entries.append(e)
                continue
            if name in ruled_out:
                continue  # not memoized: it is not looked at again until its version changes
            if indexed is None:
                indexed = d.index.load(with_text=False, with_extra=False,
                                       names=to_build if len(to_build) < len(found) // 2 else None)
            rec = indexed.get(name)
            path = os.path.join(base, name)
            e = None
            if rec is not None and rec.fresh_for(key):
                e = entry_from_record(path, rec.head, rec.entry, acceptor,
                                      lambda name=name, key=key: d.index.extra(name, key))
            if e is not None:
                if rec.text_sha is not None:
                    self._text_shas[name] = (key, rec.text_sha)
            else:
                e = inspect_file(path, acceptor=acceptor, deep=False)
            if repaired(e, acceptor):
                e = inspect_file(path, acceptor=acceptor, deep=False)
                try:
                    st = os.stat(path, follow_symlinks=False)
                    key = (st.st_ino, st.st_size, st.st_mtime_ns)
                except OSError:
                    continue
            if e.error == "file not found":
                continue
            self._headers[name] = (key, acceptor, e)
            entries.append(e)
        for gone in self._text_shas.keys() - self._headers.keys():
            del self._text_shas[gone]
        for gone in self._ruled.keys() - found.keys():
            del self._ruled[gone]
        return entries

    def _stat_keys(self) -> dict[str, StatKey]:
        """Every cache-file name in the directory with its stat key (one scandir, no opens).

        Raises CacheDirError when the path is not a readable directory."""
        return self.directory.stat_keys()
