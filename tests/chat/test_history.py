"""The chat controller over the conversation store: every move is committed, a chat opens
again from the store in a new controller (a restart), eviction loses no message, delete
leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

from ds4tui.chat import events as ev
from ds4tui.chat.controller import ChatController
from ds4tui.config import Config
from ds4tui.store import open_store
from tests.chat.conftest import SMALL_POLICY, Recorder, make_controller


def _restart(model, tmp_path, **config) -> ChatController:
    """A controller as a new process would make it: same cache dir, same store file."""
    return make_controller(model, tmp_path, **config)


def _kv_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".kv")


def test_versions_edits_forks_settings_and_titles_survive_a_restart(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path)
    conv = ctl.new_conversation()
    ctl.send(conv.key, "First question", Recorder())
    ctl.send(conv.key, "Second question", Recorder())
    ctl.regenerate(conv.key, Recorder())  # two versions of the last reply
    index = len(conv.messages) - 1
    ctl.show_alternative(conv.key, index, -1)  # the first version shown again
    ctl.set_chat_settings(conv.key, temperature=0.3, system_prompt="Be terse.")
    ctl.rename(conv.key, "Kept chat")
    _, kept = ctl.edit(conv.key, 1, "First question, edited", Recorder())  # the old branch is a fork
    fork = ctl.fork(conv.key, 3, Recorder())
    expected = {c.title: [dict(m) for m in c.messages] for c in (conv, kept, fork)}
    versions = dict(conv.alternatives)
    ctl.shutdown()

    again = _restart(tiny_llama, tmp_path)
    stored = {c.display_title: c for c in again.stored_chats()}
    assert set(stored) == set(expected)
    assert stored[kept.title].forked_from == conv.store_id == stored[fork.title].forked_from
    opened = again.open_stored(stored["Kept chat"].id)
    assert opened.messages == expected["Kept chat"] and opened.alternatives == versions
    assert opened.system_prompt == "Be terse." and again.chat_settings(opened.key)["temperature"] == 0.3
    old_branch = again.open_stored(stored[kept.title].id)
    assert old_branch.messages == expected[kept.title]
    assert [m["content"] for m in old_branch.messages if m["role"] == "user"][:2] == \
        ["First question", "Second question"]


def test_a_budget_that_evicts_every_file_loses_no_message(tiny_llama, tmp_path):
    """Titled files gone (eviction, a user, ds4): every chat is listed, opens from its text
    and its next message re-prefills it; the reply lands in the same history."""
    ctl = make_controller(tiny_llama, tmp_path)
    titles = []
    for i in range(3):
        conv = ctl.new_conversation()
        ctl.send(conv.key, f"Chat number {i}", Recorder())
        titles.append(conv.title)
    ctl.shutdown()
    assert _kv_files(tmp_path)
    evicted = ctl.checkpoints.store.evict(budget_bytes=1)
    assert evicted and _kv_files(tmp_path) == []

    again = _restart(tiny_llama, tmp_path)
    listed = again.stored_chats()
    assert sorted(c.display_title for c in listed) == sorted(titles)
    assert not any(again.kv_on_disk(c) for c in listed)
    events = Recorder()
    conv = again.open_stored(listed[0].id, events)
    opened = events.of(ev.HistoryOpened)[0]
    assert not conv.live and opened.kv_tokens == 0 and opened.prefill_tokens > 0
    before = [dict(m) for m in conv.messages]
    turn = Recorder()
    assert again.send(conv.key, "And now?", turn) is not None
    started = turn.of(ev.PrefillStarted)[0]
    assert started.source == "cold" and started.total >= opened.prefill_tokens
    reloaded = open_store(os.environ["DS4TUI_STORE"]).load(conv.store_id)
    assert list(reloaded.messages[:len(before)]) == before and len(reloaded.messages) == len(before) + 2


def test_delete_removes_the_history_and_every_file_of_the_chat_and_quit_writes_none(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path)
    keep = ctl.new_conversation()
    ctl.send(keep.key, "A chat to keep", Recorder())
    gone = ctl.new_conversation()
    ctl.send(gone.key, "A chat to delete, long enough for checkpoints of its own " * 6, Recorder())
    ctl.send(gone.key, "More of it", Recorder())
    before = set(_kv_files(tmp_path))
    assert gone.saved_sha + ".kv" in before
    removed = ctl.delete(gone.key)
    assert removed >= 1 and gone.saved_sha + ".kv" not in _kv_files(tmp_path)
    ctl.shutdown()  # the deleted chat is not saved again at quit
    after = set(_kv_files(tmp_path))
    assert keep.saved_sha + ".kv" in after
    # Nothing written at quit holds the deleted chat's text.
    for name in after - before:
        assert b"A chat to delete" not in (tmp_path / name).read_bytes()
    assert [c.display_title for c in _restart(tiny_llama, tmp_path).stored_chats()] == [keep.title]


def test_a_message_sent_before_a_crash_comes_back_as_the_draft(tiny_llama, tmp_path):
    store = open_store(os.environ["DS4TUI_STORE"])
    chat = store.create(title="interrupted", model=tiny_llama.info.name)
    store.commit(chat, [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
                        {"role": "user", "content": "What was I saying"}])
    ctl = make_controller(tiny_llama, tmp_path)
    conv = ctl.open_stored(chat)
    assert conv.draft == "What was I saying" and conv.messages[-1] == {"role": "assistant", "content": "Hi."}


def test_a_chat_of_another_model_opens_and_continues_on_this_one(tiny_llama, tmp_path):
    store = open_store(os.environ["DS4TUI_STORE"])
    chat = store.create(title="from another model", model="some-other-model")
    store.commit(chat, [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."}])
    ctl = make_controller(tiny_llama, tmp_path)
    events = Recorder()
    conv = ctl.open_stored(chat, events)
    assert events.of(ev.HistoryOpened)[0].made_with == "some-other-model"
    assert ctl.send(conv.key, "Go on", Recorder()) is not None
    assert store.get(chat).model == tiny_llama.info.name


def test_an_unusable_store_file_keeps_the_chat_going_in_memory(tiny_llama, tmp_path):
    bad = tmp_path / "history.sqlite3"
    bad.write_bytes(b"garbage" * 1000)
    ctl = ChatController(tiny_llama, Config(model=tiny_llama.info.name, temperature=0.0, max_tokens=4,
                                            cache_dir=str(tmp_path / "kv")),
                         policy=SMALL_POLICY, store=open_store(bad))
    assert "kept in memory" in ctl.history_notice and str(bad) in ctl.history_notice
    conv = ctl.new_conversation()
    assert ctl.send(conv.key, "Still works", Recorder()) is not None
    assert [c.id for c in ctl.history.store.list()] == [conv.store_id]
    assert bad.read_bytes() == b"garbage" * 1000


def test_resume_by_title_finds_the_stored_chat(tiny_llama, tmp_path):
    ctl = make_controller(tiny_llama, tmp_path)
    conv = ctl.new_conversation()
    ctl.send(conv.key, "Resume me by title", Recorder())
    ctl.shutdown()
    again = _restart(tiny_llama, tmp_path)
    resumed = again.resume("Resume me")
    assert resumed.store_id == conv.store_id and resumed.live and resumed.messages == conv.messages
