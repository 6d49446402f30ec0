"""Opening the store's SQLite file, and what happens when it cannot be used.

Owns the connection: WAL mode (a reader never waits for the writer, so the chat and
`ds4tui serve` or a second chat share one file), a busy timeout (a writer waits for
another's short transaction instead of failing), autocommit with explicit
transactions, and one lock so the UI thread and a worker never interleave on it.

A file that is corrupt, not SQLite, from a newer schema, locked by another process
or on a read-only disk is never rewritten: `open_store` says why in one line
(`ConversationStore.notice`) and returns a store in memory, so the chat goes on and
only this session's history is at risk (the UI says so).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from ds4tui.errors import Ds4tuiError
from ds4tui.store.schema import SCHEMA_VERSION, NewerSchema, migrate, version_of

BUSY_TIMEOUT_MS = 5000  # a turn's commit is a few ms: 5 s covers any other writer's transaction
OPEN_PROBE_TIMEOUT_MS = 1500  # at start, a write lock held this long means another process keeps it


class StoreError(Ds4tuiError):
    """The store could not read or write (one line: what and why); the caller decides what to say."""


class Database:
    """One SQLite connection shared by threads under a lock, in autocommit mode."""

    def __init__(self, connection: sqlite3.Connection, path: Path | None) -> None:
        self.connection = connection
        self.path = path  # None: in memory
        self.lock = threading.RLock()

    def close(self) -> None:
        with self.lock:
            self.connection.close()


def connect(path: Path | None) -> Database:
    """A connection to `path` (None: a private in-memory database) at the current schema.
    Raises StoreError (one line) when the file cannot be used as it is."""
    target = ":memory:" if path is None else str(path)
    try:
        conn = sqlite3.connect(target, timeout=OPEN_PROBE_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open ({exc})") from None
    try:
        # "file is not a database" shows up on the first read, not at connect.
        if version_of(conn) > SCHEMA_VERSION:
            raise NewerSchema(f"schema version {version_of(conn)}, this ds4tui knows up to {SCHEMA_VERSION}")
        if path is not None:
            # WAL changes the file's header: only for a file that is ours (a new one, or one
            # this or an older ds4tui made), never for a stranger's SQLite or a newer schema.
            _check_is_ours(conn)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"cannot use write-ahead logging here (journal mode {mode})")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash loses no committed turn
        migrate(conn)
        if path is not None:
            # Another process holding the write lock for longer than a commit takes: say so now,
            # not at the first reply.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("COMMIT")
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    except NewerSchema as exc:
        conn.close()
        raise StoreError(f"made by a newer ds4tui ({exc})") from None
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(_describe(exc)) from None
    except StoreError:
        conn.close()
        raise
    return Database(conn, path)


def _check_is_ours(conn: sqlite3.Connection) -> None:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if tables and "conversations" not in tables:
        raise StoreError(f"an SQLite file of something else (tables: {', '.join(sorted(tables)[:4])})")


def _describe(exc: sqlite3.DatabaseError) -> str:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return "locked by another process"
    if "readonly" in text or "read-only" in text:
        return "read-only (the disk or the file)"
    if "not a database" in text or "malformed" in text:
        return f"not a readable conversation store ({text})"
    return text
