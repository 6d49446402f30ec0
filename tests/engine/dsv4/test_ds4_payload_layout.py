"""ds4's own payload layout (ABI 2), which a model in ds4's GGUF with V4 Flash's shape writes
and reads: no fingerprint, ds4's CPU header values, the full layout whatever the SWA policy,
and ds4's leftover frontier slots accepted (cleared) on load. The layout is checked here
against the byte offsets of docs/payload.md on the tiny model (any shape exercises it); the
real exchange with ds4 on the true-shape slice is test_ds4_reference.py's."""

from __future__ import annotations

import dataclasses
import io
import struct

import pytest
import torch

from ds4tui.engine.dsv4.session import Dsv4Session
from ds4tui.engine.errors import PayloadError
from ds4tui.format.payload import DS4_PAYLOAD_ABI, unpack_dsv4_header
from tests.engine.dsv4.dsv4_helpers import expected_size, load, save, single_thread, tiny, tokens  # noqa: F401 (fixture)

CTX, CHUNK = 1024, 128


def ds4_session(ctx: int = CTX) -> Dsv4Session:
    model = tiny()
    return Dsv4Session(model.net, dataclasses.replace(model.info, payload_abi=DS4_PAYLOAD_ABI), ctx, CHUNK)


def section_offsets(cfg, t: int) -> list[dict[str, int]]:
    """Byte offset of every layer's sections in a ds4-layout payload, from docs/payload.md."""
    d, idim, w = cfg.head_dim, cfg.index_head_dim, cfg.sliding_window
    off = 52 + 4 * t + 4 * cfg.vocab_size + 8 * cfg.num_hidden_layers
    out = []
    for r in cfg.compress_ratios:
        sec = {"raw": off}
        off += min(t, w) * d * 4
        if r:
            coff = 2 if r == 4 else 1
            frontier = (coff * r) * (coff * d) * 4
            sec["rows"] = off
            off += (t // r) * d * 4
            sec["state_kv"], sec["state_score"] = off, off + frontier
            sec["width"] = coff * d
            off += 2 * frontier
        if r == 4:
            off += (t // 4) * idim * 4 + 2 * 8 * (2 * idim) * 4
        out.append(sec)
    assert off == expected_size(cfg, t) - 32
    return out


@pytest.mark.parametrize("t", [3, 17, 130, 301])
def test_ds4_layout_has_no_fingerprint_and_ds4s_header(t):
    s = ds4_session()
    toks = tokens(t)
    s.prefill(toks)
    data = save(s)
    cfg = s.cfg
    assert len(data) == expected_size(cfg, t) - 32  # the same sections, without the 32-byte fingerprint
    h = unpack_dsv4_header(data)
    w = min(cfg.sliding_window, CTX)
    assert (h.payload_version, h.saved_ctx, h.prefill_chunk) == (1, CTX, min(CTX, 2048))
    assert (h.raw_capacity, h.raw_window, h.live_raw_rows) == (w, w, min(t, w))
    assert h.compressed_capacity == CTX // 4 + 2  # ds4's comp_cap of its first ratio-4 layer
    assert list(struct.unpack_from(f"<{t}I", data, 52)) == toks  # tokens right after the header
    logits = torch.frombuffer(bytearray(data[52 + 4 * t: 52 + 4 * t + 4 * cfg.vocab_size]), dtype=torch.float32)
    assert torch.equal(logits, s.logits)


@pytest.mark.parametrize("t", [17, 130])
def test_ds4_layout_round_trip_continues_bit_exact(t):
    toks = tokens(t + 20, seed=3)
    a = ds4_session()
    a.prefill(toks[:t])
    b = ds4_session()
    load(b, save(a))
    assert b.tokens == a.tokens and torch.equal(b.logits, a.logits)
    assert save(b) == save(a)
    a.prefill(toks[t:])
    b.prefill(toks[t:])
    assert torch.equal(a.logits, b.logits)


def test_ds4_layout_ignores_the_swa_policy():
    """ds4 knows only the full layout: a periodic policy still saves version 1, the whole window."""
    s = ds4_session()
    s.set_storage_policy("periodic:128")
    s.prefill(tokens(300))
    data = save(s)
    assert unpack_dsv4_header(data).payload_version == 1
    assert len(data) == expected_size(s.cfg, 300) - 32


def test_leftover_frontier_slots_are_cleared_not_refused():
    """After a decode step ds4 leaves the previous window's values in the slots the current
    window has not written yet; they are never read, so the load clears them."""
    t = 130  # ratio-4 layers: 2 slots of the current window written, 2 free
    toks = tokens(t + 8, seed=9)
    a = ds4_session()
    a.prefill(toks[:t])
    data = bytearray(save(a))
    cfg = a.cfg
    li = cfg.compress_ratios.index(4)
    sec = section_offsets(cfg, t)[li]
    width, free = sec["width"], 4 + t % 4
    stale_kv = sec["state_kv"] + free * width * 4
    stale_score = sec["state_score"] + free * width * 4
    data[stale_kv: stale_kv + 8] = struct.pack("<2f", 0.5, -0.25)
    data[stale_score: stale_score + 8] = struct.pack("<2f", 1.5, 2.0)
    b = ds4_session()
    load(b, bytes(data))
    assert save(b) == save(a)  # cleared back to (0, -1e30)
    for tok in toks[t:]:
        assert torch.equal(a.decode(tok), b.decode(tok))
    # ds4tui's own layout keeps refusing such a file (its canonical form is part of the format)
    own = tiny().new_session(CTX, chunk_size=CHUNK)
    own.prefill(toks[:t])
    mine = bytearray(save(own))
    sec_own = stale_kv + 32  # the same sections after the 32-byte fingerprint
    mine[sec_own: sec_own + 8] = struct.pack("<2f", 0.5, -0.25)
    with pytest.raises(PayloadError, match="not yet written"):
        load(tiny().new_session(CTX, chunk_size=CHUNK), bytes(mine))


def test_other_chunk_and_capacities_load_but_not_another_shape():
    """ds4's chunk and capacities describe its own buffers (a GPU build writes others); the
    layer count, widths and vocab are the state's and must match."""
    s = ds4_session()
    s.prefill(tokens(40))
    data = bytearray(save(s))
    struct.pack_into("<I", data, 12, 512)  # prefill_chunk
    struct.pack_into("<I", data, 24, 9999)  # compressed_capacity
    b = ds4_session()
    load(b, bytes(data))
    assert torch.equal(b.logits, s.logits)
    struct.pack_into("<I", data, 32, s.cfg.num_hidden_layers + 1)  # layer_count
    with pytest.raises(PayloadError, match="layer_count"):
        load(ds4_session(), bytes(data))


def test_a_ds4tui_payload_is_not_read_as_ds4s():
    own = tiny().new_session(CTX, chunk_size=CHUNK)
    own.prefill(tokens(40))
    with pytest.raises(PayloadError):
        load(ds4_session(), save(own))
    buf = io.BytesIO()
    s = ds4_session()
    s.prefill(tokens(40))
    s.save_payload(buf)
    with pytest.raises(PayloadError, match="fingerprint"):
        load(tiny().new_session(CTX, chunk_size=CHUNK), buf.getvalue())


def test_ds4_layout_files_go_through_the_store_without_the_ds4tui_mark(tmp_path):
    """ds4 reads a file only when its quant byte is 2 or 4: a ds4-layout save leaves ds4tui's
    mark off; the store loads it back, and also after a ds4 hit rewrote bytes 7 and 20 to 0."""
    from ds4tui.cache.entry import Acceptor
    from ds4tui.cache.store import KvStore
    from ds4tui.format.kvc import OFFSET_PAYLOAD_ABI, read_kvc

    s = ds4_session()
    toks = tokens(40, seed=4)
    s.prefill(toks)
    ack = Acceptor(model_id=0, payload_abi=DS4_PAYLOAD_ABI, ctx_size=CTX, quant_bits=2)
    text = "ds4-layout session"
    assert KvStore(tmp_path).save(text, tokens=len(toks), reason="cold", engine=ack,
                                  payload_bytes=s.payload_bytes(), write_payload=s.save_payload).ok
    (path,) = tmp_path.glob("*.kv")
    with open(path, "rb") as fp:
        assert read_kvc(fp).header.quant_bits == 2
    with open(path, "r+b") as fp:  # what a ds4 hit leaves: its own fields, ABI byte 0
        fp.seek(OFFSET_PAYLOAD_ABI)
        fp.write(b"\0")
    b = ds4_session()
    assert KvStore(tmp_path).load(text + " and more", ack, b.load_payload).hit is not None
    assert b.tokens == toks and torch.equal(b.logits, s.logits)
    mine = tiny().new_session(CTX, chunk_size=CHUNK)
    mine.prefill(toks)
    own = Acceptor(model_id=0x81, ctx_size=CTX, quant_bits=4)
    assert KvStore(tmp_path / "own").save(text, tokens=len(toks), reason="cold", engine=own,
                                          payload_bytes=mine.payload_bytes(), write_payload=mine.save_payload).ok
    (path,) = (tmp_path / "own").glob("*.kv")
    with open(path, "rb") as fp:
        assert read_kvc(fp).header.quant_bits == 4 | 0x80
