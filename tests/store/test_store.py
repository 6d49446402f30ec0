"""The conversation store on its own: the message tree, reopening, searching, deleting."""

from __future__ import annotations

from ds4tui.store import open_store


def _msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_a_committed_path_reads_back_after_reopening(tmp_path):
    path = tmp_path / "h.sqlite3"
    store = open_store(path)
    assert store.notice is None and not store.in_memory
    chat = store.create(title="Capitals", model="smollm2-135m-instruct", system_prompt="Be brief.",
                        settings={"temperature": 0.2})
    shown = _msgs(("system", "Be brief."), ("user", "France?"), ("assistant", "Paris."))
    store.commit(chat, shown)
    store.close()

    again = open_store(path).load(chat)
    assert list(again.messages) == shown
    assert again.title == "Capitals" and again.settings == {"temperature": 0.2}
    assert again.system_prompt == "Be brief." and again.engine == "local" and again.message_count == 3


def test_reply_versions_are_siblings_in_their_order_and_survive_a_reopen(tmp_path):
    path = tmp_path / "h.sqlite3"
    store = open_store(path)
    chat = store.create(title="t")
    store.commit(chat, _msgs(("user", "Hi"), ("assistant", "second")), {1: ["first", "second"]})
    # A later commit that does not repeat the versions keeps them: the tree only grows.
    store.commit(chat, _msgs(("user", "Hi"), ("assistant", "second"), ("user", "More")))
    store.close()
    loaded = open_store(path).load(chat)
    assert loaded.alternatives == {1: ["first", "second"]}
    assert [m["content"] for m in loaded.messages] == ["Hi", "second", "More"]


def test_an_edit_is_a_branch_and_the_old_one_stays_in_the_tree(tmp_path):
    store = open_store(tmp_path / "h.sqlite3")
    chat = store.create(title="t")
    first = _msgs(("user", "A"), ("assistant", "a"), ("user", "B"), ("assistant", "old answer"))
    store.commit(chat, first)
    store.commit(chat, _msgs(("user", "A"), ("assistant", "a"), ("user", "B edited"), ("assistant", "b2")))
    assert [m["content"] for m in store.load(chat).messages] == ["A", "a", "B edited", "b2"]
    # The first branch is still searchable: nothing committed is ever dropped by a move.
    hits = store.grep("OLD ANS")
    assert [h.chat.id for h in hits] == [chat] and hits[0].where == "assistant"
    assert store.grep("^b2$", regex=True)[0].snippet == "b2"
    # Going back to the old branch reuses its nodes (matched by content), adds none.
    store.commit(chat, first)
    db = store._db.connection
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 6


def test_list_find_archive_and_delete(tmp_path):
    store = open_store(tmp_path / "h.sqlite3")
    a = store.create(title="Rust lifetimes")
    b = store.create(title="rust macros")
    store.commit(a, _msgs(("user", "x")))
    assert [c.id for c in store.list()] == [a, b]  # most recently updated first
    assert [c.id for c in store.find("rust")] == [a, b]  # a title prefix, any case
    assert [c.id for c in store.find("Rust lifetimes")] == [a]
    assert [c.id for c in store.find(b[:6])] == [b]
    store.update(b, archived=True)
    assert [c.id for c in store.list()] == [a] and [c.id for c in store.list(archived=True)] == [b]
    assert store.delete(a).title == "Rust lifetimes"
    assert store.get(a) is None and store.grep("x") == []
    db = store._db.connection
    assert db.execute("SELECT COUNT(*) FROM messages WHERE conversation = ?", (a,)).fetchone()[0] == 0


def test_imports_are_remembered_even_after_a_delete(tmp_path):
    store = open_store(tmp_path / "h.sqlite3")
    chat = store.create(title="old", source="kv:abc")
    assert store.imported("kv:abc") and not store.imported("kv:abd")
    store.delete(chat)
    assert store.imported("kv:abc")  # a deleted import is not brought back by the next start


def test_a_bad_role_or_a_missing_chat_is_refused_without_a_partial_write(tmp_path):
    import pytest

    from ds4tui.store import StoreError

    store = open_store(tmp_path / "h.sqlite3")
    chat = store.create(title="t")
    with pytest.raises(StoreError, match="role"):
        store.commit(chat, _msgs(("user", "fine"), ("tool", "no")))
    assert store.load(chat).messages == ()  # the transaction rolled back: not even "fine"
    with pytest.raises(LookupError):
        store.commit("0" * 32, _msgs(("user", "x")))
