"""The store's API: conversations as trees of messages, committed a path at a time.

Owns every read and write of the tables in schema.py. A chat is committed as the path it
shows (system prompt, user and assistant messages, in order) plus the other versions of
its replies; the store matches that path against the tree by content, reusing the nodes
it has and adding the ones it lacks, in one transaction. So regenerate versions and
edited messages become sibling branches that stay, a cancelled reply is committed as
far as it got, and a crash loses at most the reply being streamed. Leaves to the chat
layer when to commit and what a message means.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Iterator

from ds4tui.store.database import Database, StoreError, connect

ROLES = ("system", "user", "assistant")
_META = ("id, title, model, engine, system_prompt, settings, created_at, updated_at, kv_sha, kv_tokens, "
         "forked_from, archived, shown")
_UPDATABLE = {"title", "model", "engine", "system_prompt", "settings", "kv_sha", "kv_tokens", "archived",
              "created_at"}


@dataclass(frozen=True)
class StoredChat:
    """One conversation as the store holds it; `messages`/`alternatives` are filled by `load`."""

    id: str
    title: str | None
    model: str  # the model spec it ran on ("" unknown); for a remote chat, the server's model name
    engine: str  # "local", or the remote server's base URL
    system_prompt: str | None
    settings: dict
    created_at: float
    updated_at: float
    kv_sha: str | None  # the titled .kv file that held its state last (a cache: may be gone)
    kv_tokens: int
    forked_from: str | None
    archived: bool
    message_count: int = 0  # messages on the shown path (system prompt included)
    messages: tuple[dict, ...] = ()
    # index into messages -> every version of the reply shown there (regenerate), oldest first
    alternatives: dict[int, list[str]] = field(default_factory=dict)

    @property
    def display_title(self) -> str:
        return self.title or "New chat"

    @property
    def remote(self) -> bool:
        return self.engine != "local"


@dataclass(frozen=True)
class StoredHit:
    """A chat whose title or one of whose messages matches a search."""

    chat: StoredChat
    where: str  # "title" or the role of the matching message
    snippet: str


class ConversationStore:
    """Every conversation of this user; thread-safe (one lock), each write one transaction."""

    def __init__(self, db: Database, notice: str | None = None) -> None:
        self._db = db
        # Set when the file could not be used and this store lives in memory: one line to show.
        self.notice = notice
        # chat id -> the path last committed, as (role, content, node id): the next commit of a
        # chat that only grew inserts its new messages without reading the tree again.
        self._paths: dict[str, list[tuple[str, str, int]]] = {}

    @property
    def path(self):
        """The file (None when in memory)."""
        return self._db.path

    @property
    def in_memory(self) -> bool:
        return self._db.path is None

    def close(self) -> None:
        self._db.close()

    # -- writing ------------------------------------------------------------------------------

    def create(self, *, title: str | None, model: str = "", engine: str = "local",
               system_prompt: str | None = None, settings: dict | None = None,
               created_at: float | None = None, forked_from: str | None = None,
               source: str | None = None, messages: Iterable[dict] = (),
               updated_at: float | None = None, kv_sha: str | None = None, kv_tokens: int = 0) -> str:
        """A new conversation; returns its id. `source` (e.g. "kv:<sha>") records an import, so
        that `imported(source)` finds it and a second import does nothing; an import gives its
        `messages` (the shown path) and times too, so that it is all there or not at all: a
        crash never leaves a chat marked imported with its messages missing."""
        chat_id = uuid.uuid4().hex
        now = time.time()
        path = [(str(m["role"]), str(m["content"])) for m in messages]
        with self._transaction() as db:
            db.execute(f"INSERT INTO conversations ({_META}) VALUES (?,?,?,?,?,?,?,?,?,?,?,0,0)",
                       (chat_id, title, model, engine, system_prompt, json.dumps(settings or {}),
                        created_at or now, updated_at or now, kv_sha, int(kv_tokens), forked_from))
            ids = self._sync_path(db, chat_id, path, {}) if path else []
            if ids:
                db.execute("UPDATE conversations SET head = ?, shown = ? WHERE id = ?", (ids[-1], len(ids), chat_id))
            if source is not None:
                db.execute("INSERT OR REPLACE INTO imports (source, conversation, imported_at) VALUES (?,?,?)",
                           (source, chat_id, now))
        if ids:
            self._paths[chat_id] = [(r, c, i) for (r, c), i in zip(path, ids)]
        return chat_id

    def commit(self, chat_id: str, messages: Iterable[dict], alternatives: dict[int, list[str]] | None = None,
               **meta) -> None:
        """Make `messages` the chat's shown path (every message kept, new ones added), with the
        other versions of replies in `alternatives`, and update any `meta` fields (title,
        settings, kv_sha...), all in one transaction. Raises StoreError, LookupError."""
        path = [(str(m["role"]), str(m["content"])) for m in messages]
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM conversations WHERE id = ?", (chat_id,)).fetchone() is None:
                raise LookupError(f"no conversation {chat_id[:12]} in the store")
            ids = self._sync_path(db, chat_id, path, alternatives or {})
            self._set(db, chat_id, {**meta, "head": ids[-1] if ids else None, "shown": len(ids)})
        self._paths[chat_id] = [(r, c, i) for (r, c), i in zip(path, ids)]

    def delete_version(self, chat_id: str, index: int, content: str) -> bool:
        """Remove one version of the reply at path position `index` (the node under the shown
        path's message `index - 1` with this text) and everything under it. False when no
        such node is stored. The caller commits the path it shows next."""
        known = self._paths.get(chat_id)
        if known is None:
            self.load(chat_id)
            known = self._paths.get(chat_id, [])
        if index > len(known):
            return False
        parent = known[index - 1][2] if index else None
        with self._transaction() as db:
            cur = db.execute("DELETE FROM messages WHERE conversation = ? AND parent IS ? AND role = 'assistant' "
                             "AND content = ?", (chat_id, parent, content))  # its subtree: ON DELETE CASCADE
        self._paths[chat_id] = known[:index]  # the next commit finds the path again from there
        return cur.rowcount > 0

    def update(self, chat_id: str, **meta) -> None:
        """Change meta fields (title, model, engine, settings, kv_sha, kv_tokens, archived...)."""
        with self._transaction() as db:
            self._set(db, chat_id, meta)

    def delete(self, chat_id: str) -> StoredChat | None:
        """Remove a conversation and its whole tree; returns what it was (its .kv file is the
        caller's to delete), None when it was not there."""
        with self._transaction() as db:
            chat = self._get(db, chat_id)
            if chat is not None:
                db.execute("DELETE FROM messages WHERE conversation = ?", (chat_id,))
                db.execute("DELETE FROM conversations WHERE id = ?", (chat_id,))
                db.execute("UPDATE imports SET conversation = NULL WHERE conversation = ?", (chat_id,))
        self._paths.pop(chat_id, None)
        return chat

    # -- reading ------------------------------------------------------------------------------

    def get(self, chat_id: str) -> StoredChat | None:
        """The conversation's meta data (no messages), or None."""
        with self._reading() as db:
            return self._get(db, chat_id)

    def load(self, chat_id: str) -> StoredChat:
        """The conversation with its shown path and reply versions; LookupError when missing."""
        with self._reading() as db:
            chat = self._get(db, chat_id)
            if chat is None:
                raise LookupError(f"no conversation {chat_id[:12]} in the store")
            head = db.execute("SELECT head FROM conversations WHERE id = ?", (chat_id,)).fetchone()[0]
            rows = db.execute("""
                WITH RECURSIVE path(id, parent, role, content, depth) AS (
                    SELECT id, parent, role, content, 0 FROM messages WHERE id = ? AND conversation = ?
                    UNION ALL
                    SELECT m.id, m.parent, m.role, m.content, p.depth + 1
                    FROM messages m JOIN path p ON m.id = p.parent
                )
                SELECT id, parent, role, content FROM path ORDER BY depth DESC""", (head, chat_id)).fetchall()
            messages = tuple({"role": role, "content": content} for _, _, role, content in rows)
            alternatives: dict[int, list[str]] = {}
            for index, (_, parent, role, _content) in enumerate(rows):
                if role != "assistant":
                    continue
                versions = [c for (c,) in db.execute(
                    "SELECT content FROM messages WHERE conversation = ? AND parent IS ? AND role = ? ORDER BY id",
                    (chat_id, parent, role))]
                if len(versions) > 1:
                    alternatives[index] = versions
        self._paths[chat_id] = [(r, c, i) for i, _, r, c in rows]
        return replace(chat, messages=messages, alternatives=alternatives, message_count=len(messages))

    def list(self, archived: bool = False) -> list[StoredChat]:
        """Conversations, most recently updated first (archived ones only when asked)."""
        with self._reading() as db:
            rows = db.execute(f"""
                SELECT {_META} FROM conversations WHERE archived = ?
                ORDER BY updated_at DESC, created_at DESC""", (1 if archived else 0,)).fetchall()
        return [_chat(row) for row in rows]

    def find(self, query: str, archived: bool | None = None) -> list[StoredChat]:
        """Chats whose id starts with `query`, else whose title equals it (any case), else whose
        title starts with it: the first rule that matches anything decides."""
        q = query.strip()
        chats = self.list() + (self.list(archived=True) if archived is not False else [])
        if archived is True:
            chats = [c for c in chats if c.archived]
        if not q:
            return []
        for rule in (lambda c: len(q) >= 4 and c.id.startswith(q.lower()),
                     lambda c: c.title == q,
                     lambda c: (c.title or "").casefold() == q.casefold(),
                     lambda c: (c.title or "").casefold().startswith(q.casefold())):
            found = [c for c in chats if rule(c)]
            if found:
                return found
        return []

    def by_kv_sha(self, sha: str) -> StoredChat | None:
        """The chat whose titled .kv file is `sha`, if any."""
        with self._reading() as db:
            row = db.execute(f"SELECT {_META} FROM conversations WHERE kv_sha = ?", (sha,)).fetchone()
        return _chat(row) if row else None

    def grep(self, pattern: str, regex: bool = False) -> list[StoredHit]:
        """Chats whose title or any message (every branch) matches; case-insensitive. Raises
        ValueError for a bad regular expression."""
        matcher = re.compile(pattern if regex else re.escape(pattern), re.IGNORECASE)
        hits: list[StoredHit] = []
        with self._reading() as db:
            for archived in (0, 1):
                for row in db.execute(f"SELECT {_META} FROM conversations WHERE archived = ? "
                                      "ORDER BY updated_at DESC", (archived,)).fetchall():
                    chat = _chat(row)
                    found = matcher.search(chat.title or "")
                    if found:
                        hits.append(StoredHit(chat, "title", chat.title or ""))
                        continue
                    for role, content in db.execute(
                            "SELECT role, content FROM messages WHERE conversation = ? ORDER BY id", (chat.id,)):
                        found = matcher.search(content)
                        if found:
                            hits.append(StoredHit(chat, role, _snippet(content, found.start(), found.end())))
                            break
        return hits

    def imported(self, source: str) -> bool:
        """Whether `source` was imported already (even if its chat was deleted since)."""
        with self._reading() as db:
            return db.execute("SELECT 1 FROM imports WHERE source = ?", (source,)).fetchone() is not None

    def integrity(self) -> str:
        """SQLite's integrity check: "ok" or the first problems."""
        with self._reading() as db:
            return "; ".join(str(r[0]) for r in db.execute("PRAGMA integrity_check").fetchall())

    # -- inside ---------------------------------------------------------------------------------

    def _sync_path(self, db: sqlite3.Connection, chat_id: str, path: list[tuple[str, str]],
                   alternatives: dict[int, list[str]]) -> list[int]:
        known = self._paths.get(chat_id, [])
        ids: list[int] = []
        parent: int | None = None
        for i, (role, content) in enumerate(path):
            if role not in ROLES:
                raise StoreError(f"a message role must be one of {', '.join(ROLES)}, not {role!r}")
            # Versions first, in their order: the store lists siblings by age, as the chat does.
            for text in alternatives.get(i, ()):
                self._child(db, chat_id, parent, role, text)
            if i < len(known) and known[i][:2] == (role, content) and (i == 0 or known[i - 1][2] == parent):
                node = known[i][2]
            else:
                known = []  # past the first difference the cached path says nothing
                node = self._child(db, chat_id, parent, role, content)
            ids.append(node)
            parent = node
        return ids

    @staticmethod
    def _child(db: sqlite3.Connection, chat_id: str, parent: int | None, role: str, content: str) -> int:
        row = db.execute("SELECT id FROM messages WHERE conversation = ? AND parent IS ? AND role = ? "
                         "AND content = ? ORDER BY id LIMIT 1", (chat_id, parent, role, content)).fetchone()
        if row is not None:
            return int(row[0])
        cur = db.execute("INSERT INTO messages (conversation, parent, role, content, created_at) "
                         "VALUES (?,?,?,?,?)", (chat_id, parent, role, content, time.time()))
        return int(cur.lastrowid)

    @staticmethod
    def _set(db: sqlite3.Connection, chat_id: str, meta: dict) -> None:
        unknown = set(meta) - _UPDATABLE - {"head", "shown"}
        if unknown:
            raise ValueError(f"not a conversation field: {', '.join(sorted(unknown))}")
        values = {k: (json.dumps(v) if k == "settings" else int(v) if k == "archived" else v)
                  for k, v in meta.items()}
        values["updated_at"] = time.time()
        assignments = ", ".join(f"{k} = ?" for k in values)
        cur = db.execute(f"UPDATE conversations SET {assignments} WHERE id = ?", (*values.values(), chat_id))
        if cur.rowcount == 0:
            raise LookupError(f"no conversation {chat_id[:12]} in the store")

    @staticmethod
    def _get(db: sqlite3.Connection, chat_id: str) -> StoredChat | None:
        row = db.execute(f"SELECT {_META} FROM conversations WHERE id = ?", (chat_id,)).fetchone()
        return _chat(row) if row else None

    def _transaction(self):
        return _Transaction(self._db, write=True)

    def _reading(self):
        return _Transaction(self._db, write=False)


class _Transaction:
    """`with` block over the connection under the store's lock: BEGIN IMMEDIATE for writes
    (the write lock up front, so a busy file waits in the busy timeout, not mid-way), and
    every sqlite3 error turned into one StoreError line."""

    def __init__(self, db: Database, write: bool) -> None:
        self._db = db
        self._write = write

    def __enter__(self) -> sqlite3.Connection:
        self._db.lock.acquire()
        try:
            if self._write:
                self._db.connection.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._db.lock.release()
            raise StoreError(f"history not saved: {exc}") from None
        return self._db.connection

    def __exit__(self, kind, exc, tb) -> bool:
        conn = self._db.connection
        try:
            if self._write:
                if kind is None:
                    try:
                        conn.execute("COMMIT")
                    except sqlite3.Error as err:
                        conn.execute("ROLLBACK")
                        raise StoreError(f"history not saved: {err}") from None
                else:
                    conn.execute("ROLLBACK")
        finally:
            self._db.lock.release()
        if kind is not None and issubclass(kind, sqlite3.Error):
            raise StoreError(f"history {'not saved' if self._write else 'not read'}: {exc}") from None
        return False


def _chat(row) -> StoredChat:
    (chat_id, title, model, engine, system_prompt, settings, created, updated, kv_sha, kv_tokens,
     forked_from, archived, count) = row
    try:
        parsed = json.loads(settings) if settings else {}
    except ValueError:
        parsed = {}
    return StoredChat(id=chat_id, title=title, model=model or "", engine=engine or "local",
                      system_prompt=system_prompt, settings=parsed if isinstance(parsed, dict) else {},
                      created_at=float(created), updated_at=float(updated), kv_sha=kv_sha,
                      kv_tokens=int(kv_tokens or 0), forked_from=forked_from, archived=bool(archived),
                      message_count=int(count))


def _snippet(text: str, start: int, end: int, width: int = 60) -> str:
    left = max(0, start - width // 3)
    out = text[left:left + width]
    return ("…" if left else "") + " ".join(out.split()) + ("…" if left + width < len(text) else "")


def iter_messages(chat: StoredChat) -> Iterator[dict]:
    """The shown path's user and assistant messages (the system prompt stays out)."""
    return (m for m in chat.messages if m["role"] in ("user", "assistant"))


def open_store(path: str | os.PathLike | None):
    """The store at `path` (created if missing), or, when it cannot be used, one in memory
    whose `notice` says why; None opens in memory on purpose (no notice)."""
    if path is None:
        return ConversationStore(connect(None))
    file = Path(path).expanduser()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        # The mode bits too: root passes os.access, yet a file marked read-only is the user's say.
        if file.exists() and (not os.access(file, os.W_OK) or not file.stat().st_mode & 0o222):
            raise StoreError("read-only (the file)")
        if not file.exists() and not os.access(file.parent, os.W_OK):
            raise StoreError(f"cannot create it ({file.parent} is not writable)")
        return ConversationStore(connect(file))
    except (StoreError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        notice = f"history file {file}: {why}; this session's chats are kept in memory only"
        return ConversationStore(connect(None), notice=notice)
