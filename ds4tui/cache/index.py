"""The header index: what a listing needs of each file, kept beside the files in one SQLite file.

Owns `.ds4tui-index.sqlite` in the cache directory (not a cache-file name: ds4 and every
scan ignore it) and `FileRecord`, one file version as the deep inspection saw it (the raw
52 header bytes, the verdict without any engine's acceptor, title, preview, payload and
trailer summaries, the model fingerprint) plus its text, which eviction's prefix relations
and the browser's names and filter read; and the prefix relations of the latest set of
files (eviction.relations), keyed by every file's name, inode, size and the header fields
they depend on, so a listing of unchanged files reads no text at all. A row is keyed by the file's name and valid only
for the (inode, size, mtime_ns) it was read at: a hit or a pin rewrites header bytes and
moves the mtime, a save renames a new inode in, and either makes the row stale, so that file
alone is read again. A row read within RACY_S of its file's mtime is not reused (an
in-place write in the same clock tick would leave the mtime as it was; git's "racy" rule).

Never trusted over the file: a load, an eviction, a pin re-read the file itself (under its
lock). When the index cannot be opened or written (a read-only directory, a damaged file,
another process holding a write lock too long) every listing reads the files as before.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

INDEX_NAME = ".ds4tui-index.sqlite"
SCHEMA = 7
T = TypeVar("T")
RACY_S = 2.0
BUSY_MS = 2000

StatKey = tuple[int, int, int]


@dataclass
class FileRecord:
    """One file version: `head` its first (up to) 52 bytes, `entry` the inspection's fields,
    `text` its stored text (None when it could not be read)."""

    key: StatKey
    head: bytes
    entry: dict
    text: bytes | None
    fingerprint: bytes | None = None
    read_at: float = 0.0
    text_sha: str | None = None  # SHA-1 of the text (a titled file's name does not tell it)
    extra: str | None = None  # JSON of the entry's extra fields (entry.entry_record), decoded when read

    def fresh_for(self, key: StatKey) -> bool:
        """Whether this row describes the version `key` names and may be reused for it."""
        return tuple(key) == tuple(self.key) and self.read_at - key[2] / 1e9 >= RACY_S


class HeaderIndex:
    """The index of one directory. Thread-safe; every method degrades to a no-op on failure.

    A connection is opened per call and closed after it: an open file in the directory would
    keep the directory alive after an `rm -r` (the watch would never hear it go), and a
    short-lived connection never holds a lock another process waits on."""

    def __init__(self, directory: str | os.PathLike):
        self.path = Path(directory) / INDEX_NAME
        self._lock = threading.Lock()
        self._unusable = False  # not a database, or a newer ds4tui's: the files are read instead

    def size_bytes(self) -> int:
        """The index's bytes on disk (with a journal left by a write in progress): counted in
        the directory's budget beside the cache files."""
        total = 0
        for path in (self.path, self.path.with_name(self.path.name + "-journal")):
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        if self._unusable:
            return None
        try:
            if not self.path.parent.is_dir() or (not create and not self.path.exists()):
                return None
            db = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, isolation_level=None)
        except (sqlite3.Error, OSError):
            return None
        try:
            # The rollback journal (not WAL): one file in the cache directory, a journal only
            # while a write runs; writes are rare (new file versions) and short.
            db.execute("PRAGMA synchronous=OFF")  # a cache of the files: losing it costs a re-read
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA:
                self._unusable = True
                db.close()
                return None
            if version < SCHEMA and create:
                db.execute("DROP TABLE IF EXISTS files")  # an older layout: rebuilt from the files
                db.execute("CREATE TABLE files (name TEXT PRIMARY KEY, ino INTEGER, size INTEGER,"
                           " mtime_ns INTEGER, read_at REAL, head BLOB, entry TEXT, fingerprint BLOB,"
                           " text_sha TEXT, extra TEXT, text BLOB)")  # the text last: a row read without
                # it never walks the text's overflow pages
                db.execute("DROP TABLE IF EXISTS checksums")
                db.execute("CREATE TABLE checksums (name TEXT PRIMARY KEY, ino INTEGER, size INTEGER,"
                           " verdict TEXT, error TEXT)")
                db.execute("DROP TABLE IF EXISTS relations")
                db.execute("CREATE TABLE relations (key TEXT PRIMARY KEY, data TEXT)")
                db.execute(f"PRAGMA user_version={SCHEMA}")
            elif version < SCHEMA:
                db.close()
                return None
        except sqlite3.DatabaseError as exc:
            db.close()
            if not isinstance(exc, sqlite3.OperationalError):
                self._unusable = True  # "file is not a database": damaged or foreign
            return None
        return db

    def _read(self, query: Callable[[sqlite3.Connection], T], fallback: T) -> T:
        """`query` on a short-lived connection, or `fallback` when there is no index or it
        cannot be read (every caller then reads the files). Reading never creates the file."""
        with self._lock:
            db = self._connect(create=False)
            if db is None:
                return fallback
            try:
                return query(db)
            except sqlite3.Error:
                return fallback
            finally:
                db.close()

    def _write(self, statements: Callable[[sqlite3.Connection], object]) -> None:
        """`statements` in one transaction; a failure rolls it back and is dropped (the index is
        a cache of the files: the next listing reads them again)."""
        with self._lock:
            db = self._connect(create=True)
            if db is None:
                return
            try:
                db.execute("BEGIN IMMEDIATE")
                statements(db)
                db.execute("COMMIT")
            except sqlite3.Error:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            finally:
                db.close()

    def load(self, *, with_text: bool = True, with_extra: bool = True,
             names: list[str] | None = None) -> dict[str, FileRecord]:
        """Every row, or those of `names` (name -> record; `text` None unless `with_text`,
        `extra` unless `with_extra`); empty when the index is unusable."""
        select = ("SELECT name, ino, size, mtime_ns, read_at, head, entry, fingerprint, text_sha,"
                  f" {'extra' if with_extra else 'NULL'}, {'text' if with_text else 'NULL'} FROM files")

        def query(db: sqlite3.Connection) -> list[tuple]:
            if names is None:
                return db.execute(select).fetchall()
            rows: list[tuple] = []
            for i in range(0, len(names), 500):  # under SQLite's bound-parameter limit
                chunk = names[i:i + 500]
                rows += db.execute(f"{select} WHERE name IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            return rows

        rows: list[tuple] = self._read(query, [])
        out = {}
        for name, ino, size, mtime_ns, read_at, head, entry, fingerprint, text_sha, extra, text in rows:
            try:
                out[name] = FileRecord((ino, size, mtime_ns), bytes(head), json.loads(entry),
                                       bytes(text) if text is not None else None,
                                       bytes(fingerprint) if fingerprint is not None else None, read_at,
                                       text_sha, extra if isinstance(extra, str) else None)
            except (ValueError, TypeError):
                continue  # a damaged row: the file is read again
        return out

    def prefix_rows(self) -> dict[str, tuple[StatKey, float, bytes, str | None]]:
        """name -> (stat key, read_at, head, text_sha) of every row: what the lookup needs to
        rule a file out without building its entry (no JSON decoded, no text read)."""
        rows: list[tuple] = self._read(lambda db: db.execute(
            "SELECT name, ino, size, mtime_ns, read_at, head, text_sha FROM files").fetchall(), [])
        return {name: ((ino, size, mtime_ns), read_at, bytes(head), text_sha)
                for name, ino, size, mtime_ns, read_at, head, text_sha in rows
                if isinstance(head, bytes) and isinstance(read_at, (int, float))}

    def _column(self, column: str, name: str, key: StatKey):
        """One column of `name`'s row if the row is for version `key`, else None."""
        row = self._read(lambda db: db.execute(
            f"SELECT {column} FROM files WHERE name = ? AND ino = ? AND size = ? AND mtime_ns = ?",
            (name, *key)).fetchone(), None)
        return row[0] if row else None

    def text(self, name: str, key: StatKey) -> bytes | None:
        """The indexed text of `name` if the row is for version `key`, else None."""
        value = self._column("text", name, key)
        return bytes(value) if value is not None else None

    def extra(self, name: str, key: StatKey) -> str | None:
        """The JSON of the extra entry fields of `name`, if its row is for version `key`."""
        value = self._column("extra", name, key)
        return value if isinstance(value, str) else None

    def texts(self, keys: dict[str, StatKey]) -> dict[str, bytes]:
        """name -> indexed text, for the names of `keys` whose row is for that version."""
        names = list(keys)

        def query(db: sqlite3.Connection) -> list[tuple]:
            rows: list[tuple] = []
            for i in range(0, len(names), 500):  # under SQLite's bound-parameter limit
                chunk = names[i:i + 500]
                rows += db.execute("SELECT name, ino, size, mtime_ns, text FROM files WHERE name IN"
                                   f" ({','.join('?' * len(chunk))})", chunk).fetchall()
            return rows

        rows: list[tuple] = self._read(query, [])
        return {name: bytes(text) for name, ino, size, mtime_ns, text in rows
                if text is not None and keys.get(name) == (ino, size, mtime_ns)}

    def verdicts(self) -> dict[str, tuple[tuple[int, int], str, str | None]]:
        """name -> ((inode, size), "ok" | "mismatch", error): checksum verdicts read before. The
        checksum covers no header byte, so a hit or a pin leaves a verdict valid."""
        rows: list[tuple] = self._read(
            lambda db: db.execute("SELECT name, ino, size, verdict, error FROM checksums").fetchall(), [])
        return {name: ((ino, size), verdict, error) for name, ino, size, verdict, error in rows
                if verdict in ("ok", "mismatch")}

    def store_verdicts(self, verdicts: dict[str, tuple[tuple[int, int], str, str | None]]) -> None:
        def statements(db: sqlite3.Connection) -> None:
            db.executemany("INSERT OR REPLACE INTO checksums VALUES (?, ?, ?, ?, ?)",
                           [(name, *key, verdict, error) for name, (key, verdict, error) in verdicts.items()])
            db.execute("DELETE FROM checksums WHERE name NOT IN (SELECT name FROM files)")

        self._write(statements)

    def relations(self, key: str) -> dict | None:
        """The prefix relations stored for the file set `key` names (eviction.relation_key)."""
        row = self._read(lambda db: db.execute("SELECT data FROM relations WHERE key = ?", (key,)).fetchone(), None)
        try:
            data = json.loads(row[0]) if row else None
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def store_relations(self, key: str, data: dict) -> None:
        """Keep `data` as the relations of file set `key` (only the latest set is kept)."""
        def statements(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM relations")
            db.execute("INSERT INTO relations VALUES (?, ?)", (key, json.dumps(data)))

        self._write(statements)

    def store(self, records: dict[str, FileRecord], keep: set[str] | None = None) -> None:
        """Write `records`; with `keep`, drop rows of names not in it (files gone)."""
        def statements(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(name, *r.key, r.read_at, r.head, json.dumps(r.entry), r.fingerprint, r.text_sha, r.extra, r.text)
                 for name, r in records.items()])
            if keep is not None:
                gone = [(n,) for (n,) in db.execute("SELECT name FROM files") if n not in keep]
                db.executemany("DELETE FROM files WHERE name = ?", gone)

        self._write(statements)
