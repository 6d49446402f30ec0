"""Two processes saving, loading and evicting in one directory leave it consistent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from ds4tui.cache import Acceptor, KvStore, inspect_file

ENGINE = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)

WORKER = textwrap.dedent("""
    import os, random, sys, time
    from ds4tui.cache import Acceptor, KvStore, Rejected
    from ds4tui.format.payload import Dsv4Header, pack_dsv4_header, DSV4_MAGIC

    directory, seed, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    deadline = time.time() + 20
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
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err[-2000:]
    names = [p.name for p in directory.iterdir()]
    assert not [n for n in names if ".tmp" in n], names
    store = KvStore(directory, budget_mb=1)
    entries = store.scan(deep=True)
    assert entries and len(entries) == len(names)
    for e in entries:
        assert inspect_file(e.path, acceptor=ENGINE).valid, e.error
    assert sum(e.file_bytes for e in entries) <= store.budget_bytes
