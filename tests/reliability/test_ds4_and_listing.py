"""Sharing a directory with ds4, and no titled session dropping out of the list without a word."""

from __future__ import annotations

import os
import struct

import pytest

from ds4tui.cache import KvStore, inspect_file
from ds4tui.chat import events as ev
from ds4tui.format.kvc import OFFSET_HITS, QUANT_DS4TUI_MARK, parse_kvc
from tests.cache.kvc_builders import dsv4_payload, write_kv
from tests.chat.conftest import Recorder


def ds4_reads(head: bytes) -> bool:
    """ds4's ds4_kvstore_read_header verdict, from its published rule: magic KVC, version 1,
    tokens != 0 and quant_bits 2 or 4."""
    return head[:4] == b"KVC\x01" and struct.unpack_from("<I", head, 8)[0] != 0 and head[4] in (2, 4)


def ds4_hit(path) -> None:
    """What a ds4 hit does to a file it reads: the 48-byte header rebuilt from ds4's own fields,
    bytes 7 (model_id) and 20-23 (payload ABI, reserved) zeroed, hits + 1."""
    raw = bytearray(open(path, "rb").read())
    hits = struct.unpack_from("<I", raw, OFFSET_HITS)[0]
    raw[7] = 0
    raw[20:24] = b"\0\0\0\0"
    struct.pack_into("<I", raw, OFFSET_HITS, hits + 1)
    open(path, "wb").write(bytes(raw))


@pytest.fixture(scope="module")
def tiny_llama():
    from ds4tui.engine.loader import load_model

    return load_model("tiny-llama")


@pytest.fixture
def ctl(tiny_llama, tmp_path):
    from tests.chat.conftest import make_controller

    return make_controller(tiny_llama, tmp_path)


def _chat(ctl, text="tell me about the sea"):
    conv = ctl.new_conversation()
    ctl.send(conv.key, text)
    assert conv.saved_sha
    return conv


def test_no_file_ds4tui_writes_is_read_by_ds4(ctl, tmp_path):
    _chat(ctl)
    names = [n for n in os.listdir(tmp_path) if n.endswith(".kv")]
    assert len(names) >= 2  # the titled session and at least one untitled checkpoint
    for name in names:
        head = (tmp_path / name).read_bytes()[:52]
        assert head[4] & QUANT_DS4TUI_MARK and not ds4_reads(head)
        assert inspect_file(tmp_path / name).valid  # and ds4tui still accepts its own mark


def test_a_file_whose_header_a_ds4_hit_rewrote_is_recognized_and_repaired(ctl, tmp_path):
    conv = _chat(ctl)
    path = tmp_path / f"{conv.saved_sha}.kv"
    # A file from before the mark (quant 4 unmarked), which the published ds4 reads and touches:
    raw = bytearray(path.read_bytes())
    raw[4] &= ~QUANT_DS4TUI_MARK & 0xFF
    path.write_bytes(bytes(raw))
    ds4_hit(path)
    e = inspect_file(path)
    assert e.header.model_id == 0 and e.header.payload_abi == 0 and not e.valid
    ctl.close(conv.key)
    [saved] = ctl.saved_sessions()  # the listing recognizes it by its payload and repairs it
    h = parse_kvc(path.read_bytes()).header
    assert (h.model_id, h.payload_abi) == (0x80, 128) and h.quant_bits & QUANT_DS4TUI_MARK
    assert h.hits == 1 and saved.problem is None
    resumed = ctl.resume(saved.sha)
    assert resumed.messages[-2]["content"] == "tell me about the sea"


def test_ds4s_own_pre_abi_files_are_not_taken_for_ours(ctl, tmp_path):
    path = write_kv(tmp_path, b"ds4 text", dsv4_payload(4, body=b"\0" * 64), tokens=4, model=0, abi=0)
    before = path.read_bytes()
    assert ctl.saved_sessions() == []
    ctl.checkpoints.store.scan(acceptor=ctl.checkpoints.acceptor())
    assert path.read_bytes() == before


def test_a_truncated_titled_session_stays_listed_with_its_reason(ctl, tmp_path):
    conv = _chat(ctl)
    ctl.close(conv.key)
    path = tmp_path / f"{conv.saved_sha}.kv"
    path.write_bytes(path.read_bytes()[:-100])
    assert ctl.saved_sessions() == []  # not offered for resume...
    [s] = ctl.checkpoints.titled_sessions(with_problems=True)  # ...but listed, marked
    # The title trailer was at the end: gone with it, so the list names the file by its sha.
    assert s.sha == conv.saved_sha and s.title.startswith("(unreadable title)") and "truncated" in s.problem
    with pytest.raises(LookupError, match="cannot be resumed: .*truncated"):
        ctl.resume(conv.saved_sha[:10])
    assert ctl.checkpoints.delete(s.sha) and not path.exists()  # and can be deleted from there


def test_a_titled_session_with_a_flipped_payload_byte_is_refused_kept_and_marked(ctl, tmp_path):
    conv = _chat(ctl)
    ctl.close(conv.key)
    path = tmp_path / f"{conv.saved_sha}.kv"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    # The chat itself is in the store: it opens from its history, and says why its file was refused.
    events = Recorder()
    reopened = ctl.resume(conv.title, events)
    assert not reopened.live and reopened.messages == conv.messages
    assert "checksum mismatch" in events.of(ev.HistoryOpened)[0].kv_problem
    assert path.exists()
    [s] = ctl.checkpoints.titled_sessions(with_problems=True)
    assert s.problem.startswith("checksum mismatch")
    with pytest.raises(LookupError, match="cannot be resumed: checksum mismatch"):
        ctl.saved.resume(conv.saved_sha[:12], Recorder())  # the file alone, as `--resume SHA` once did


def test_kv_ls_and_the_store_keep_listing_a_corrupt_titled_file(ctl, tmp_path):
    conv = _chat(ctl)
    ctl.close(conv.key)
    path = tmp_path / f"{conv.saved_sha}.kv"
    path.write_bytes(path.read_bytes()[:-100])
    e = {x.sha: x for x in KvStore(tmp_path).entries()}[conv.saved_sha]
    assert e.corrupt and e.header.titled


def test_a_renamed_old_file_is_rewritten_checksummed_and_marked(tmp_path):
    """A titled file from before checksums and the mark: its renamed copy has both."""
    from ds4tui.format.kvc import EXT_CHECKSUM

    path = write_kv(tmp_path, b"old chat", dsv4_payload(4, body=b"\1" * 64), tokens=4, model=0x80, abi=128,
                    quant=4, ctx=4096, ext=0x08, created=1_700_000_000,
                    trailers=struct.pack("<I", 3) + b"old", name=None)
    from tests.cache.kvc_builders import titled_name

    named = path.rename(tmp_path / titled_name(b"old", 1_700_000_000))
    new_sha = KvStore(tmp_path).rename_title(named.name[:40], "new")
    h = parse_kvc((tmp_path / f"{new_sha}.kv").read_bytes()).header
    assert h.ext_flags & EXT_CHECKSUM and h.quant_bits == 4 | QUANT_DS4TUI_MARK
    assert inspect_file(tmp_path / f"{new_sha}.kv", verify=True).checksum == "ok"
