"""The KVC envelope: hand-built ds4 files decode, our encoder matches the layout, the parser never crashes."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4tui.format import kvc
from ds4tui.format.kvc import KvcFormatError, KvcHeader
from ds4tui.format.payload import DSV4_FIELDS
from tests.cache.kvc_builders import dsv4_payload, header_bytes, kv_file, title_trailer, tool_map_trailer

U8 = st.integers(0, 0xFF)
U32 = st.integers(0, 0xFFFFFFFF)
U64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)

headers = st.builds(
    KvcHeader, quant_bits=U8, reason_code=U8, ext_flags=U8, model_id=U8, tokens=U32, hits=U32,
    ctx_size=U32, payload_abi=U8, created_at=U64, last_used=U64, payload_bytes=U64, text_bytes=U32,
)


def test_new_ds4_file_decodes_every_field():
    """A file laid out as newer ds4 writes it (model id, ABI 2, title trailer) decodes field by field."""
    text = "<｜begin▁of▁sentence｜>You are helpful.".encode()
    payload = dsv4_payload(2048, body=b"\x00" * 40)
    data = kv_file(text, payload, tokens=2048, quant=2, reason=6, ext=kvc.EXT_SESSION_TITLE, model=0,
                   hits=3, ctx=65536, abi=2, created=1_750_000_000, last_used=1_750_000_100,
                   trailers=title_trailer("Fix the parser".encode()))
    f = kvc.parse_kvc(data)
    h = f.header
    assert (h.version, h.quant_bits, h.reason, h.ext_flags, h.model_id) == (1, 2, "agent-session", 8, 0)
    assert (h.tokens, h.hits, h.ctx_size, h.payload_abi) == (2048, 3, 65536, 2)
    assert (h.created_at, h.last_used, h.payload_bytes, h.text_bytes) == (1_750_000_000, 1_750_000_100, len(payload), len(text))
    assert h.ext_flag_names == ["session-title"]
    assert f.text == text and f.title == "Fix the parser"
    assert f.payload_header.token_count == 2048
    assert tuple(f.payload_header.as_dict()) == DSV4_FIELDS
    assert f.identity_sha == hashlib.sha1(b"Fix the parser" + struct.pack("<Q", 1_750_000_000)).hexdigest()
    assert kvc.model_name(h.model_id) == "deepseek-v4-flash"
    assert kvc.payload_abi_name(h.payload_abi) == "ds4"


def test_old_ds4_file_with_zero_model_and_abi_decodes():
    """Older ds4 builds wrote 0 at byte 7 and bytes 20-23: they read as Flash with ABI 0."""
    text = b"old prompt"
    data = kv_file(text, dsv4_payload(600), tokens=600, model=0, abi=0, ext=kvc.EXT_TOOL_MAP,
                   trailers=tool_map_trailer([(b"call_1", b"<dsml>x</dsml>"), (b"call_2", b"y")]))
    assert data[7] == 0 and data[20:24] == b"\0\0\0\0"
    f = kvc.parse_kvc(data)
    assert f.header.model_id == 0 and f.header.payload_abi == 0
    assert kvc.payload_abi_name(0) == "ds4 (pre-ABI)"
    assert [e.tool_id for e in f.tool_map] == [b"call_1", b"call_2"]
    assert f.tool_map[0].dsml == b"<dsml>x</dsml>"
    assert f.identity_sha == hashlib.sha1(text).hexdigest()
    assert f.extra_bytes == 0


def test_encoder_matches_the_published_layout():
    h = KvcHeader(quant_bits=4, reason_code=2, ext_flags=0x81, model_id=0x80, tokens=10240, hits=7,
                  ctx_size=32768, payload_abi=128, created_at=11, last_used=22, payload_bytes=33, text_bytes=44)
    expected = header_bytes(tokens=10240, text_bytes=44, payload_bytes=33, quant=4, reason=2, ext=0x81,
                            model=0x80, hits=7, ctx=32768, abi=128, created=11, last_used=22)
    assert kvc.encode_header(h) == expected


def test_reserved_bytes_are_written_zero_and_ignored_on_read():
    data = header_bytes(tokens=1, text_bytes=0, payload_bytes=0, reserved=b"\x01\x02\x03")
    h = kvc.decode_header(data)
    assert kvc.encode_header(h)[21:24] == b"\0\0\0"


def test_reason_above_six_reads_unknown_and_flags_have_names():
    h = kvc.decode_header(header_bytes(tokens=1, text_bytes=0, payload_bytes=0, reason=9, ext=0b1001_0110))
    assert h.reason == "unknown" and h.reason_code == 9
    assert h.ext_flag_names == ["responses-visible", "thinking-visible", "bit4", "pinned"]
    assert kvc.model_name(5) == "model#5"
    assert kvc.reason_code("agent-system") == 5
    with pytest.raises(KvcFormatError):
        kvc.reason_code("nap")


@pytest.mark.parametrize("data, message", [
    (b"", "truncated header"),
    (b"XYZ" + bytes(49), "bad magic"),
    (header_bytes(tokens=1, text_bytes=0, payload_bytes=0, version=2), "version 2"),
    (header_bytes(tokens=1, text_bytes=10, payload_bytes=0) + b"short", "truncated file"),
    (kv_file(b"t", b"", ext=kvc.EXT_SESSION_TITLE), "missing session-title trailer"),
    (kv_file(b"t", b"", ext=kvc.EXT_TOOL_MAP, trailers=b"KTX\x01" + bytes(4)), "bad tool-map trailer"),
    (kv_file(b"t", b"DSV4" + bytes(10)), "bad DSV4 payload header"),
])
def test_malformed_files_raise_the_module_error(data, message):
    with pytest.raises(KvcFormatError, match=message):
        kvc.parse_kvc(data)


def test_names_and_identities():
    assert kvc.sha_from_name("A" * 40 + ".kv") == "a" * 40
    for bad in ["a" * 40 + ".kv.tmp.123", "a" * 39 + ".kv", "g" * 40 + ".kv", "sysprompt.kv", "a" * 40 + ".KV"]:
        assert kvc.sha_from_name(bad) is None
    assert kvc.text_sha(b"abc") == hashlib.sha1(b"abc").hexdigest()
    assert kvc.title_sha(b"t", 1) == hashlib.sha1(b"t\x01" + bytes(7)).hexdigest()


def test_build_kvc_round_trips_trailers():
    h = KvcHeader(4, 1, 0, 0x80, 5, 0, 4096, 128, 1, 2, 0, 0)
    tm = (kvc.ToolMapEntry(b"id", b"dsml"),)
    f = kvc.parse_kvc(kvc.build_kvc(h, b"text", dsv4_payload(5), tool_map=tm, title="T".encode()))
    assert f.tool_map == tm and f.title == "T" and f.header.ext_flags == kvc.EXT_TOOL_MAP | kvc.EXT_SESSION_TITLE
    assert f.trailer_bytes == len(kvc.encode_tool_map(tm)) + 5


@given(headers)
def test_header_round_trip(h):
    assert kvc.decode_header(kvc.encode_header(h)) == h


@settings(max_examples=300)
@given(headers)
def test_header_field_table_reads_what_the_encoder_wrote(h):
    """HEADER_FIELDS (what the cache browser's hex view shows) locates every field the encoder packs."""
    raw = kvc.encode_header(h)
    codes = {1: "<B", 4: "<I", 8: "<Q"}
    got = {}
    for off, size, name in kvc.HEADER_FIELDS:
        chunk = raw[off:off + size]
        got[name] = chunk if name in ("magic", "reserved") else struct.unpack(codes[size], chunk)[0]
    assert got.pop("magic") == kvc.MAGIC and got.pop("reserved") == bytes(3)
    assert got.pop("reason") == h.reason_code
    assert got == {k: getattr(h, k) for k in got}


@given(st.binary(max_size=200))
def test_parser_on_arbitrary_bytes_returns_or_raises_its_error(data):
    try:
        kvc.parse_kvc(data)
    except KvcFormatError:
        pass


@st.composite
def mutated_files(draw):
    text = draw(st.binary(max_size=40))
    payload = draw(st.one_of(st.binary(max_size=80), st.builds(dsv4_payload, U32, body=st.binary(max_size=20))))
    ext = draw(st.sampled_from([0, kvc.EXT_TOOL_MAP, kvc.EXT_SESSION_TITLE, kvc.EXT_TOOL_MAP | kvc.EXT_SESSION_TITLE]))
    trailers = b""
    if ext & kvc.EXT_TOOL_MAP:
        trailers += tool_map_trailer(draw(st.lists(st.tuples(st.binary(max_size=8), st.binary(max_size=8)), max_size=3)))
    if ext & kvc.EXT_SESSION_TITLE:
        trailers += title_trailer(draw(st.binary(max_size=12)))
    data = bytearray(kv_file(text, payload, ext=ext, trailers=trailers))
    for _ in range(draw(st.integers(0, 4))):
        pos = draw(st.integers(0, len(data) - 1))
        data[pos] = draw(U8)
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) + draw(st.binary(max_size=8))


@settings(max_examples=400)
@given(mutated_files())
def test_parser_on_mutated_files_returns_or_raises_its_error(data):
    try:
        f = kvc.parse_kvc(data)
    except KvcFormatError:
        return
    assert f.file_bytes == len(data)
    assert kvc.PREFIX_BYTES + f.header.text_bytes + f.header.payload_bytes + f.trailer_bytes + f.extra_bytes == len(data)
