"""The store's import path: a chat created with its messages and times in one transaction."""

from __future__ import annotations

import pytest

from ds4tui.store import StoreError, open_store


def _msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_an_import_keeps_its_times_messages_and_kv_file(tmp_path):
    path = tmp_path / "h.sqlite3"
    store = open_store(path)
    shown = _msgs(("system", "S"), ("user", "Q"), ("assistant", "A"))
    chat = store.create(title="Old chat", created_at=1_700_000_000, updated_at=1_700_000_500, messages=shown,
                        kv_sha="ab" * 20, kv_tokens=64, source="kv:" + "ab" * 20)
    store.close()
    store = open_store(path)
    loaded = store.load(chat)
    assert list(loaded.messages) == shown and loaded.message_count == 3
    assert (loaded.created_at, loaded.updated_at) == (1_700_000_000, 1_700_000_500)
    assert (loaded.kv_sha, loaded.kv_tokens) == ("ab" * 20, 64)
    assert store.list()[0].message_count == 3  # the listing's count, not only load's
    assert store.imported("kv:" + "ab" * 20) and store.by_kv_sha("ab" * 20).id == chat
    # The next turn extends the imported path: its nodes are reused, not duplicated.
    store.commit(chat, shown + _msgs(("user", "Q2")))
    assert store._db.connection.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 4


def test_imported_chats_list_by_their_own_last_use():
    store = open_store(None)
    old = store.create(title="old", updated_at=100.0, messages=_msgs(("user", "a")))
    new = store.create(title="new", updated_at=200.0, messages=_msgs(("user", "b")))
    assert [c.id for c in store.list()] == [new, old]


def test_an_import_with_a_bad_message_leaves_nothing_behind():
    store = open_store(None)
    with pytest.raises(StoreError, match="role"):
        store.create(title="t", source="json:x", messages=_msgs(("user", "fine"), ("tool", "no")))
    assert store.list() == [] and not store.imported("json:x")
