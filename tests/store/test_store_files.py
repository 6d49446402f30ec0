"""The store's file under bad conditions: migrations, a newer schema, corrupt or foreign
files, a lock held by another process, a read-only disk, two writers, kill -9."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from ds4tui.store import open_store
from ds4tui.store.schema import SCHEMA_VERSION, migrate, version_of


def _untouched(path, before: bytes) -> None:
    assert path.read_bytes() == before
    assert not (path.parent / (path.name + "-wal")).exists()


def test_migration_1_to_2_keeps_every_row_and_adds_archive(tmp_path):
    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, target=1)
    assert version_of(db) == 1
    db.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('c1', 'old', 1, 2)")
    db.execute("INSERT INTO messages (conversation, parent, role, content, created_at) "
               "VALUES ('c1', NULL, 'user', 'hello', 1)")
    db.close()

    store = open_store(path)
    assert store.notice is None
    chat = store.get("c1")
    assert chat.title == "old" and chat.archived is False
    db = sqlite3.connect(path)
    assert version_of(db) == SCHEMA_VERSION == 2


def test_a_new_file_is_created_at_the_current_version_in_wal_mode(tmp_path):
    path = tmp_path / "sub" / "h.sqlite3"
    open_store(path).create(title="x")
    db = sqlite3.connect(path)
    assert version_of(db) == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_file_from_a_newer_ds4tui_is_not_touched(tmp_path):
    path = tmp_path / "h.sqlite3"
    open_store(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=DELETE")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    db.close()
    before = path.read_bytes()
    store = open_store(path)
    assert store.in_memory and "newer ds4tui" in store.notice and "in memory" in store.notice
    store.create(title="goes to memory")
    _untouched(path, before)


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_a_corrupt_file_is_reported_in_one_line_and_left_alone(tmp_path, content):
    path = tmp_path / "h.sqlite3"
    path.write_bytes(content)
    store = open_store(path)
    assert store.in_memory and "\n" not in store.notice and str(path) in store.notice
    assert store.list() == []
    _untouched(path, content)


def test_an_sqlite_file_of_another_program_is_left_alone(tmp_path):
    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE bookmarks (url TEXT)")
    db.commit()
    db.close()
    before = path.read_bytes()
    store = open_store(path)
    assert store.in_memory and "something else" in store.notice
    _untouched(path, before)


def test_a_read_only_disk_gives_an_in_memory_store(tmp_path):
    if os.geteuid() == 0:
        # root writes through permission bits; a read-only file is still refused by its mode
        path = tmp_path / "h.sqlite3"
        open_store(path).close()
        os.chmod(path, 0o444)
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        os.chmod(ro, 0o555)
        path = ro / "h.sqlite3"
    store = open_store(path)
    assert store.in_memory and ("read-only" in store.notice or "not writable" in store.notice)
    store.create(title="kept in memory")
    assert [c.title for c in store.list()] == ["kept in memory"]


LOCKER = textwrap.dedent("""
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    time.sleep(60)
""")


def test_a_file_locked_by_another_process_gives_an_in_memory_store(tmp_path):
    path = tmp_path / "h.sqlite3"
    open_store(path).close()
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        store = open_store(path)
        assert store.in_memory and "locked by another process" in store.notice
    finally:
        locker.kill()
        locker.wait()
    assert open_store(path).notice is None  # once the other process lets go


WRITER = textwrap.dedent("""
    import sys
    from ds4tui.store import open_store
    store = open_store(sys.argv[1])
    assert store.notice is None, store.notice
    name, turns = sys.argv[2], int(sys.argv[3])
    chat = store.create(title=name)
    messages = []
    for i in range(turns):
        messages += [{"role": "user", "content": f"{name} q{i}"}, {"role": "assistant", "content": f"{name} a{i}"}]
        store.commit(chat, messages)
        print(chat, i, flush=True)
""")


def test_two_processes_write_one_store_and_lose_nothing(tmp_path):
    path = tmp_path / "h.sqlite3"
    open_store(path).close()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, "40"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for name in ("chat", "serve")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    store = open_store(path)
    assert store.integrity() == "ok"
    for (out, _), name in zip(outs, ("chat", "serve")):
        chat_id = out.split()[0]
        loaded = store.load(chat_id)
        assert len(loaded.messages) == 80 and loaded.messages[-1]["content"] == f"{name} a39"


KILLED = textwrap.dedent("""
    import sys
    from ds4tui.store import open_store
    store = open_store(sys.argv[1])
    chat = store.create(title="killed")
    messages = []
    i = 0
    while True:
        messages += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "x" * 2000 + str(i)}]
        store.commit(chat, messages)
        sys.stdout.write(f"{chat} {i}\\n")
        sys.stdout.flush()
        i += 1
""")


def test_kill_9_during_writes_loses_no_committed_turn(tmp_path):
    """20 kills at random points of a writing loop: the file opens, checks ok, and holds every
    turn the writer said it had committed."""
    path = tmp_path / "h.sqlite3"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    import random

    rng = random.Random(7)
    for round_ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", KILLED, str(path)], stdout=subprocess.PIPE, text=True,
                                stderr=subprocess.PIPE,
                                env=env)
        first = proc.stdout.readline().split()  # at least one commit before the kill
        assert first, proc.stderr.read()
        time.sleep(rng.uniform(0.0, 0.05))
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate()
        # Only whole lines count: the kill may cut the last one short.
        lines = [first] + [line.split() for line in rest.split("\n")[:-1] if len(line.split()) == 2]
        chat_id, last = lines[-1][0], int(lines[-1][1])
        store = open_store(path)
        assert store.notice is None and store.integrity() == "ok"
        loaded = store.load(chat_id)
        assert len(loaded.messages) >= 2 * (last + 1), round_
        store.close()
