"""The browser checks each file's checksum once per version and its detail pane says the verdict."""

from __future__ import annotations

from ds4tui.cache import Acceptor, KvStore
from ds4tui.cache import scan as cache_scan
from ds4tui.screens.widgets.kv_detail import KvDetailInfo, trailer_section
from tests.cache.kvc_builders import dsv4_payload, write_kv

ENGINE = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)


def test_scan_verifies_checksums_and_the_detail_shows_them(tmp_path):
    store = KvStore(tmp_path)
    data = dsv4_payload(4, body=b"\5" * 500)
    good = store.save(b"good one", tokens=4, reason="cold", engine=ENGINE, payload_bytes=len(data),
                      write_payload=lambda fp: fp.write(data)).event
    bad = store.save(b"bad one", tokens=4, reason="cold", engine=ENGINE, payload_bytes=len(data),
                     write_payload=lambda fp: fp.write(data)).event
    raw = bytearray(open(bad.path, "rb").read())
    raw[200] ^= 1
    open(bad.path, "wb").write(bytes(raw))
    old = write_kv(tmp_path, b"no checksum", dsv4_payload(3), tokens=3, abi=128, model=0x80, quant=8, ctx=4096)
    checksums = cache_scan.ChecksumIndex()
    result = cache_scan.scan(store, ENGINE, gen=1, now=0.0, texts=cache_scan.TextIndex(), checksums=checksums)
    by_path = {e.path: e for e in result.entries}
    assert by_path[good.path].checksum == "ok" and by_path[good.path].valid
    e = by_path[bad.path]
    assert e.checksum == "mismatch" and e.corrupt and e.error.startswith("checksum mismatch")
    assert by_path[str(old)].checksum == "none" and by_path[str(old)].valid
    assert "mismatch" in trailer_section(KvDetailInfo(entry=e, raw_header=b"", now=0.0)).plain
    assert "ok (xxh3)" in trailer_section(KvDetailInfo(entry=by_path[good.path], raw_header=b"", now=0.0)).plain
