"""The header index: a listing opens only files whose version it does not hold, and never
believes it over a file that changed."""

from __future__ import annotations

import os
import random

from ds4tui.cache import Acceptor, KvStore, entry as entry_mod
from ds4tui.cache.index import INDEX_NAME
from ds4tui.cache.prefixes import PrefixTree
from tests.cache.kvc_builders import dsv4_payload, title_trailer, titled_name, write_kv

PAST = 1_700_000_000


def _dir(tmp_path, n=6):
    d = tmp_path / "kv"
    for i in range(n):
        write_kv(d, f"<|im_start|>user\nquestion {i}<|im_end|>\n".encode(), dsv4_payload(5), tokens=5, model=0x80, abi=128)
    title = b"a titled chat"
    write_kv(d, b"<|im_start|>user\nquestion 0<|im_end|>\nmore", dsv4_payload(5), tokens=5, model=0x80, abi=128,
             ext=1 << 3, trailers=title_trailer(title), name=titled_name(title, PAST), created=PAST)
    for p in d.iterdir():
        os.utime(p, (PAST, PAST))  # older than the index's racy window
    return d


def _opens(monkeypatch) -> list:
    seen = []
    real = entry_mod.open_regular

    def counting(path, **kw):
        seen.append(os.path.basename(path))
        return real(path, **kw)
    monkeypatch.setattr(entry_mod, "open_regular", counting)
    return seen


def _view(entries):
    return sorted(repr((e.to_json(), e.superseded, e.held_by, e.score)) for e in entries)


def test_a_second_listing_opens_no_file_and_says_the_same(tmp_path, monkeypatch):
    d = _dir(tmp_path)
    first = KvStore(d).entries()
    assert (d / INDEX_NAME).exists()
    opens = _opens(monkeypatch)
    again = KvStore(d).entries()  # a fresh process's listing, from the index
    assert opens == []
    assert _view(again) == _view(first)
    assert any(e.held_by for e in again)  # relations come from the indexed texts


def test_a_file_changed_in_place_or_replaced_is_read_again(tmp_path, monkeypatch):
    d = _dir(tmp_path)
    store = KvStore(d)
    entries = store.entries()
    victim = entries[0]
    assert store.set_pinned(victim.sha, True)  # a header write in place: the mtime moves
    opens = _opens(monkeypatch)
    again = {e.sha: e for e in KvStore(d).entries()}
    assert again[victim.sha].pinned
    assert opens == [os.path.basename(victim.path)]


def test_a_file_written_just_now_is_not_trusted_from_the_index(tmp_path, monkeypatch):
    d = _dir(tmp_path)
    fresh = write_kv(d, b"just written", dsv4_payload(5), tokens=5, model=0x80, abi=128)
    KvStore(d).entries()
    opens = _opens(monkeypatch)
    KvStore(d).entries()
    assert opens == [fresh.name]  # within the racy window of its mtime: read again


def test_a_damaged_or_foreign_index_is_ignored(tmp_path):
    d = _dir(tmp_path)
    expect = _view(KvStore(d).entries())
    (d / INDEX_NAME).write_bytes(b"not a database at all" * 100)
    assert _view(KvStore(d).entries()) == expect
    import sqlite3
    (d / INDEX_NAME).unlink()
    KvStore(d).entries()
    db = sqlite3.connect(d / INDEX_NAME)
    db.execute("UPDATE files SET entry = '{\"sha\": 1}'")  # rows this code did not write
    db.commit()
    db.close()
    assert _view(KvStore(d).entries()) == expect


def test_the_prefix_tree_agrees_with_comparing_every_pair():
    rng = random.Random(3)
    texts = {}
    for i in range(300):
        base = rng.choice([b"", b"sys A ", b"sys B ", b"sys A more "])
        texts[i] = base + bytes(rng.choice(b"ab") for _ in range(rng.randrange(0, 6)))
    tree = PrefixTree(texts)
    for k, t in texts.items():
        assert sorted(tree.prefixes(k)) == sorted(j for j, u in texts.items() if len(u) < len(t) and t.startswith(u))
        assert sorted(tree.extensions(k)) == sorted(j for j, u in texts.items() if len(u) > len(t) and u.startswith(t))
        assert sorted(tree.same(k)) == sorted(j for j, u in texts.items() if u == t)


def test_a_verified_listing_leaves_the_plain_listing_unchecked(tmp_path):
    from ds4tui.cache import Acceptor

    d = tmp_path / "kv"
    store = KvStore(d)
    data = bytes(300)
    res = store.save("a checksummed file", tokens=5, reason="cold", payload_bytes=len(data),
                     engine=Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8), write_payload=lambda fp: fp.write(data))
    os.utime(res.event.path, (PAST, PAST))
    assert [e.checksum for e in KvStore(d).entries(verify=True)] == ["ok"]
    assert [e.checksum for e in KvStore(d).entries()] == ["unchecked"]  # as the README says of kv ls


def test_a_checksum_read_once_is_not_read_again_by_the_next_browser(tmp_path, monkeypatch):
    from ds4tui.cache import Acceptor, scan as cache_scan

    d = tmp_path / "kv"
    store = KvStore(d)
    data = bytes(300)
    engine = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)
    res = store.save("a checksummed file", tokens=5, reason="cold", payload_bytes=len(data),
                     engine=engine, write_payload=lambda fp: fp.write(data))
    os.utime(res.event.path, (PAST, PAST))

    def browse():
        result = cache_scan.scan(KvStore(d), engine, gen=1, now=0.0, texts=cache_scan.TextIndex(),
                                 checksums=cache_scan.ChecksumIndex())
        return [e.checksum for e in result.entries]

    assert browse() == ["ok"]
    reads = []
    real = cache_scan.inspect_file
    monkeypatch.setattr(cache_scan, "inspect_file", lambda *a, **kw: reads.append(a) or real(*a, **kw))
    assert KvStore(d).set_pinned(res.event.sha, True)  # a header write: the checksum still holds
    assert browse() == ["ok"] and reads == []          # a new browser: the verdict from the index


def _lookup_paths(d, prompt):
    acceptor = Acceptor(model_id=0x80, ctx_size=32768, quant_bits=4)
    return [os.path.basename(e.path) for e in KvStore(d).lookup(prompt, acceptor)]


def test_a_lookup_builds_only_the_files_whose_indexed_text_can_match(tmp_path, monkeypatch):
    from ds4tui.cache import lookup as lookup_mod

    d = _dir(tmp_path)
    prompt = b"<|im_start|>user\nquestion 0<|im_end|>\nmore and more"
    KvStore(d).entries()  # builds the index
    built = []
    real = lookup_mod.entry_from_record

    def counting(path, *a, **kw):
        built.append(os.path.basename(path))
        return real(path, *a, **kw)
    monkeypatch.setattr(lookup_mod, "entry_from_record", counting)
    found = _lookup_paths(d, prompt)
    assert len(found) == 2  # the titled chat ("... more"), then "question 0" itself
    assert sorted(built) == sorted(found)  # the five other files were ruled out from their rows
    os.unlink(d / INDEX_NAME)
    assert _lookup_paths(d, prompt) == found  # what reading every file finds


def test_a_lookup_does_not_rule_out_a_file_its_index_row_no_longer_describes(tmp_path):
    d = _dir(tmp_path)
    title = b"a titled chat"
    KvStore(d).entries()
    titled = next(p for p in d.iterdir() if p.name == titled_name(title, PAST))
    prompt = b"<|im_start|>user\nquestion 5<|im_end|>\nand now something else"
    assert titled.name not in _lookup_paths(d, prompt)
    # The same titled session re-saved with another text: its row is stale, the file is read.
    write_kv(d, b"<|im_start|>user\nquestion 5<|im_end|>\nand now", dsv4_payload(5), tokens=5, model=0x80,
             abi=128, ext=1 << 3, trailers=title_trailer(title), name=titled.name, created=PAST)
    os.utime(titled, (PAST + 10, PAST + 10))
    assert _lookup_paths(d, prompt)[0] == titled.name
