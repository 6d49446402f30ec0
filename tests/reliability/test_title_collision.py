"""Two sessions never share a file: the same title created in the same second gets a bumped created_at,
in one process and across two racing processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from ds4tui.cache import Acceptor, KvStore, inspect_file
from ds4tui.format.kvc import parse_kvc, title_sha
from tests.cache.kvc_builders import dsv4_payload

ENGINE = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)
CREATED = 1_750_000_000


def save_fresh(store, text: bytes, title="hi", created=CREATED):
    data = dsv4_payload(3, body=text)
    res = store.save(text, tokens=3, reason="agent-session", engine=ENGINE, payload_bytes=len(data),
                     write_payload=lambda fp: fp.write(data), title=title, created_at=created, fresh=True)
    assert res.ok, res.event
    return res.event


def test_same_second_same_title_gets_the_next_free_second(tmp_path):
    store = KvStore(tmp_path)
    a = save_fresh(store, b"chat A")
    b = save_fresh(store, b"chat B")
    assert a.sha == title_sha(b"hi", CREATED) and (a.created_at, b.created_at) == (CREATED, CREATED + 1)
    assert b.sha == title_sha(b"hi", CREATED + 1)
    for ev, text in ((a, b"chat A"), (b, b"chat B")):
        kf = parse_kvc(open(ev.path, "rb").read())
        assert kf.text == text and kf.header.created_at == ev.created_at
        assert inspect_file(ev.path, verify=True).valid  # name, header and checksum agree


def test_a_resave_of_the_owner_still_replaces_its_file(tmp_path):
    store = KvStore(tmp_path)
    a = save_fresh(store, b"chat A")
    data = dsv4_payload(3, body=b"chat A, longer")
    again = store.save(b"chat A, longer", tokens=3, reason="agent-session", engine=ENGINE,
                       payload_bytes=len(data), write_payload=lambda fp: fp.write(data), title="hi",
                       created_at=CREATED)
    assert again.event.sha == a.sha and len(store.shas()) == 1


_CHILD = r"""
import json, sys, time
sys.path.insert(0, {root!r})
from ds4tui.cache import Acceptor, KvStore
from tests.cache.kvc_builders import dsv4_payload
store = KvStore({directory!r})
text = sys.argv[1].encode()
data = dsv4_payload(3, body=text)
while time.time() < {start!r}:
    pass
out = []
for i in range({rounds}):
    res = store.save(text + b" %d" % i, tokens=3, reason="agent-session",
                     engine=Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8),
                     payload_bytes=len(data), write_payload=lambda fp: fp.write(data),
                     title="hi", created_at={created} + 10 * i, fresh=True)
    out.append([res.event.sha, res.event.created_at])
print(json.dumps(out))
"""


def test_two_processes_racing_for_one_title_never_share_a_file(tmp_path):
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    rounds = 8
    code = _CHILD.format(root=root, directory=str(tmp_path), start=time.time() + 1.0, rounds=rounds, created=CREATED)
    procs = [subprocess.Popen([sys.executable, "-c", code, who], stdout=subprocess.PIPE, text=True)
             for who in ("first", "second")]
    results = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    shas = [sha for r in results for sha, _ in r]
    assert len(set(shas)) == 2 * rounds and len(KvStore(tmp_path).shas()) == 2 * rounds
    for who, r in zip(("first", "second"), results):
        for i, (sha, created) in enumerate(r):
            kf = parse_kvc((tmp_path / f"{sha}.kv").read_bytes())
            assert kf.text == f"{who} {i}".encode() and kf.header.created_at == created
            assert created in (CREATED + 10 * i, CREATED + 10 * i + 1)


@pytest.fixture(scope="module")
def tiny_llama():
    from ds4tui.engine.loader import load_model

    return load_model("tiny-llama")


def test_two_chats_saying_hi_in_the_same_second_keep_their_own_files(tiny_llama, tmp_path):
    from tests.chat.conftest import make_controller

    ctl = make_controller(tiny_llama, tmp_path)
    a, b = ctl.new_conversation(), ctl.new_conversation()
    b.created_at = a.created_at
    ctl.send(a.key, "hi")
    ctl.send(b.key, "hi")
    assert a.saved_sha and b.saved_sha and a.saved_sha != b.saved_sha
    assert b.created_at == a.created_at + 1
    ctl.send(a.key, "and more")  # a re-save keeps a's own file
    texts = {s.sha: parse_kvc(open(s.path, "rb").read()).text for s in ctl.checkpoints.titled_sessions()}
    assert set(texts) == {a.saved_sha, b.saved_sha}
    assert b"and more" in texts[a.saved_sha] and b"and more" not in texts[b.saved_sha]
