"""The store's tables, and the migrations that take an older file to the current schema.

The schema version lives in SQLite's `PRAGMA user_version`. A file whose version is
newer than `SCHEMA_VERSION` was written by a newer ds4tui: it is refused and never
touched. Each migration is one transaction, so a file is always at some version.

Tables (version 2):
- conversations: one row per chat. `engine` is "local" (the embedded model) or the
  remote server's URL; `settings` is JSON (the chat's sampling overrides); `head` is the
  last message of the branch the chat shows; `kv_sha`/`kv_tokens` the titled `.kv` file
  that held its state last (a cache: it may be gone; a remote chat with no file: `kv_tokens`
  is the count its server gave last), `shown` the number of messages on
  the shown path (for listings), `archived` hides it from the list.
- messages: the message tree. `parent` is NULL for a first message; siblings are the
  versions of a reply (regenerate) or of a user message (edit and resend).
- imports: where a chat was imported from (a titled .kv file, a remote JSON transcript),
  so that the import on start-up runs once per source.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from ds4tui.errors import Ds4tuiError

SCHEMA_VERSION = 2


def _v1(db: sqlite3.Connection) -> None:
    _run(db, """
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            title TEXT,
            model TEXT NOT NULL DEFAULT '',
            engine TEXT NOT NULL DEFAULT 'local',
            system_prompt TEXT,
            settings TEXT NOT NULL DEFAULT '{}',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            head INTEGER,
            kv_sha TEXT,
            kv_tokens INTEGER NOT NULL DEFAULT 0,
            forked_from TEXT,
            shown INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            parent INTEGER REFERENCES messages(id) ON DELETE CASCADE,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX messages_by_parent ON messages(conversation, parent);
        CREATE INDEX conversations_by_update ON conversations(updated_at);
        CREATE TABLE imports (
            source TEXT PRIMARY KEY,
            conversation TEXT,
            imported_at REAL NOT NULL
        );
    """)


def _v2(db: sqlite3.Connection) -> None:
    # Archive (hidden from the chat list, kept in full) and the text search's index of titles.
    _run(db, """
        ALTER TABLE conversations ADD COLUMN archived INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX conversations_by_title ON conversations(title);
    """)


def _run(db: sqlite3.Connection, script: str) -> None:
    # Statement by statement: executescript() would COMMIT the migration's transaction first.
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


# MIGRATIONS[i] takes a file from version i to i + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2]
assert len(MIGRATIONS) == SCHEMA_VERSION


class NewerSchema(Ds4tuiError):
    """The file was written by a newer ds4tui."""


def version_of(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migrate(db: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring `db` to version `target`, one transaction per step; returns the version found."""
    found = version_of(db)
    if found > SCHEMA_VERSION:
        raise NewerSchema(f"schema version {found}, this ds4tui knows up to {SCHEMA_VERSION}")
    for version in range(found, target):
        # BEGIN IMMEDIATE: a second process migrating at the same moment waits, then finds
        # the new version and skips the step (re-read inside the transaction).
        db.execute("BEGIN IMMEDIATE")
        try:
            if version_of(db) == version:
                MIGRATIONS[version](db)
                db.execute(f"PRAGMA user_version = {version + 1}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return found
