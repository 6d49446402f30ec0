"""Two processes saving, loading and evicting in one directory leave it consistent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from ds4tui.cache import Acceptor, KvStore, inspect_file
from ds4tui.cache.index import INDEX_NAME

ENGINE = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)

WORKER = textwrap.dedent("""
    import os, random, sys, time
    from ds4tui.cache import Acceptor, KvStore, Rejected
    from ds4tui.format.payload import Dsv4Header, pack_dsv4_header, DSV4_MAGIC

    directory, seed, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    deadline = time.time() + 300  # a hang guard: the go file comes at once
    while not os.path.exists(go) and time.time() < deadline:  # start together
        time.sleep(0.005)
    rng = random.Random(seed)
    engine = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)
    store = KvStore(directory, budget_mb=1)
    topics = ["alpha", "beta", "gamma"]

    def payload(tokens, size):
        head = pack_dsv4_header(Dsv4Header(DSV4_MAGIC, 1, 4096, 2048, 0, 0, 0, tokens, 2, 64, 0, 100, 0))
        return head + bytes(size - len(head))

    for i in range(60):
        text = rng.choice(topics) + " " + "turn " * rng.randrange(1, 30) + str(seed * 1000 + i)
        tokens = 10 + i
        data = payload(tokens, rng.randrange(20_000, 150_000))
        res = store.save(text, tokens=tokens, reason=rng.choice(["cold", "continued", "evict"]),
                         engine=engine, payload_bytes=len(data), write_payload=lambda fp: fp.write(data))
        if not res.ok:
            sys.exit(f"save failed: {res.event.reason}")
        if i % 3 == 0:
            store.evict()
        probe = rng.choice(topics) + " turn turn turn"
        out = store.load(probe, engine, lambda fp, n: len(fp.read(n)) and None)
        bad = [e for e in out.events if isinstance(e, Rejected)]
        if bad:
            sys.exit(f"rejected during concurrent run: {bad}")
""")


def test_two_processes_saving_and_evicting_leave_a_consistent_directory(tmp_path):
    directory = tmp_path / "kv"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(directory), str(seed), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in (1, 2)]
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    names = [p.name for p in directory.iterdir() if p.name != INDEX_NAME]
    assert not [n for n in names if ".tmp" in n], names
    store = KvStore(directory, budget_mb=1)
    entries = store.scan(deep=True)
    assert entries and len(entries) == len(names)
    for e in entries:
        assert inspect_file(e.path, acceptor=ENGINE).valid, e.error
    assert sum(e.file_bytes for e in entries) <= store.budget_bytes


# One process saves and pins while another evicts everything that is not pinned, as fast as
# it can, in the same directory (the race of `kv pin X` beside a running eviction pass, and
# of a re-save landing between another process's scan and its unlink).
PINNER = textwrap.dedent("""
    import json, os, random, sys, time
    from ds4tui.cache import Acceptor, KvStore

    directory, go, done, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    deadline = time.time() + 300  # a hang guard: the go file comes at once
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.002)
    rng = random.Random(7)
    engine = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)
    store = KvStore(directory, budget_mb=64)
    data = bytes(6000)
    # name -> whether it must be pinned at the end (the last pin / unpin that succeeded)
    expect = {}
    for i in range(rounds):
        k = rng.randrange(6)
        pin = rng.random() < 0.5
        titled = rng.random() < 0.5
        if titled:   # a titled session saved again under its name, pinned or not;
            # saved unpinned, it keeps the pin its file has at the moment it replaces it
            res = store.save(f"chat {k} turn {i}", title=f"chat {k}", created_at=1_700_000_000 + k,
                             tokens=10 + i, reason="shutdown", engine=engine, payload_bytes=len(data),
                             write_payload=lambda fp: fp.write(data), pinned=pin)
        else:                    # an untitled checkpoint, then `kv pin` of it
            res = store.save(f"untitled {k} {i}", tokens=10 + i, reason="continued", engine=engine,
                             payload_bytes=len(data), write_payload=lambda fp: fp.write(data))
        assert res.ok, res.event
        sha = res.event.sha
        if titled and pin:
            expect[sha] = True                # saved pinned
        if rng.random() < 0.7:
            if store.set_pinned(sha, True):   # said "pinned": must hold whatever the evictor does
                expect[sha] = True
        elif rng.random() < 0.3 and store.set_pinned(sha, False):
            expect.pop(sha, None)             # unpinned: eviction may take it
    with open(done, "w") as fp:
        json.dump(sorted(expect), fp)
""")

EVICTOR = textwrap.dedent("""
    import os, sys, time
    from ds4tui.cache import KvStore

    directory, go, done = sys.argv[1], sys.argv[2], sys.argv[3]
    deadline = time.time() + 300  # a hang guard: the evictor stops when the pinner is done
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.002)
    store = KvStore(directory, budget_mb=64)
    passes = removed = 0
    while not os.path.exists(done) and time.time() < deadline:
        ev = store.evict(budget_bytes=0)  # everything that is not pinned goes
        passes += 1
        removed += len(ev.files)
    print(passes, removed)
""")


def test_a_pin_or_a_newer_save_made_during_another_processs_eviction_is_never_lost(tmp_path):
    directory, go, done = tmp_path / "kv", tmp_path / "go", tmp_path / "done.json"
    directory.mkdir()
    rounds = 100
    pinner = subprocess.Popen([sys.executable, "-c", PINNER, str(directory), str(go), str(done), str(rounds)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    evictor = subprocess.Popen([sys.executable, "-c", EVICTOR, str(directory), str(go), str(done)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    go.touch()
    out, err = pinner.communicate(timeout=300)
    assert pinner.returncode == 0, err[-2000:]
    out, err = evictor.communicate(timeout=300)
    assert evictor.returncode == 0, err[-2000:]
    passes, removed = map(int, out.split())
    assert passes > 5 and removed > 0  # the two really ran side by side
    import json

    must_stay = json.loads(done.read_text())
    assert must_stay
    for sha in must_stay:
        e = inspect_file(directory / f"{sha}.kv", acceptor=ENGINE)
        assert e.valid and e.pinned, (sha, e.error)
