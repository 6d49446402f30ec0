"""CacheWatcher: another process creates, rewrites in place and removes `.kv` files; batches follow."""

from __future__ import annotations

import queue
import subprocess
import sys
import textwrap

import pytest

from ds4tui.cache.watch import CacheChanges, CacheWatcher

SHA_A = "a" * 40
SHA_B = "b" * 40
SHA_C = "c" * 40
TIMEOUT_S = 120.0  # a hang guard: a busy machine can delay a batch by seconds

# Runs in a separate interpreter so the events come from another process, as
# they do when ds4-server or a second ds4tui shares the cache directory.
_HELPER = textwrap.dedent(
    """
    import os, sys
    d, op, sha = sys.argv[1:4]
    kv = os.path.join(d, sha + ".kv")
    if op == "create":      # the store's way: write a tmp file, then rename it into place
        tmp = os.path.join(d, sha + ".kv.tmp.1.ab")
        with open(tmp, "wb") as f:
            f.write(b"KVC" + bytes(100))
        os.replace(tmp, kv)
    elif op == "touch":     # a cache hit: hits/last_used rewritten in place
        with open(kv, "r+b") as f:
            f.seek(12)
            f.write(b"\\x07\\x00\\x00\\x00")
    elif op == "read":
        with open(kv, "rb") as f:
            f.read()
    elif op == "remove":
        os.remove(kv)
    elif op == "junk":      # names that are not checkpoints
        open(os.path.join(d, "notes.txt"), "w").close()
        open(os.path.join(d, sha + ".kv.tmp.1.ab"), "w").close()
    """
)


def _other_process(directory, op: str, sha: str) -> None:
    subprocess.run([sys.executable, "-c", _HELPER, str(directory), op, sha], check=True)


def _next_batch(batches: queue.Queue) -> CacheChanges:
    try:
        return batches.get(timeout=TIMEOUT_S)
    except queue.Empty:
        pytest.fail(f"no change reported within {TIMEOUT_S}s")


@pytest.fixture(params=[False, True], ids=["inotify", "polling"])
def watched(request, tmp_path):
    batches: queue.Queue[CacheChanges] = queue.Queue()
    with CacheWatcher(tmp_path, batches.put, polling=request.param):
        yield tmp_path, batches


def test_follows_create_touch_remove_from_another_process(watched):
    """Each step another process takes on a .kv file arrives as a batch naming that file's SHA."""
    directory, batches = watched
    for op in ("create", "touch", "remove"):
        _other_process(directory, op, SHA_A)
        batch = _next_batch(batches)
        assert batch.shas == {SHA_A}, op
        # An owner learns its file went (an eviction or a delete elsewhere), and only then.
        assert batch.removed == ({SHA_A} if op == "remove" else set()), op


def test_reads_tmp_files_and_other_names_are_not_changes(watched):
    """Reading a .kv file, or writing non-.kv names, reports nothing: the next batch names only the next real change."""
    directory, batches = watched
    _other_process(directory, "create", SHA_A)
    assert _next_batch(batches).shas == {SHA_A}
    _other_process(directory, "read", SHA_A)
    _other_process(directory, "junk", SHA_C)
    _other_process(directory, "create", SHA_B)
    assert _next_batch(batches).shas == {SHA_B}


def test_directory_removed_is_reported(tmp_path):
    """Deleting the watched directory itself is reported, so the caller can rescan."""
    directory = tmp_path / "kv"
    directory.mkdir()
    batches: queue.Queue[CacheChanges] = queue.Queue()
    with CacheWatcher(directory, batches.put):
        directory.rmdir()
        assert _next_batch(batches).directory_gone


def test_missing_directory_is_an_error(tmp_path):
    """Watching a directory that does not exist fails at once instead of watching nothing."""
    with pytest.raises(FileNotFoundError):
        CacheWatcher(tmp_path / "nope", lambda c: None).start()


def test_watch_imports_no_ui_or_torch():
    """The watcher is part of the UI-free cache package: importing it loads no textual, rich or torch."""
    code = (
        "import sys, ds4tui.cache.watch\n"
        "sys.exit(len([m for m in ('torch', 'textual', 'rich') if m in sys.modules]))\n"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=300).returncode == 0
