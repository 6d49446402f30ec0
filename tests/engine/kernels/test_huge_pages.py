"""Weight blocks read into huge pages (kernels/huge_pages.py): exact copies, read from the
file's own bytes, in huge pages where the system has them, and the mapping's tensors kept
whenever the file does not describe a tensor exactly."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from ds4tui.engine.kernels import huge_pages
from ds4tui.engine.kernels.huge_pages import huge_pages_wanted, read_into_huge_pages

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


def _inside(t: torch.Tensor, other: torch.Tensor) -> bool:
    start = other.untyped_storage().data_ptr()
    return start <= t.data_ptr() < start + other.untyped_storage().nbytes()


def test_copies_are_exact_aligned_and_not_the_mapping(file, wanted):
    path, want = file
    loaded = load_file(str(path))
    got = read_into_huge_pages(path, loaded)
    assert set(got) == set(loaded)
    for name, t in got.items():
        assert t.dtype == want[name].dtype and t.shape == want[name].shape and t.is_contiguous()
        assert torch.equal(t, want[name]), name
        assert t.data_ptr() % 64 == 0, name
        assert not _inside(t, loaded[name]), f"{name} still reads the file's mapping"
    # one arena, starting on a huge page boundary, in the file's order
    first = min(t.data_ptr() for t in got.values())
    assert first % (2 * MB) == 0


def test_a_tensor_the_header_does_not_describe_is_kept_as_loaded(file, wanted):
    path, want = file
    loaded = load_file(str(path))
    odd = {
        "raw.a.0": loaded["raw.a.0"],
        "raw.b.0": loaded["raw.b.0"].view(2000, 2200),  # another shape than the file says
        "missing": torch.zeros(4, 4, dtype=torch.uint8),  # not in the file
        "norm": loaded["norm"].to(torch.float16),  # another dtype
    }
    got = read_into_huge_pages(path, odd)
    assert not _inside(got["raw.a.0"], loaded["raw.a.0"]) and torch.equal(got["raw.a.0"], want["raw.a.0"])
    for name in ("raw.b.0", "missing", "norm"):
        assert got[name] is odd[name], name


@pytest.mark.parametrize("damage", ["header_past_end", "offsets_past_end", "not_json", "short_file"])
def test_a_damaged_file_leaves_the_mapping_tensors(file, wanted, damage):
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
    path.unlink()  # a new file: `loaded` keeps mapping the old one
    path.write_bytes(bytes(data))
    got = read_into_huge_pages(path, loaded)
    kept = set(loaded) if damage in ("header_past_end", "not_json") else {"raw.b.0"}
    for name, t in loaded.items():
        if name in kept:
            assert got[name] is t, name
        elif got[name] is not t:  # a tensor the damage missed may be read; it must be exact
            assert torch.equal(got[name], want[name]), name
    if damage == "offsets_past_end":
        assert got["raw.a.0"] is not loaded["raw.a.0"]  # the others are still read


def test_switched_off_by_the_environment(file, monkeypatch):
    path, _ = file
    monkeypatch.setenv("DS4TUI_HUGE_PAGES", "off")
    assert not huge_pages_wanted()
    loaded = load_file(str(path))
    got = read_into_huge_pages(path, loaded)
    assert all(got[k] is loaded[k] for k in loaded)


def _anon_huge_kb(address: int) -> int:
    """AnonHugePages of the mapping holding `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


@pytest.mark.skipif(not huge_pages_wanted(), reason="this system gives no transparent huge pages (THP never, or not Linux)")
def test_the_copies_sit_in_huge_pages(file):
    path, _ = file
    got = read_into_huge_pages(path, load_file(str(path)))
    assert _anon_huge_kb(got["raw.b.0"].data_ptr()) >= 2048
