"""One file decoded for people: verdicts and the acceptor's reasons."""

from __future__ import annotations

from ds4tui.cache.entry import JSON_KEYS, Acceptor, inspect_file
from ds4tui.format.kvc import KvcHeader
from tests.cache.kvc_builders import dsv4_payload, write_kv


def _h(**kw):
    base = dict(quant_bits=8, reason_code=1, ext_flags=0, model_id=0x80, tokens=5, hits=0, ctx_size=4096,
                payload_abi=128, created_at=0, last_used=0, payload_bytes=0, text_bytes=0)
    return KvcHeader(**{**base, **kw})


def test_acceptor_reasons():
    any_ours = Acceptor()
    assert any_ours.why_not(_h()) is None and any_ours.why_not(_h(model_id=0x81)) is None
    assert "has no ds4tui engine" in any_ours.why_not(_h(model_id=0))
    assert "payload ABI 2 (ds4)" in any_ours.why_not(_h(payload_abi=2))
    eng = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)
    assert eng.why_not(_h()) is None and eng.why_not(_h(ctx_size=1024)) is None
    assert "written for context 8192" in eng.why_not(_h(ctx_size=8192))
    assert "other weights: quant bits 4" in eng.why_not(_h(quant_bits=4))
    assert "written by ds4tui-dsv4" in eng.why_not(_h(model_id=0x81))


def test_quick_and_deep_inspection(tmp_path):
    path = write_kv(tmp_path, b"text", dsv4_payload(5), tokens=5, model=0x80, abi=128)
    quick = inspect_file(path, deep=False)
    assert quick.valid and quick.header.tokens == 5 and quick.payload is None and not quick.deep
    deep = inspect_file(path)
    assert deep.valid and deep.payload["token_count"] == 5 and deep.text_preview == "text"
    assert tuple(deep.to_json()) == JSON_KEYS
    # Only the deep read sees a hash mismatch.
    bad = path.with_name("1" * 40 + ".kv")
    path.rename(bad)
    assert inspect_file(bad, deep=False).valid
    e = inspect_file(bad)
    assert not e.valid and e.corrupt and "does not match the file name" in e.error


def test_missing_and_unreadable(tmp_path):
    e = inspect_file(tmp_path / ("0" * 40 + ".kv"))
    assert e.error == "file not found" and not e.corrupt and e.header is None
    assert tuple(e.to_json()) == JSON_KEYS
