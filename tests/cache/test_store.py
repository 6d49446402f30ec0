"""The store over one directory: save/load, the validation chain, budget, pins, eviction order."""

from __future__ import annotations

import errno
import hashlib
import os
import struct
from pathlib import Path

import pytest

from ds4tui.cache import Acceptor, CachePolicy, Hit, KvStore, Miss, Rejected, Saved, SaveFailed, inspect_file
from ds4tui.cache import eviction
from ds4tui.cache.events import Evicted
from ds4tui.cache.index import INDEX_NAME
from ds4tui.cache.loading import LoadWithText
from ds4tui.format.kvc import EXT_PINNED, parse_kvc
from tests.cache.kvc_builders import dsv4_payload, header_bytes, titled_name, write_kv

ENGINE = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)
NOW = 1_800_000_000
HOUR = 3600


class Clock:
    def __init__(self, t=NOW):
        self.t = t

    def __call__(self):
        return self.t


def payload_writer(tokens: int, size: int):
    """A DSV4-framed payload of exactly `size` bytes."""
    data = dsv4_payload(tokens, body=b"\xab" * (size - 52))

    def write(fp):
        fp.write(data)
    return write, len(data)


def loader(record: list | None = None):
    def load(fp, nbytes):
        data = fp.read(nbytes)
        if record is not None:
            record.append(data)
        return struct.unpack_from("<I", data, 28)[0] if data[:4] == b"DSV4" else None
    return load


def save(store, text, tokens=100, size=1000, reason="continued", **kw):
    write, n = payload_writer(tokens, size)
    return store.save(text, tokens=tokens, reason=reason, engine=ENGINE, payload_bytes=n,
                      write_payload=write, **kw)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    return KvStore(tmp_path / "kv", CachePolicy(), budget_mb=1, clock=clock)


def test_save_then_load_longest_prefix(store):
    """The longest stored byte prefix wins; the Hit carries the numbers the UI shows."""
    short = save(store, "system prompt", tokens=10).event
    long_ = save(store, "system prompt, user: hi", tokens=20).event
    assert isinstance(short, Saved) and isinstance(long_, Saved)
    got = []
    res = store.load("system prompt, user: hi, assistant:", ENGINE, loader(got))
    hit = res.hit
    assert isinstance(hit, Hit) and hit.sha == long_.sha
    assert (hit.tokens, hit.text_bytes, hit.hits, hit.bytes) == (20, len("system prompt, user: hi"), 1, long_.bytes)
    assert got and len(got[0]) == 1000
    # The hit was counted in place.
    h = inspect_file(store.path_for(hit.sha)).header
    assert h.hits == 1 and h.last_used == NOW


def test_lookup_misses_and_filters_by_model_and_context(store):
    save(store, "abc")
    assert isinstance(store.load("xyz", ENGINE, loader()).event, Miss)
    assert store.lookup("abcdef", Acceptor(model_id=0x81, ctx_size=4096)) == []
    assert store.lookup("abcdef", Acceptor(model_id=0x80, ctx_size=2048)) == []  # written for 4096
    assert len(store.lookup("abcdef", Acceptor(model_id=0x80, ctx_size=8192))) == 1


def test_budget_holds_after_many_saves(store):
    for i in range(60):
        res = save(store, f"conversation {i} " + "x" * i, tokens=100 + i, size=50_000)
        assert res.ok
        total = sum(e.file_bytes for e in store.scan())
        assert total <= store.budget_bytes
    assert len(store.shas()) < 60


def test_a_file_that_cannot_fit_the_budget_with_headroom_is_refused(store):
    size = store.budget_bytes - 52 - 3  # the file would be exactly the budget: no room for 1%
    res = save(store, "big", size=size)
    assert isinstance(res.event, SaveFailed) and "does not fit" in res.event.reason
    assert store.shas() == []


def test_pinned_files_survive_eviction(store):
    pinned = save(store, "keep me", size=200_000, reason="continued").event
    assert store.set_pinned(pinned.sha, True)
    for i in range(30):
        save(store, f"filler {i}", size=100_000, reason="cold")
    assert pinned.sha in store.shas()
    assert store.evict(budget_bytes=0).bytes > 0
    assert store.shas() == [pinned.sha]
    # A save that fits only by evicting a pinned file is refused.
    res = save(store, "too big beside the pin", size=900_000)
    assert isinstance(res.event, SaveFailed) and "pinned" in res.event.reason


def test_pin_is_bit_7_written_in_place(store):
    sha = save(store, "pin me").event.sha
    before = store.path_for(sha).read_bytes()
    store.set_pinned(sha, True)
    after = store.path_for(sha).read_bytes()
    assert after[6] == before[6] | EXT_PINNED
    assert after[:6] + after[7:] == before[:6] + before[7:]
    store.set_pinned(sha, False)
    assert store.path_for(sha).read_bytes() == before


def test_tmp_files_are_never_listed_or_loaded(store, clock):
    text = b"hidden"
    sha = hashlib.sha1(text).hexdigest()
    # The writer (here: our parent process) is alive: a save in progress.
    tmp = write_kv(store.dir, text, dsv4_payload(5), name=f"{sha}.kv.tmp.{os.getppid()}.abcd", model=0x80,
                   abi=128, tokens=5, ctx=4096, quant=8)
    (store.dir / "notes.txt").write_text("not a cache file")
    assert store.shas() == [] and store.scan() == []
    assert isinstance(store.load(b"hidden and more", ENGINE, loader()).event, Miss)
    # A live writer's temp file is left alone unless stale (its PID may have been reused).
    store.evict()
    assert tmp.exists()
    os.utime(tmp, (0, 0))
    store.evict()
    assert not tmp.exists() and (store.dir / "notes.txt").exists()


def _ours(directory, text: bytes, tokens=5, payload=None, **kw):
    kw = {"model": 0x80, "abi": 128, "tokens": tokens, "ctx": 4096, "quant": 8, **kw}
    return write_kv(directory, text, dsv4_payload(tokens) if payload is None else payload, **kw)


def _load_one(store, path, prompt):
    sha = path.name[:40]
    return store.load_file(sha, ENGINE, loader(), prompt=prompt)


@pytest.mark.parametrize("case, reason, deleted", [
    ("truncated", "truncated file", True),
    ("bit-flipped text", "stored text hash does not match", True),
    ("wrong sha name", "stored text hash does not match", True),
    ("not a prefix", "not a byte prefix of the prompt", False),
    ("token count", "payload token count 9 != header tokens 5", True),
    ("zero tokens", "0 tokens", True),
    ("foreign abi", "not loadable here: payload ABI 2 (ds4)", False),
    ("other model", "not loadable here: written by deepseek-v4-flash", False),
    ("bigger context", "not loadable here: written for context 8192", False),
    ("future version", "not loadable here: KVC version 2", False),
    ("bad magic", "bad magic", True),
])
def test_each_bad_file_is_rejected_with_its_own_reason(store, case, reason, deleted):
    d = store.dir
    text = b"the stored prefix"
    if case == "truncated":
        path = _ours(d, text)
        path.write_bytes(path.read_bytes()[:-10])
    elif case == "bit-flipped text":
        path = _ours(d, text)
        data = bytearray(path.read_bytes())
        data[52 + 3] ^= 0x01
        path.write_bytes(bytes(data))
    elif case == "wrong sha name":
        path = _ours(d, text, name="0" * 40 + ".kv")
    elif case == "not a prefix":
        path = _ours(d, text)
    elif case == "token count":
        path = _ours(d, text, payload=dsv4_payload(9))
    elif case == "zero tokens":
        path = _ours(d, text, tokens=0, payload=dsv4_payload(0))
    elif case == "foreign abi":
        path = _ours(d, text, abi=2, model=0)
    elif case == "other model":
        path = _ours(d, text, model=0)
    elif case == "bigger context":
        path = _ours(d, text, ctx=8192)
    elif case == "future version":
        path = _ours(d, text, version=2)
    else:
        path = _ours(d, text)
        path.write_bytes(b"XVC" + path.read_bytes()[3:])
    prompt = b"something else entirely" if case == "not a prefix" else text + b" and the rest"
    res = _load_one(store, path, prompt)
    assert isinstance(res.event, Miss)
    rej = [e for e in res.events if isinstance(e, Rejected)]
    assert len(rej) == 1 and reason in rej[0].reason
    assert rej[0].deleted is deleted
    assert path.exists() is (not deleted)


def test_payload_loader_error_is_a_rejection_and_the_next_candidate_is_tried(store):
    save(store, "short prefix", tokens=10)
    long_sha = save(store, "short prefix and longer", tokens=20).event.sha
    calls = []

    def picky(fp, n):
        calls.append(n)
        if len(calls) == 1:
            raise RuntimeError("layer count 2 != model layers 30")
        return None

    res = store.load("short prefix and longer, then more", ENGINE, picky)
    assert isinstance(res.event, Hit) and res.event.tokens == 10
    rej = res.events[0]
    assert isinstance(rej, Rejected) and rej.file == long_sha and not rej.deleted
    assert "payload load failed: layer count 2 != model layers 30" in rej.reason
    assert store.path_for(long_sha).exists()


def test_a_loader_with_text_hears_each_candidates_text_before_its_payload(store):
    """LoadWithText: the chat's loader is told the text of the file it is loading (to prepare
    what follows it), for each candidate tried, after the checks before the payload."""
    save(store, "short prefix", tokens=10)
    save(store, "short prefix and longer", tokens=20)
    heard = []

    def load(fp, n, text):
        heard.append((text, len(fp.read(n))))
        if len(heard) == 1:
            raise RuntimeError("not this one")
        return 10

    res = store.load("short prefix and longer, then more", ENGINE, LoadWithText(load))
    assert isinstance(res.event, Hit) and res.event.tokens == 10
    assert heard == [(b"short prefix and longer", 1000), (b"short prefix", 1000)]


def test_restored_token_count_mismatch_is_corrupt(store):
    sha = save(store, "abc", tokens=7).event.sha
    res = store.load("abcd", ENGINE, lambda fp, n: 3)
    assert isinstance(res.event, Miss) and res.events[0].deleted
    assert not store.path_for(sha).exists()


def test_file_vanishing_between_scan_and_open_is_a_miss(store):
    save(store, "abc")

    class Racy(KvStore):
        def lookup(self, prompt, acceptor):
            found = super().lookup(prompt, acceptor)
            for e in found:
                os.unlink(e.path)
            return found

    racy = Racy(store.dir, budget_mb=1)
    res = racy.load("abcdef", ENGINE, loader())
    assert isinstance(res.event, Miss) and not [e for e in res.events if isinstance(e, Rejected)]


@pytest.mark.parametrize("failure, message", [
    (RuntimeError("tensor on meta device"), "payload writer failed: RuntimeError: tensor on meta device"),
    (OSError(errno.ENOSPC, "No space left on device"), "disk full (ENOSPC)"),
    ("short", "payload writer wrote 10 bytes, declared 1000"),
])
def test_a_failed_save_leaves_the_directory_as_it_was(store, failure, message):
    first = save(store, "existing checkpoint").event
    titled = save(store, "a titled session", title="My chat", created_at=123).event
    before = {p.name: p.read_bytes() for p in store.dir.iterdir() if p.name != INDEX_NAME}

    def write(fp):
        fp.write(b"x" * 10)
        if failure != "short":
            raise failure

    for kw in ({}, {"title": "My chat", "created_at": 123}):  # also a re-save over an existing file
        res = store.save("new text", tokens=1, reason="evict", engine=ENGINE, payload_bytes=1000,
                         write_payload=write, **kw)
        assert isinstance(res.event, SaveFailed) and message in res.event.reason
    after = {p.name: p.read_bytes() for p in store.dir.iterdir() if p.name != INDEX_NAME}  # the index: a cache
    assert after == before and {first.sha + ".kv", titled.sha + ".kv"} == set(after)


def test_identical_checkpoint_is_not_rewritten(store):
    first = save(store, "same text", tokens=12).event

    def never(fp):
        raise AssertionError("payload must not be written again")

    res = store.save("same text", tokens=12, reason="evict", engine=ENGINE, payload_bytes=1000, write_payload=never)
    assert res.event.reused and res.event.sha == first.sha


def test_titled_session_is_named_by_title_and_created_at(store):
    res = save(store, "transcript v1", title="Trip plan", created_at=1234, reason="agent-session")
    assert res.event.path.endswith(titled_name("Trip plan".encode(), 1234))
    again = save(store, "transcript v1 and more", tokens=150, title="Trip plan", created_at=1234)
    assert again.event.sha == res.event.sha and len(store.shas()) == 1
    loaded = store.load_file(res.event.sha, ENGINE, loader())
    assert loaded.hit.title == "Trip plan" and loaded.hit.tokens == 150
    # A titled file is found by the text it holds (its name is not a text hash).
    found = store.lookup("transcript v1 and more, next", ENGINE)
    assert [e.sha for e in found] == [res.event.sha]
    assert store.lookup("transcript v2", ENGINE) == []
    hit = store.load("transcript v1 and more, next", ENGINE, loader())
    assert hit.hit is not None and hit.hit.sha == res.event.sha and hit.hit.tokens == 150


def test_re_saving_a_pinned_session_keeps_the_pin(store):
    sha = save(store, "v1", title="Pinned chat", created_at=99).event.sha
    store.set_pinned(sha, True)
    assert save(store, "v1 and v2", tokens=120, title="Pinned chat", created_at=99).event.sha == sha
    e = inspect_file(store.path_for(sha))
    assert e.pinned and e.header.tokens == 120


def test_re_saving_a_session_keeps_its_hit_count(store):
    """A titled session resumed three times reads `hits 3` after its next reply is saved."""
    sha = save(store, "v1", title="Resumed chat", created_at=7, reason="agent-session").event.sha
    for _ in range(3):
        assert store.load_file(sha, ENGINE, loader()).hit is not None
    assert save(store, "v1 and v2", tokens=120, title="Resumed chat", created_at=7).event.sha == sha
    assert inspect_file(store.path_for(sha)).header.hits == 3


def test_tool_map_trailer_comes_back_on_load(store):
    from ds4tui.format.kvc import ToolMapEntry
    tm = (ToolMapEntry(b"call_1", b"<dsml/>"),)
    save(store, "with tools", tool_map=tm)
    res = store.load("with tools!", ENGINE, loader())
    assert res.tool_map == tm
    assert parse_kvc(store.path_for(res.hit.sha).read_bytes()).tool_map == tm


# -- eviction order ---------------------------------------------------------------


def _put(store, text: bytes, *, reason: int, hits=0, last_used=NOW, created=None, tokens=1000, size=10_000):
    created = last_used if created is None else created
    payload = dsv4_payload(tokens, body=bytes(size - 52))
    return _ours(store.dir, text, tokens=tokens, payload=payload, reason=reason, hits=hits,
                 last_used=last_used, created=created).name[:40]


def _order(store):
    """The full eviction order, from a dry run down to an empty budget."""
    ev = store.evict(budget_bytes=0, dry_run=True)
    assert isinstance(ev, Evicted) and ev.dry_run
    return [f.sha for f in ev.files]


def test_eviction_prefers_decayed_hits(store):
    stale = _put(store, b"stale", reason=2, hits=8, last_used=NOW - 48 * HOUR)  # 8 hits, 8 half-lives ago
    fresh = _put(store, b"fresh", reason=2, hits=1, last_used=NOW)
    assert _order(store) == [stale, fresh]
    assert set(store.shas()) == {stale, fresh}  # a dry run deletes nothing


def test_eviction_weighs_anchors_twice(store):
    cold = _put(store, b"cold anchor", reason=1)
    cont = _put(store, b"continued waypoint", reason=2)
    denser = _put(store, b"denser waypoint", reason=2, tokens=3000)  # 3x the density beats 2x weight
    assert _order(store) == [cont, cold, denser]


def test_eviction_plan_matches_a_real_budget_pass(store):
    """The cache browser's dry run ranks and picks exactly what `evict` would."""
    from ds4tui.cache.eviction import EvictionPlan

    shas = [_put(store, f"file {i}".encode(), reason=2, hits=i, size=10_000) for i in range(4)]
    # two files must go (the header index counts toward the budget too)
    budget = sum(e.file_bytes for e in store.scan()) + store.overhead_bytes() - 15_000
    plan = EvictionPlan.build(store.score(store.scan()), budget, store.overhead_bytes())
    assert [e.sha for e in plan.order] == _order(store) and len(plan.order) == len(shas)
    would = store.evict(budget_bytes=budget, dry_run=True)
    assert {store.path_for(f.sha).as_posix() for f in would.files} == {Path(p).as_posix() for p in plan.now}
    assert len(plan.now) == 2 and plan.summary().startswith("Over budget")
    assert EvictionPlan.build(store.score(store.scan()), 1 << 30).now == frozenset()


def test_eviction_presses_superseded_continued_checkpoints(store):
    older = _put(store, b"a long shared conversation", reason=2, tokens=3000, created=NOW - HOUR)
    _put(store, b"a long shared conversation, continued further", reason=2, tokens=1000, created=NOW)
    unrelated = _put(store, b"something unrelated", reason=2, tokens=1000)
    entries = {e.sha: e for e in store.entries(acceptor=None)}
    assert entries[older].superseded and entries[older].score.superseded_factor == pytest.approx(0.05)
    assert not entries[unrelated].superseded
    # 3x the density of the others, but pressed to 5%: it goes first.
    assert _order(store)[0] == older


def test_superseded_needs_a_newer_file(store):
    newer_short = _put(store, b"prefix", reason=2, created=NOW)
    _put(store, b"prefix and more", reason=2, created=NOW - HOUR)
    entries = {e.sha: e for e in store.entries(acceptor=None)}
    assert not entries[newer_short].superseded


def test_the_file_just_written_is_protected(store, clock):
    # Old, high-density files; the new one has the lowest score but must survive its own save.
    for i in range(3):
        _put(store, f"old {i}".encode(), reason=1, hits=50, tokens=100_000, size=300_000)
    res = save(store, "new and sparse", tokens=1, size=400_000)
    assert res.ok and res.event.sha in store.shas()
    assert sum(e.file_bytes for e in store.scan()) <= store.budget_bytes
    assert any(isinstance(e, Evicted) for e in res.events)


def test_touch_counts_a_hit_in_place(store, clock):
    sha = save(store, "touch me").event.sha
    clock.t += 100
    assert store.touch(sha)
    h = inspect_file(store.path_for(sha)).header
    assert (h.hits, h.last_used) == (1, NOW + 100)
    assert store.delete(sha) and not store.delete(sha)
    assert not store.touch(sha)


def test_foreign_ds4_files_decode_but_never_load(store):
    """A ds4-written file (ABI 2, Flash) in the directory is listed, not loadable, and kept."""
    path = write_kv(store.dir, b"ds4 prefix", dsv4_payload(600), tokens=600, model=0, abi=2, quant=2)
    e = store.entries()[0]
    assert e.error.startswith("not loadable here: payload ABI 2 (ds4)") and not e.corrupt
    assert e.payload["token_count"] == 600
    res = store.load(b"ds4 prefix and more", ENGINE, loader())
    assert isinstance(res.event, Miss) and path.exists()


def test_old_header_bytes_decode_in_a_listing(store):
    data = header_bytes(tokens=5, text_bytes=3, payload_bytes=0, model=0, abi=0) + b"abc"
    (store.dir).mkdir(parents=True, exist_ok=True)
    (store.dir / (hashlib.sha1(b"abc").hexdigest() + ".kv")).write_bytes(data)
    e = store.entries()[0]
    assert e.header.payload_abi == 0 and "pre-ABI" in e.error and not e.corrupt


def test_eviction_never_prefers_a_titled_session_over_its_anonymous_copies(tmp_path):
    """An anonymous file holding the same text as a titled session goes first (score 0);
    one holding a shorter prefix of it scores at most half of it, however often it was hit."""
    store = KvStore(tmp_path / "kv", budget_mb=64)
    chat = "system + first question + first answer"
    titled = save(store, chat, tokens=100, title="My chat", created_at=1000, reason="agent-session")
    same = save(store, chat, tokens=100, reason="shutdown")
    prefix = save(store, chat[:20], tokens=50, reason="evict")
    unrelated = save(store, "another chat altogether", tokens=100, reason="shutdown")
    for _ in range(20):  # a much-hit prefix still may not outrank the session holding it
        store.touch(prefix.event.sha)
    by_sha = {e.sha: e for e in store.entries(ENGINE)}
    t, d, p, u = (by_sha[r.event.sha] for r in (titled, same, prefix, unrelated))
    assert d.duplicate and d.held_by == t.sha and d.score.score == 0.0
    assert p.superseded and not p.duplicate and p.score.score <= 0.5 * t.score.score
    assert not u.superseded and u.held_by is None
    assert t.score.anchor_weight == 2.0  # the user's own session weighs like ds4's anchors
    order = [e.sha for e in eviction.choose_victims(list(by_sha.values()), 0)]
    assert order.index(d.sha) == 0 and order.index(p.sha) < order.index(t.sha)


def test_lookup_sees_every_change_between_messages(store):
    """The lookup keeps each file's header between calls; a grown titled session (same name,
    new file), a new file, a deleted one and a header rewritten in place are all seen."""
    sha = save(store, "chat v1", tokens=10, title="Chat", created_at=5, reason="agent-session").event.sha
    assert [e.header.tokens for e in store.lookup("chat v1 and v2, next", ENGINE)] == [10]
    save(store, "chat v1 and v2", tokens=20, title="Chat", created_at=5, reason="agent-session")
    assert [e.header.tokens for e in store.lookup("chat v1 and v2, next", ENGINE)] == [20]
    other = save(store, "chat", tokens=4).event.sha
    assert [e.sha for e in store.lookup("chat v1 and v2, next", ENGINE)] == [sha, other]
    store.delete(sha)
    assert [e.sha for e in store.lookup("chat v1 and v2, next", ENGINE)] == [other]
    # Another model's header written in place (same inode and size): no longer a candidate.
    path = store.path_for(other)
    st = os.stat(path)
    with open(path, "r+b") as fp:
        fp.seek(7)
        fp.write(bytes([0x81]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a coarse clock may not tick
    assert store.lookup("chat v1 and v2, next", ENGINE) == []


def test_a_primed_lookup_reads_no_file_at_the_first_message(store, monkeypatch):
    """prime_lookup (a controller's warm_up) reads every header and titled text ahead: the
    first lookup after it opens nothing, and still finds the titled file by its text."""
    titled = save(store, "chat so far", tokens=10, title="Chat", created_at=5, reason="agent-session").event
    plain = save(store, "chat", tokens=4).event
    fresh = KvStore(store.dir, CachePolicy(), budget_mb=1)  # a new process's view of the directory
    fresh.prime_lookup(ENGINE)
    opened = []
    from ds4tui.cache import lookup as lookup_module
    monkeypatch.setattr(lookup_module, "inspect_file", lambda *a, **k: opened.append(a) or inspect_file(*a, **k))
    monkeypatch.setattr(fresh, "text_of", lambda e: opened.append(e) or None)
    assert [e.sha for e in fresh.lookup("chat so far, and more", ENGINE)] == [titled.sha, plain.sha]
    assert opened == []


# -- destructive steps re-check the file under its lock (docs/format.md, "Several writers") ----------

def test_an_eviction_planned_before_a_pin_leaves_the_pinned_file(store):
    from ds4tui.cache.saving import apply_eviction

    a, b = save(store, "first file").event, save(store, "second file").event
    planned = store.scan()                 # the pass's scan, then another process pins one
    assert store.set_pinned(a.sha, True)
    ev = apply_eviction(store, planned, 0)
    assert [f.sha for f in ev.files] == [b.sha]
    assert Path(a.path).exists() and inspect_file(a.path).pinned and not Path(b.path).exists()


def test_an_eviction_planned_before_a_re_save_leaves_the_newer_file(store):
    from ds4tui.cache.saving import apply_eviction

    old = save(store, "turn one", title="my chat", created_at=NOW).event
    planned = store.scan()
    new = save(store, "turn one, turn two", title="my chat", created_at=NOW, tokens=120).event
    assert new.sha == old.sha
    ev = apply_eviction(store, planned, 0)
    assert ev.files == () and inspect_file(new.path).header.tokens == 120


def test_a_re_save_keeps_a_pin_set_after_its_scan(store, monkeypatch):
    from ds4tui.cache import files

    first = save(store, "turn one", title="my chat", created_at=NOW).event
    real = files.write_atomic

    def pin_meanwhile(*a, **kw):           # another process pins while the new version is written
        assert store.set_pinned(first.sha, True)
        return real(*a, **kw)

    monkeypatch.setattr(files, "write_atomic", pin_meanwhile)
    again = save(store, "turn one, turn two", title="my chat", created_at=NOW, tokens=120).event
    assert inspect_file(again.path).pinned and inspect_file(again.path).header.tokens == 120


def test_an_evicted_file_names_the_chat_it_belonged_to(tmp_path, clock):
    store = KvStore(tmp_path / "kv", budget_mb=1, clock=clock)
    part = save(store, "hello there", reason="continued").event
    save(store, "hello there, and more", title="my chat", created_at=NOW, pinned=True)
    ev = store.evict(budget_bytes=0)
    (gone,) = ev.files
    assert gone.sha == part.sha and gone.held_by_title == "my chat" and gone.owner() == gone.held_by
