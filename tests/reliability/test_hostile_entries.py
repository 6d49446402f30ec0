"""Hostile names in a cache directory: nothing blocks, nothing is followed, nothing outside is written.

Each entry is named like a cache file (`<40 hex>.kv`). Every operation runs
under an alarm, so a regression that blocks on a FIFO fails instead of hanging.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
from contextlib import contextmanager

import pytest

from ds4tui.cache import Acceptor, KvStore
from ds4tui.cache.safe_open import SKIPPED
from ds4tui.cli import main as cli_main
from tests.cache.kvc_builders import dsv4_payload, write_kv

ENGINE = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)


@contextmanager
def deadline(seconds: int = 10):
    def boom(*_):
        raise TimeoutError("blocked")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def name(tag: str) -> str:
    return hashlib.sha1(tag.encode()).hexdigest() + ".kv"


def good_file(directory, text=b"hello world", tokens=5, abi=128, model=0x80):
    return write_kv(directory, text, dsv4_payload(tokens, body=b"\0" * 64), tokens=tokens, abi=abi,
                    model=model, quant=8, ctx=4096)


@pytest.fixture
def hostile(tmp_path):
    """A cache dir holding one good file and one of each hostile kind, plus a file outside it."""
    d = tmp_path / "kv"
    d.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    target = good_file(outside, b"outside text")  # a real KVC file outside the directory
    os.mkfifo(d / name("fifo"))
    (d / name("dir")).mkdir()
    os.symlink(target, d / name("link-out"))
    good = good_file(d)
    os.symlink(good, d / name("link-in"))
    os.symlink(d / "missing", d / name("link-dangling"))
    return d, good, target


def test_scan_lists_every_hostile_entry_as_skipped_without_blocking(hostile):
    d, good, _ = hostile
    with deadline():
        entries = {os.path.basename(e.path): e for e in KvStore(d).entries()}
    assert entries[good.name].valid
    for tag, kind in (("fifo", "fifo"), ("dir", "directory"), ("link-out", "symlink"),
                      ("link-in", "symlink"), ("link-dangling", "symlink")):
        e = entries[name(tag)]
        assert e.error == f"{SKIPPED} ({kind})" and not e.regular and e.file_bytes == 0


def test_touch_and_pin_never_write_through_a_symlink(hostile):
    d, _, target = hostile
    before = target.read_bytes()
    store = KvStore(d)
    sha = name("link-out")[:40]
    with deadline():
        assert not store.touch(sha)
        assert not store.set_pinned(sha, True)
    assert target.read_bytes() == before


def test_eviction_never_removes_a_hostile_entry(hostile):
    d, good, target = hostile
    with deadline():
        ev = KvStore(d, budget_mb=0).evict()
    assert [f.sha for f in ev.files] == [good.name[:40]]
    assert stat.S_ISFIFO(os.lstat(d / name("fifo")).st_mode)
    assert os.path.islink(d / name("link-out")) and target.exists()
    assert (d / name("dir")).is_dir()


def test_load_of_a_fifo_named_session_is_a_rejection(hostile):
    d, _, _ = hostile
    with deadline():
        result = KvStore(d).load_file(name("fifo")[:40], ENGINE, lambda fp, n: None)
    assert result.hit is None and SKIPPED in result.event.reason


def test_lookup_and_save_go_on_beside_hostile_entries(hostile):
    d, _, _ = hostile
    store = KvStore(d)
    data = dsv4_payload(7, body=b"\1" * 100)
    with deadline():
        saved = store.save(b"new prompt", tokens=7, reason="cold", engine=ENGINE, payload_bytes=len(data),
                           write_payload=lambda fp: fp.write(data))
        assert saved.ok
        assert store.load(b"new prompt and more", ENGINE, lambda fp, n: fp.read(n) and 7).hit is not None


def test_unreadable_file_is_listed_not_fatal(tmp_path, monkeypatch):
    d = tmp_path / "kv"
    p = good_file(d)
    real_open = os.open

    def deny(path, flags, *a, **kw):  # root ignores mode 000, so refuse the open itself
        if str(path) == str(p):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **kw)
    monkeypatch.setattr(os, "open", deny)
    [e] = KvStore(d).entries()
    assert not e.valid and not e.corrupt and e.error == "cannot read: Permission denied"


def test_cli_over_hostile_entries(hostile, capsys):
    d, good, _ = hostile
    with deadline():
        assert cli_main(["kv", "ls", "--dir", str(d)]) == 0
        out = capsys.readouterr().out
        assert out.count(SKIPPED) == 5
        assert cli_main(["kv", "evict", "--dir", str(d), "--dry-run", "--budget-mb", "0"]) == 0
        capsys.readouterr()
        assert cli_main(["kv", "inspect", "--dir", str(d), "--json", name("fifo")[:12]]) == 1
        assert json.loads(capsys.readouterr().out)["error"] == f"{SKIPPED} (fifo)"
        assert cli_main(["kv", "rm", "--dir", str(d), name("dir")[:12]]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot remove" in err and (d / name("dir")).is_dir()
        assert cli_main(["kv", "rm", "--dir", str(d), name("link-out")[:12]]) == 0  # the link, not its target
        assert not os.path.lexists(d / name("link-out"))


def test_cli_cache_dir_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "notadir"
    f.write_text("x")
    for argv in (["kv", "ls"], ["kv", "evict"], ["kv", "inspect", "abc"], ["kv", "rm", "abc"],
                 ["kv", "pin", "abc"], ["--resume", "x", "--model", "tiny-llama"]):
        flag = "--cache-dir" if argv[0] == "--resume" else "--dir"
        assert cli_main(argv + [flag, str(f)]) == 1, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is not a directory" in err, (argv, err)


def test_cli_read_only_dir_refuses_writes_in_one_line(tmp_path, capsys, monkeypatch):
    d = tmp_path / "kv"
    good = good_file(d)
    real_access = os.access
    # Root ignores mode bits, so the read-only directory is what os.access reports.
    monkeypatch.setattr(os, "access", lambda p, m, **kw: False if (m & os.W_OK and str(p) == str(d))
                        else real_access(p, m, **kw))
    assert cli_main(["kv", "ls", "--dir", str(d)]) == 0
    capsys.readouterr()
    assert cli_main(["kv", "rm", "--dir", str(d), good.name[:8]]) == 1
    err = capsys.readouterr().err
    assert err.strip().endswith("read-only") and err.count("\n") == 1 and good.exists()


def test_inspect_empty_name(capsys):
    assert cli_main(["kv", "inspect", ""]) == 1
    assert "empty" in capsys.readouterr().err


def test_sparse_giant_claiming_4gib_of_text_is_rejected_from_the_header(tmp_path, capsys):
    """50 GB on paper, text_bytes = 2^32-1: rejected by the length bound, nothing read or allocated."""
    from tests.cache.kvc_builders import header_bytes

    d = tmp_path / "kv"
    d.mkdir()
    p = d / name("sparse")
    with open(p, "wb") as fp:
        fp.write(header_bytes(tokens=1000, text_bytes=2**32 - 1, payload_bytes=1 << 30, abi=128, model=0x80,
                              quant=8, ctx=4096, ext=0x08))
        fp.truncate(50 * 10**9)
    store = KvStore(d)
    with deadline(10):
        [e] = store.entries()
        assert not e.valid and "exceeds the bound" in e.error
        assert cli_main(["kv", "ls", "--dir", str(d)]) == 0
        assert "exceeds the bound" in capsys.readouterr().out
        result = store.load_file(p.name[:40], ENGINE, lambda fp, n: pytest.fail("payload read"))
    assert result.hit is None and "exceeds the bound" in result.events[0].reason
    assert p.exists() and not result.events[0].deleted  # titled (ext bit 3): kept, listed as corrupt
