"""The checksum trailer: written on every save, checked on every load before the session takes
the state, verified by `kv inspect`; files without one (ds4's, older ds4tui) still list and load."""

from __future__ import annotations

import io
import json
import os
import struct

import pytest
import xxhash

from ds4tui.cache import Acceptor, KvStore, inspect_file
from ds4tui.format.kvc import CHECKSUM_TRAILER_BYTES, EXT_CHECKSUM, parse_kvc
from ds4tui.cli import main as cli_main
from ds4tui.engine.errors import PayloadError
from tests.cache.kvc_builders import dsv4_payload, titled_name, write_kv

ENGINE = Acceptor(model_id=0x80, ctx_size=4096, quant_bits=8)


def save(store, text=b"the prompt", tokens=9, body=b"\x11" * 4000, **kw):
    data = dsv4_payload(tokens, body=body)
    res = store.save(text, tokens=tokens, reason="cold", engine=ENGINE, payload_bytes=len(data),
                     write_payload=lambda fp: fp.write(data), **kw)
    assert res.ok
    return res.event, data


class Loader:
    """Reads the payload in several pieces like an engine; `committed` only after the last one."""

    def __init__(self):
        self.committed = None

    def __call__(self, fp, nbytes):
        got = b""
        while len(got) < nbytes:
            piece = fp.read(min(1000, nbytes - len(got)))
            if not piece:
                raise PayloadError("short")
            got += piece
        self.committed = got
        return struct.unpack_from("<I", got, 28)[0]


def test_saved_file_carries_a_checksum_over_text_payload_and_trailers(tmp_path):
    saved, data = save(KvStore(tmp_path), title="a title")
    raw = open(saved.path, "rb").read()
    kf = parse_kvc(raw)
    assert kf.header.ext_flags & EXT_CHECKSUM and saved.bytes == len(raw)
    assert kf.checksum == xxhash.xxh3_64_intdigest(raw[52:-CHECKSUM_TRAILER_BYTES])
    assert raw[-CHECKSUM_TRAILER_BYTES:-8] == b"KXH\x01"
    assert inspect_file(saved.path, verify=True).checksum == "ok"
    assert inspect_file(saved.path).checksum == "unchecked"


@pytest.mark.parametrize("where", ["text", "payload-head", "payload-end", "title"])
def test_a_flipped_byte_anywhere_is_a_corrupt_rejection_and_nothing_is_committed(tmp_path, where):
    store = KvStore(tmp_path)
    saved, data = save(store, title="a title")
    raw = bytearray(open(saved.path, "rb").read())
    text_len = len(b"the prompt")
    offset = {"text": 52 + 3, "payload-head": 52 + text_len + 60,
              "payload-end": 52 + text_len + len(data) - 1, "title": len(raw) - CHECKSUM_TRAILER_BYTES - 2}[where]
    raw[offset] ^= 0x01
    open(saved.path, "wb").write(bytes(raw))
    assert inspect_file(saved.path, verify=True).checksum == "mismatch"
    loader = Loader()
    result = store.load_file(saved.sha, ENGINE, loader)
    assert result.hit is None and loader.committed is None
    [rej] = result.events[:1]
    assert not rej.deleted and os.path.exists(saved.path)  # a titled session stays, marked, until deleted
    # A title flip is caught first by the name (title identity) check.
    assert rej.reason.startswith("title identity" if where == "title" else "checksum mismatch")


def test_a_corrupt_untitled_checkpoint_is_deleted(tmp_path):
    store = KvStore(tmp_path)
    saved, _ = save(store)
    raw = bytearray(open(saved.path, "rb").read())
    raw[52 + 20 + 300] ^= 8
    open(saved.path, "wb").write(bytes(raw))
    result = store.load(b"the prompt and more", ENGINE, Loader())
    assert result.hit is None and result.events[0].deleted and not os.path.exists(saved.path)


def test_an_engine_error_raised_from_the_mismatch_still_counts_as_corrupt(tmp_path):
    store = KvStore(tmp_path)
    saved, data = save(store)
    raw = bytearray(open(saved.path, "rb").read())
    raw[52 + 20 + 100] ^= 0x40
    open(saved.path, "wb").write(bytes(raw))

    def engine_like(fp, nbytes):
        try:
            fp.read(nbytes)
        except Exception as exc:  # an engine wraps what its stream raised
            raise PayloadError("read failed") from exc
    result = store.load_file(saved.sha, ENGINE, engine_like)
    assert result.events[0].reason.startswith("checksum mismatch")


def test_engine_that_reads_less_than_the_payload_is_still_checked(tmp_path):
    store = KvStore(tmp_path)
    saved, _ = save(store)
    raw = bytearray(open(saved.path, "rb").read())
    raw[-CHECKSUM_TRAILER_BYTES - 1] ^= 1  # last payload byte
    open(saved.path, "wb").write(bytes(raw))
    result = store.load_file(saved.sha, ENGINE, lambda fp, n: struct.unpack_from("<I", fp.read(52), 28)[0])
    assert result.hit is None and result.events[0].reason.startswith("checksum mismatch")


def test_file_without_checksum_still_loads_and_says_none(tmp_path):
    """Written before checksums (or by ds4): listed, loaded, `checksum none`."""
    p = write_kv(tmp_path, b"older file", dsv4_payload(5, body=b"\0" * 64), tokens=5, abi=128, model=0x80,
                 quant=8, ctx=4096)
    e = inspect_file(p, verify=True)
    assert e.valid and e.checksum == "none"
    assert KvStore(tmp_path).load(b"older file!", ENGINE, Loader()).hit is not None


def test_kv_inspect_reports_the_checksum(tmp_path, capsys):
    saved, _ = save(KvStore(tmp_path))
    assert cli_main(["kv", "inspect", "--dir", str(tmp_path), saved.sha[:10]]) == 0
    assert "checksum       ok (xxh3)" in capsys.readouterr().out
    assert cli_main(["kv", "inspect", "--json", saved.path]) == 0
    assert json.loads(capsys.readouterr().out)["checksum"] == "ok"
    raw = bytearray(open(saved.path, "rb").read())
    raw[60] ^= 4
    open(saved.path, "wb").write(bytes(raw))
    assert cli_main(["kv", "inspect", "--json", saved.path]) == 1
    obj = json.loads(capsys.readouterr().out)
    assert obj["checksum"] == "mismatch" and obj["valid"] is False and obj["error"].startswith("checksum mismatch")
    assert cli_main(["kv", "ls", "--dir", str(tmp_path), "--verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["checksum"] == "mismatch"


def test_rename_refuses_to_give_a_corrupt_file_a_fresh_checksum(tmp_path):
    store = KvStore(tmp_path)
    saved, data = save(store, title="old", created_at=1_700_000_000)
    raw = bytearray(open(saved.path, "rb").read())
    raw[52 + 20 + 200] ^= 2
    open(saved.path, "wb").write(bytes(raw))
    with pytest.raises(ValueError, match="checksum mismatch"):
        store.rename_title(saved.sha, "new")
    assert not (tmp_path / titled_name(b"new", 1_700_000_000)).exists()


def test_renamed_file_verifies(tmp_path):
    store = KvStore(tmp_path)
    saved, _ = save(store, title="old", created_at=1_700_000_000)
    new = store.rename_title(saved.sha, "new")
    assert inspect_file(store.path_for(new), verify=True).checksum == "ok"


# -- non-finite values (engine side) ------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from ds4tui.engine.loader import load_model

    return load_model("tiny-llama")


def _session(model, prompt="hello there, a few tokens", kv_dtype=None):
    s = model.new_session(256, kv_dtype=kv_dtype)
    s.prefill(model.tokenizer.encode(prompt))
    return s


def test_a_session_with_nan_in_its_kv_is_not_saved(tiny):
    s = _session(tiny)
    s.kv[1, 0, 0, 1, 5] = float("nan")
    with pytest.raises(PayloadError, match="NaN or infinite"):
        s.save_payload(io.BytesIO())


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("what", ["kv", "logits"])
def test_nan_in_a_payload_without_checksum_is_rejected_and_the_session_left_empty(tiny, what, kv_dtype):
    s = _session(tiny, kv_dtype=kv_dtype)
    buf = io.BytesIO()
    s.save_payload(buf)
    data = bytearray(buf.getvalue())
    t = len(s.tokens)
    logits_at = 52 + 32 + 4 * t
    at = logits_at + 8 if what == "logits" else len(data) - 4 * 7
    data[at:at + 4] = struct.pack("<f", float("nan"))  # in f16 rows: an f16 NaN (0x7fc0) and a zero
    fresh = tiny.new_session(256, kv_dtype=kv_dtype)
    with pytest.raises(PayloadError, match="NaN or infinite"):
        fresh.load_payload(io.BytesIO(bytes(data)), len(data))
    assert fresh.tokens == []
