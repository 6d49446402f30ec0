"""Weight blocks moved into huge pages (kernels/huge_pages.py): the same addresses and bytes,
anonymous memory in huge pages where the system has them, and nothing moved unless the file
mapped there is the one whose header places the tensor exactly. KV buffers allocated there
(`huge_pages.zeros`)."""

from __future__ import annotations

import json
import os
import struct
import threading

import pytest
import torch
from safetensors.torch import load_file, save_file

from ds4tui.engine.kernels import huge_pages
from ds4tui.engine.kernels.huge_pages import MoveInBackground, huge_pages_wanted, move_into_huge_pages

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")

MB = 1 << 20


@pytest.fixture()
def file(tmp_path):
    gen = torch.Generator().manual_seed(7)
    tensors = {
        "raw.a.0": torch.randint(0, 256, (96, 34), dtype=torch.uint8, generator=gen),
        "raw.b.0": torch.randint(0, 256, (1000, 4400), dtype=torch.uint8, generator=gen),  # over 2 MiB
        "raw.b.1": torch.randint(0, 256, (3, 5), dtype=torch.uint8, generator=gen),  # odd size: next is realigned
        "norm": torch.randn(64, generator=gen),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@pytest.fixture()
def wanted(monkeypatch):
    monkeypatch.setattr(huge_pages, "huge_pages_wanted", lambda: True)


def _mapping_of(address: int) -> tuple[str, int]:
    """(path, AnonHugePages kB) of the mapping holding `address` ('' for anonymous memory)."""
    found = None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            head = fields[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                if found is not None:
                    break
                lo, hi = (int(x, 16) for x in head.split("-"))
                if lo <= address < hi:
                    found = [fields[5] if len(fields) > 5 else "", 0]
            elif found is not None and line.startswith("AnonHugePages:"):
                found[1] = int(fields[1])
    assert found is not None, f"{address:#x} is not mapped"
    return found[0], found[1]


def test_blocks_move_in_place_with_their_bytes(file, wanted):
    path, want = file
    loaded = load_file(str(path))
    where = {name: t.data_ptr() for name, t in loaded.items()}
    assert all(_mapping_of(p)[0] == str(path) for p in where.values())  # load_file maps the file
    raw = {k: t for k, t in loaded.items() if k.startswith("raw.")}
    moved = move_into_huge_pages(path, raw)
    assert moved >= sum(t.numel() for t in raw.values())
    for name, t in loaded.items():
        assert t.data_ptr() == where[name], f"{name} changed address"
        assert torch.equal(t, want[name]), name
    for name in raw:
        assert _mapping_of(where[name])[0] == "", f"{name} still reads the file's mapping"


def test_a_tensor_the_header_does_not_describe_stays_in_the_mapping(file, wanted):
    path, want = file
    loaded = load_file(str(path))
    odd = {
        "raw.b.0": loaded["raw.b.0"].view(2000, 2200),  # another shape than the file says
        "raw.a.0": loaded["raw.a.0"][1:],  # another size
        "norm": loaded["norm"].view(torch.int32),  # another dtype
        "missing": loaded["raw.b.1"],  # a name the file does not have
    }
    assert move_into_huge_pages(path, odd) == 0
    for name, t in odd.items():
        assert _mapping_of(t.data_ptr())[0] == str(path), name
    assert torch.equal(loaded["raw.b.0"], want["raw.b.0"])


def test_tensors_not_mapped_from_that_file_stay(file, wanted, tmp_path):
    path, want = file
    loaded = load_file(str(path))
    copies = {name: t.clone() for name, t in loaded.items()}  # right shapes, but not the file's pages
    assert move_into_huge_pages(path, copies) == 0
    other = tmp_path / "other.safetensors"  # the same bytes in another file: its header, not its pages
    other.write_bytes(path.read_bytes())
    assert move_into_huge_pages(other, loaded) == 0
    assert all(_mapping_of(t.data_ptr())[0] == str(path) for t in loaded.values())


@pytest.mark.parametrize("damage", ["header_past_end", "offsets_past_end", "not_json", "short_file"])
def test_a_replaced_or_damaged_file_moves_nothing(file, wanted, damage):
    path, want = file
    loaded = load_file(str(path))
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    if damage == "header_past_end":
        data[:8] = struct.pack("<Q", len(data))
    elif damage == "offsets_past_end":  # raw.b.0 said to lie past the file's end
        header = json.loads(data[8: 8 + n])
        start, end = header["raw.b.0"]["data_offsets"]
        header["raw.b.0"]["data_offsets"] = [len(data), len(data) + end - start]
        text = json.dumps(header).encode()
        data = bytearray(struct.pack("<Q", len(text)) + text + data[8 + n:])
    elif damage == "not_json":
        data[8: 8 + n] = b"{" * n
    else:
        del data[len(data) // 2:]
    path.unlink()  # a new file: `loaded` keeps mapping the old one, which is not this file
    path.write_bytes(bytes(data))
    assert move_into_huge_pages(path, loaded) == 0
    for name, t in loaded.items():
        assert torch.equal(t, want[name]), name
        assert _mapping_of(t.data_ptr())[0] != "", name


def test_switched_off_by_the_environment(file, monkeypatch):
    path, _ = file
    monkeypatch.setenv("DS4TUI_HUGE_PAGES", "off")
    assert not huge_pages_wanted()
    loaded = load_file(str(path))
    assert move_into_huge_pages(path, loaded) == 0
    assert all(_mapping_of(t.data_ptr())[0] == str(path) for t in loaded.values())


def test_readers_see_the_same_bytes_while_the_blocks_move(file, wanted):
    """The move runs behind a ready model: a reader never finds a hole or other bytes."""
    path, want = file
    loaded = load_file(str(path))
    big, expected = loaded["raw.b.0"], int(want["raw.b.0"].sum())
    sums, stop = [], threading.Event()

    def read() -> None:
        while not stop.is_set():
            sums.append(int(big.sum()))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        move = MoveInBackground(path, {"raw.b.0": big})
        assert move.wait(timeout=300) > 0
    finally:
        stop.set()
        reader.join()
    assert sums and all(s == expected for s in sums)
    assert _mapping_of(big.data_ptr())[0] == ""


@pytest.mark.skipif(not huge_pages_wanted(), reason="this system gives no transparent huge pages (THP never, or not Linux)")
def test_the_moved_blocks_sit_in_huge_pages(file):
    path, _ = file
    loaded = load_file(str(path))
    assert move_into_huge_pages(path, {"raw.b.0": loaded["raw.b.0"]}) > 0
    assert _mapping_of(loaded["raw.b.0"].data_ptr())[1] >= 2048


def test_zeros_in_huge_pages_are_zero_aligned_and_outlive_the_call(wanted):
    import gc

    t = huge_pages.zeros((3, 2, 1000, 512), torch.float16)  # 6 MB
    assert t.shape == (3, 2, 1000, 512) and t.dtype == torch.float16 and t.is_contiguous()
    assert t.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert _mapping_of(t.data_ptr())[0] == ""  # anonymous memory
    gc.collect()  # the mapping lives with the tensor, not with the call
    assert not t.any()
    t[2, 1, 999] = 1.5
    assert float(t.float().sum()) == 1.5 * 512


def test_small_or_unwanted_zeros_are_zeros_too(monkeypatch):
    small = huge_pages.zeros((4, 100), torch.float32)
    assert small.shape == (4, 100) and not small.any()
    monkeypatch.setenv("DS4TUI_HUGE_PAGES", "off")
    big = huge_pages.zeros((2, 1 << 20), torch.float32)  # fresh anonymous memory, not advised
    assert big.shape == (2, 1 << 20) and not big.any()
    assert _mapping_of(big.data_ptr())[0] == ""
    big[1, -1] = 2.0
    assert float(big.sum()) == 2.0


@pytest.mark.skipif(not huge_pages_wanted(), reason="this system gives no transparent huge pages (THP never, or not Linux)")
def test_a_written_kv_buffer_sits_in_huge_pages():
    from ds4tui.engine.llama.kv_buffers import new_kv
    from ds4tui.engine.llama.tiny import CONFIG
    from ds4tui.engine.llama.config import LlamaConfig

    cfg = LlamaConfig.from_hf({**CONFIG, "num_hidden_layers": 4, "hidden_size": 256})  # 4 heads of 64
    kv = new_kv(cfg, 4096)  # 4 x 2 x 2 x 4096 x 64 f16: 8 MB
    kv[:, :, :, 0] = 1.0  # a first row per head touches every 2 MiB of it
    assert _mapping_of(kv.data_ptr())[1] >= 2048
