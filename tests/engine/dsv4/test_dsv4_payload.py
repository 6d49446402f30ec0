"""DSV4 session payload: exact resume, byte-exact round trip, the documented size, and
rejection (with a reason, leaving the session usable) of foreign, truncated or padded payloads."""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path

import pytest
import torch

from ds4tui.format.payload import DSV4_HEADER_BYTES
from ds4tui.engine.dsv4.model import model_from_tensors
from ds4tui.engine.errors import PayloadError
from ds4tui.engine.dsv4.tiny import random_tensors
from tests.engine.dsv4.dsv4_helpers import expected_size, load, save, single_thread, tiny, tokens  # noqa: F401 (fixture)

CHUNK = 128
K = 40  # tokens prefilled after the restore (crosses a chunk boundary from T = 100 on)
DECODE = 3
DOC = Path(__file__).resolve().parents[3] / "docs" / "payload.md"


def _continue(s, toks: list[int]) -> list[torch.Tensor]:
    s.prefill(toks)
    out = [s.logits.clone()]
    for _ in range(DECODE):
        out.append(s.decode(int(s.logits.argmax())).clone())
    return out


@pytest.mark.parametrize("t", [1, 3, 4, 15, 16, 17, 100, 127, 128, 129, 255, 256, 300])
def test_save_load_continue_is_bit_exact(t):
    """Off and on the window (16), ratio (4, 128) and chunk (128) boundaries."""
    model = tiny()
    toks = tokens(t + K)
    a = model.new_session(1024, chunk_size=CHUNK)
    a.prefill(toks[:t])
    data = save(a)
    b = model.new_session(1024, chunk_size=CHUNK)
    load(b, data)
    assert b.tokens == a.tokens and torch.equal(b.logits, a.logits)
    assert save(b) == data  # save(load(save(s))) reproduces the bytes
    la, lb = _continue(a, toks[t:]), _continue(b, toks[t:])
    assert all(torch.equal(x, y) for x, y in zip(la, lb))
    assert save(a) == save(b)


@pytest.mark.parametrize("t", [128, 256])
def test_resume_on_a_chunk_boundary_equals_a_cold_prefill(t):
    """Aligned chunks: the resumed session runs the same batched computations as a cold one."""
    model = tiny()
    toks = tokens(t + K, seed=5)
    a = model.new_session(1024, chunk_size=CHUNK)
    a.prefill(toks[:t])
    b = model.new_session(1024, chunk_size=CHUNK)
    load(b, save(a))
    b.prefill(toks[t:])
    cold = model.new_session(1024, chunk_size=CHUNK)
    cold.prefill(toks)
    assert torch.equal(b.logits, cold.logits)
    assert save(b) == save(cold)


def test_size_matches_the_formula_and_the_doc():
    model = tiny()
    for t in (0, 5, 300):
        s = model.new_session(1024)
        s.prefill(tokens(t)) if t else None
        assert s.payload_bytes() == len(save(s)) == expected_size(model.cfg, t)
    doc = DOC.read_text()
    m = re.search(r"tiny-dsv4 after 300 tokens: ([\d,]+) bytes", doc)
    assert m and int(m.group(1).replace(",", "")) == expected_size(model.cfg, 300)


def test_header_fields():
    model = tiny()
    s = model.new_session(1024, chunk_size=CHUNK)
    s.prefill(tokens(300))
    fields = struct.unpack_from("<13I", save(s))
    assert fields == (0x34565344, 1, 1024, CHUNK, 16, 16, 1024 // 4, 300, 6, 80, 32, 512, 16)


@pytest.fixture(scope="module")
def saved():
    model = tiny()
    s = model.new_session(1024, chunk_size=CHUNK)
    s.prefill(tokens(150))
    return save(s)


def _assert_usable_and_empty(s):
    assert s.tokens == [] and s.logits is None
    fresh = type(s)(s.net, s.info, s.ctx_size, s.chunk_size)
    toks = tokens(20, seed=9)
    s.prefill(toks)
    fresh.prefill(toks)
    assert torch.equal(s.logits, fresh.logits)


def _reject(s, data: bytes, match: str, nbytes: int | None = None) -> None:
    with pytest.raises(PayloadError, match=match):
        s.load_payload(io.BytesIO(data), len(data) if nbytes is None else nbytes)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d[:-1], "truncated"),
        (lambda d: d[: len(d) // 2], "truncated"),
        (lambda d: d[:40], "truncated"),
        (lambda d: d + b"\0\0\0\0", "trailing bytes"),
        (lambda d: b"XSV4" + d[4:], "not DSV4"),
        (lambda d: d[:4] + struct.pack("<I", 2) + d[8:], "payload_version"),
        (lambda d: d[:DSV4_HEADER_BYTES] + bytes(32) + d[DSV4_HEADER_BYTES + 32 :], "another model or config"),
        (lambda d: d[:48] + struct.pack("<I", 3) + d[52:], "live_raw_rows"),
    ],
    ids=["minus-1-byte", "half", "header-only", "trailing", "magic", "version", "fingerprint", "raw-rows"],
)
def test_malformed_payload_is_rejected_and_session_stays_usable(saved, mutate, match):
    s = tiny().new_session(1024, chunk_size=CHUNK)
    _reject(s, mutate(saved), match)
    _assert_usable_and_empty(s)


def test_file_shorter_than_announced_is_rejected(saved):
    s = tiny().new_session(1024, chunk_size=CHUNK)
    _reject(s, saved[:-100], "truncated|ended", nbytes=len(saved))
    _assert_usable_and_empty(s)


def test_bad_values_inside_the_sections_are_rejected(saved):
    s = tiny().new_session(1024, chunk_size=CHUNK)
    body = len(saved) - 4  # the last float: an indexer frontier score of the last CSA layer
    _reject(s, saved[:body] + struct.pack("<f", float("nan")), "NaN")
    _assert_usable_and_empty(s)
    t0 = DSV4_HEADER_BYTES + 32
    _reject(s, saved[:t0] + struct.pack("<I", 999) + saved[t0 + 4 :], "outside the vocab")


def test_payload_from_another_model_or_config_is_rejected(saved):
    cfg = tiny().cfg
    other_weights = model_from_tensors("other", cfg, random_tensors(cfg, seed=7), tiny().tokenizer)
    for model in (other_weights, tiny(qat_kv_fp8=False)):
        s = model.new_session(1024, chunk_size=CHUNK)
        _reject(s, saved, "another model or config")
        _assert_usable_and_empty(s)
    s = tiny().new_session(1024, chunk_size=256)
    _reject(s, saved, "prefill_chunk is 128, this session needs 256")
    s = tiny().new_session(128, chunk_size=CHUNK)
    _reject(s, saved, "150 tokens, this session's context is 128")


def test_rejected_header_leaves_a_live_session_untouched(saved):
    s = tiny().new_session(1024, chunk_size=CHUNK)
    s.prefill(tokens(30, seed=11))
    before = save(s)
    _reject(s, saved + b"\0", "trailing bytes")
    assert save(s) == before


def test_stopped_prefill_saves_real_logits():
    """A prefill stopped between chunks has no logits yet; the payload still gets them."""
    model = tiny()
    toks = tokens(200)
    s = model.new_session(1024, chunk_size=CHUNK)
    assert s.prefill(toks, should_stop=lambda: len(s.tokens) >= CHUNK) is False
    assert len(s.tokens) == CHUNK and s.logits is None
    r = model.new_session(1024, chunk_size=CHUNK)
    load(r, save(s))
    full = model.new_session(1024, chunk_size=CHUNK)
    full.prefill(toks[:CHUNK])
    assert torch.equal(r.logits, full.logits)
