"""Importing the chats that predate the conversation store (chat/history_import.py): a cache
directory and a transcripts directory as an older ds4tui left them, built byte by byte
(tests/ui/kv_fixtures.py) with transcripts rendered by the models' published templates."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from ds4tui.chat.history_import import import_existing
from ds4tui.chat.model_memo import remember
from ds4tui.chat.legacy_transcripts import Transcript, Transcripts
from ds4tui.engine.text.chat_templates import chat_template_for
from ds4tui.engine.text.dsv4_chat import Dsv4ChatTemplate
from ds4tui.store import open_store
from tests.ui import kv_fixtures as kvf

TEMPLATES = Path(__file__).parent.parent / "engine" / "text" / "templates"
TURNS = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
         {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "Green."}]
DAY = datetime(2025, 3, 1, 9, 30)


def published(name: str, bos: str, messages: list[dict]) -> str:
    """A transcript as the model's own template (its published `chat_template`) writes it."""
    chat, _ = chat_template_for((TEMPLATES / f"{name}.jinja").read_text(), lambda t: False, "llama", bos)
    return chat.render(messages, add_generation_prompt=False, now=DAY)


def old_user_dirs(root: Path) -> tuple[Path, Path, dict]:
    """A cache dir and a transcripts dir from before the store; returns them and what each
    importable chat must come back as (title -> fields)."""
    kv, tr = root / "kv", root / "transcripts"
    want: dict[str, dict] = {}
    lisbon = kvf.titled_session(kv)  # ChatML, hostile title, ESC in a message
    want[kvf.TITLE] = dict(sha=lisbon, messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Plan three days in Lisbon. \x1b[31mred?\x1b[0m"},
        {"role": "assistant", "content": "Day 1: Alfama and the castle. Day 2: Belém."}],
        created=kvf.NOW - 26 * kvf.HOUR, updated=kvf.NOW - 2 * kvf.HOUR, model="smollm2-135m-instruct")
    # A file saved after the next turn was opened (chat/next_turn.py): no empty user message.
    opened = kvf.SESSION_TEXT + "<|im_start|>user\n"
    want["Opened next turn"] = dict(sha=kvf.titled_session(kv, title="Opened next turn", text=opened,
                                                           created=kvf.NOW - 30 * kvf.HOUR),
                                    messages=want[kvf.TITLE]["messages"], created=kvf.NOW - 30 * kvf.HOUR)
    gemma = published("gemma3", "<bos>", TURNS)
    want["Gemma colours"] = dict(sha=kvf.titled_session(kv, title="Gemma colours", text=gemma,
                                                        created=kvf.NOW - 40 * kvf.HOUR), messages=TURNS)
    system = {"role": "system", "content": "Be brief."}
    llama = published("llama3_2", "<|begin_of_text|>", [system, *TURNS])
    # Llama 3.2's template writes its own dates into the system turn: that is the text's system prompt.
    llama_system = {"role": "system", "content": "Cutting Knowledge Date: December 2023\nToday Date: 01 Mar 2025\n\nBe brief."}
    want["Llama colours"] = dict(sha=kvf.titled_session(kv, title="Llama colours", text=llama,
                                                        created=kvf.NOW - 41 * kvf.HOUR),
                                 messages=[llama_system, *TURNS])
    dsv4 = Dsv4ChatTemplate().render([system, *TURNS], add_generation_prompt=False)
    want["DeepSeek colours"] = dict(sha=kvf.titled_session(kv, title="DeepSeek colours", text=dsv4,
                                                           created=kvf.NOW - 42 * kvf.HOUR),
                                    messages=[system, *TURNS])
    remember(kv, kvf.FINGERPRINT.hex(), "smollm2-135m-instruct")  # the memo a chat on that model left
    # Not chats: an untitled checkpoint and a ds4 prefix file.
    kvf.cold_checkpoint(kv)
    kvf.ds4_file(kv)

    store = Transcripts(tr)
    for i, (title, engine, model) in enumerate([("Remote poem", "http://127.0.0.1:8080", "qwen2.5-0.5b"),
                                                ("Remote \x1b]0;evil\x07 recipe", "http://gpu-box:9000/v1", "llama")]):
        name = store.new_name()
        messages = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        store.save(Transcript(sha=name, title=title, created_at=1_700_000_000 + i, messages=messages,
                              engine=engine, model=model))
        want[title] = dict(json=name, messages=messages, engine=engine, model=model, created=1_700_000_000 + i)
    return kv, tr, want


def broken_files(kv: Path, tr: Path) -> dict[str, str]:
    """Files an import must skip, each with the words its reason must hold."""
    out = {}
    t = kvf.SESSION_TEXT.encode()
    title = b"Cut short"
    cut = kvf.header(tokens=64, text_bytes=len(t), payload_bytes=4096, reason=6, ext=0x08) + t + bytes(10)
    out[kvf.write(kv, kvf.titled_sha(title, kvf.NOW), cut)] = "payload"
    out[kvf.titled_session(kv, title="Plain text", text="no template wrote this",
                           created=kvf.NOW - 50 * kvf.HOUR)] = "chat template"
    out[kvf.titled_session(kv, title="Only a system prompt", text=kvf.COLD_TEXT,
                           created=kvf.NOW - 51 * kvf.HOUR)] = "no user message"
    bad = "ab" * 16
    (tr / f"{bad}.json").write_text("{not json")
    out[bad] = "unreadable"
    other = "cd" * 16
    (tr / f"{other}.json").write_text(json.dumps({"format": "someone-else", "messages": []}))
    out[other] = "not a ds4tui transcript"
    (tr / "notes.json").write_text("[]")  # not a name the chat makes: ignored, not even skipped
    return out


def by_title(store) -> dict[str, object]:
    return {c.title: store.load(c.id) for c in store.list()}


def test_every_chat_title_and_message_comes_through_once(tmp_path):
    kv, tr, want = old_user_dirs(tmp_path)
    store = open_store(tmp_path / "conversations.sqlite3")
    report = import_existing(store, kv, tr)
    assert report.error is None and report.skipped == []
    assert report.imported == len(want) == 7 and len(report.chats) == 7
    chats = by_title(store)
    assert set(chats) == set(want)
    for title, expect in want.items():
        chat = chats[title]
        assert list(chat.messages) == expect["messages"], title
        assert chat.system_prompt == next((m["content"] for m in expect["messages"][:1] if m["role"] == "system"),
                                          None)
        if "sha" in expect:
            assert chat.engine == "local" and chat.kv_sha == expect["sha"] and chat.kv_tokens == 64
        else:
            assert (chat.engine, chat.model, chat.kv_sha) == (expect["engine"], expect["model"], None)
        if "created" in expect:
            assert chat.created_at == expect["created"]
        if "updated" in expect:
            assert chat.updated_at == expect["updated"]
        if "model" in expect:
            assert chat.model == expect["model"]
    # The chat list keeps the old order: the transcripts' files were written last, the .kv files
    # were last used two hours before NOW.
    assert store.list()[-1].updated_at == kvf.NOW - 2 * kvf.HOUR

    again = import_existing(store, kv, tr)
    assert (again.imported, again.already, again.skipped) == (0, 7, [])
    assert len(store.list()) == 7
    store.close()
    # And after a restart, from the file.
    reopened = open_store(tmp_path / "conversations.sqlite3")
    assert import_existing(reopened, kv, tr).imported == 0 and set(by_title(reopened)) == set(want)


def test_unreadable_files_are_skipped_with_their_reason(tmp_path):
    kv, tr, want = old_user_dirs(tmp_path)
    broken = broken_files(kv, tr)
    store = open_store(None)
    report = import_existing(store, kv, tr)
    assert report.imported == len(want) and report.error is None
    reasons = {Path(path).stem: why for path, why in report.skipped}
    assert set(reasons) == set(broken)
    for name, words in broken.items():
        assert words in reasons[name], reasons[name]
    assert "skipped" in report.summary() and "imported 7 chats" in report.summary()
    # Skipped files stay skipped, and nothing is imported twice.
    again = import_existing(store, kv, tr)
    assert again.imported == 0 and len(again.skipped) == len(broken)


def test_a_chat_of_this_ds4tui_is_not_imported_again_from_its_titled_file(tmp_path):
    """After the store exists, a chat's titled file is its cache: the chat points at it."""
    kv = tmp_path / "kv"
    sha = kvf.titled_session(kv)
    store = open_store(None)
    mine = store.create(title=kvf.TITLE)
    store.commit(mine, [{"role": "user", "content": "x"}], kv_sha=sha, kv_tokens=64)
    report = import_existing(store, kv, None)
    assert (report.imported, report.already) == (0, 1) and [c.id for c in store.list()] == [mine]


def test_a_deleted_import_is_not_brought_back(tmp_path):
    kv, tr, want = old_user_dirs(tmp_path)
    store = open_store(None)
    import_existing(store, kv, tr)
    gone = store.find("Gemma colours")[0]
    store.delete(gone.id)
    assert import_existing(store, kv, tr).imported == 0
    assert "Gemma colours" not in by_title(store)


@pytest.mark.parametrize("make", ["missing", "a file", "unreadable"])
def test_directories_that_cannot_be_read_are_reported_not_raised(tmp_path, make):
    import os

    kv, tr = tmp_path / "kv", tmp_path / "tr"
    if make == "a file":
        kv.write_text("x")
        tr.write_text("x")
    elif make == "unreadable":
        kvf.titled_session(kv)
        tr.mkdir()
        kv.chmod(0)
        tr.chmod(0)
    try:
        report = import_existing(open_store(None), kv, tr)
    finally:
        for d in (kv, tr):
            if d.is_dir():
                d.chmod(0o755)
    if make == "missing" or (make == "unreadable" and os.geteuid() == 0):
        assert report.skipped == []  # root reads anything; a missing dir holds nothing
    else:
        assert {Path(p) for p, _ in report.skipped} == {kv, tr}
    assert report.error is None


def test_a_store_that_fails_stops_the_import_in_one_line(tmp_path):
    kv, tr, _ = old_user_dirs(tmp_path)
    store = open_store(None)
    store.close()
    report = import_existing(store, kv, tr)
    assert report.imported == 0 and report.error and "\n" not in report.error
    assert "stopped" in report.summary()


def test_chats_a_controller_saved_come_through_as_it_held_them(tmp_path):
    """Real files: titled sessions the chat controller wrote on tiny-llama (its template adds
    a default system prompt, which the text holds and so the import does)."""
    from ds4tui.engine.loader import load_model
    from tests.chat.conftest import Recorder, make_controller

    model = load_model("tiny-llama")
    kv = tmp_path / "kv"
    ctl = make_controller(model, kv, max_tokens=4)
    a = ctl.new_conversation()
    ctl.send(a.key, "Where is the lighthouse keeper?", Recorder())
    ctl.send(a.key, "And the harbour?", Recorder())
    b = ctl.new_conversation("Answer in French.")
    ctl.send(b.key, "Something else entirely.", Recorder())
    ctl.rename(b.key, "Groceries")
    store = open_store(None)
    report = import_existing(store, kv, None)
    assert (report.imported, report.skipped) == (2, [])
    chats = {c.kv_sha: store.load(c.id) for c in store.list()}
    assert set(chats) == {a.saved_sha, b.saved_sha}
    for conv in (a, b):
        chat = chats[conv.saved_sha]
        rendered = model.chat.render(list(chat.messages), add_generation_prompt=False)
        assert rendered == model.chat.render(conv.messages, add_generation_prompt=False)
        assert [m for m in chat.messages if m["role"] != "system"] == [m for m in conv.messages
                                                                     if m["role"] != "system"]
        assert chat.title == conv.title and chat.created_at == conv.created_at
    assert chats[b.saved_sha].system_prompt == "Answer in French." and chats[b.saved_sha].title == "Groceries"
