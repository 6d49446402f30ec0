"""ds4's own store (antirez/ds4's ds4_kvstore.c, unmodified, through tests/reliability/ds4/
harness.c) and ds4tui in one directory behave as docs/format.md's "Sharing a directory with
ds4" says. Needs the harness built (scripts/build_ds4_harness.sh DS4_SOURCE_DIR); skips
without it, as ds4's source is not part of this repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ds4tui.cache import Acceptor, KvStore, inspect_file
from ds4tui.format.payload import DSV4_MAGIC, Dsv4Header, pack_dsv4_header

HARNESS = Path(os.environ.get("DS4_HARNESS", "/tmp/ds4-harness/harness"))
pytestmark = pytest.mark.skipif(not HARNESS.exists(), reason=f"ds4's store harness not built ({HARNESS}):"
                                " scripts/build_ds4_harness.sh DS4_SOURCE_DIR")
ENGINE = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)


def ds4(directory: Path, *args: str) -> str:
    out = subprocess.run([str(HARNESS), str(directory), *args], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def ours(store: KvStore, text: str, **kw):
    data = pack_dsv4_header(Dsv4Header(DSV4_MAGIC, 1, 4096, 2048, 0, 0, 0, 5, 2, 64, 0, 100, 0)) + bytes(200)
    res = store.save(text, tokens=5, reason=kw.pop("reason", "cold"), engine=ENGINE, payload_bytes=len(data),
                     write_payload=lambda fp: fp.write(data), **kw)
    assert res.ok, res.event
    return res.event


def test_ds4_never_reads_touches_or_evicts_a_ds4tui_file_but_can_replace_an_untitled_one_of_its_text(tmp_path):
    d = tmp_path / "kv"
    store = KvStore(d)
    shared = ours(store, "shared text")
    titled = ours(store, "shared text", title="a chat", created_at=1_700_000_000, reason="agent-session")
    alone = ours(store, "only ours")
    before = {p.name: p.read_bytes() for p in d.glob("*.kv")}

    assert ds4(d, "list") == ""                     # not one of ours is in ds4's view
    assert ds4(d, "load", "shared text, then more") == "0"  # so no hit, no header rewrite
    ds4(d, "evict", "1")                            # and its budget pass deletes none
    assert {p.name: p.read_bytes() for p in d.glob("*.kv")} == before

    # ds4 stores a checkpoint of the same text as our untitled file: it lands on that name.
    assert ds4(d, "store", "shared text") == shared.sha
    replaced = inspect_file(shared.path, acceptor=ENGINE)
    assert replaced.header.quant_bits == 4 and replaced.not_loadable  # ds4's file now, listed as such
    for kept in (titled, alone):                    # a titled session is named by its title: never hit
        assert Path(kept.path).read_bytes() == before[Path(kept.path).name]


def test_a_ds4tui_pin_on_a_ds4_file_holds_against_ds4tui_only(tmp_path):
    d = tmp_path / "kv"
    store = KvStore(d)
    sha = ds4(d, "store", "a file of ds4's own")
    assert store.set_pinned(sha, True)
    assert ds4(d, "load", "a file of ds4's own, and the next turn") == str(len("a file of ds4's own"))
    e = inspect_file(store.path_for(sha), acceptor=None)
    assert e.pinned and e.header.hits == 1          # ds4's hit rewrote the header, ext_flags as they were
    assert store.evict(budget_bytes=0).files == ()  # ds4tui's eviction keeps it
    assert store.path_for(sha).exists()
    ds4(d, "evict", "1")                            # ds4's does not read the pin
    assert not store.path_for(sha).exists()
