"""The weight blocks the kernels stream, read into transparent huge pages.

Owns: `read_into_huge_pages(path, tensors)`: copies of tensors of a safetensors file, read
with plain reads straight from the file into one private anonymous mapping, 2 MiB aligned
and advised MADV_HUGEPAGE, each copy 64-byte aligned; and `huge_pages_wanted()`.

Why: a decode step reads every weight block once per token (94 MB for SmolLM2-135M, 240 MB
for Gemma 3 270M). Left in the file's mapping they sit in 4 KiB pages: tens of thousands of
TLB misses a token, page walks the streaming prefetchers cannot hide. In 2 MiB pages decode
runs ~5% faster (docs/perf.md, "Weights in huge pages"). Reading beats copying out of the
mapping too: faulting in 240 MB of mapped pages took ~300 ms on the reference VM, reading
them ~30 ms.

Where huge pages are not wanted (not Linux, THP set to `never`, DS4TUI_HUGE_PAGES=off for
A/B runs) the tensors are returned as they are. So is any tensor the file's header does not
describe exactly as loaded (name, dtype, shape, offsets inside the file), and all of them if
the mapping or a read fails: the caller then reads the file's mapping as before.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
ALIGN = 64  # a cache line
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
DTYPES = {"U8": torch.uint8, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}


def huge_pages_wanted() -> bool:
    """True where a private anonymous mapping advised MADV_HUGEPAGE gets huge pages (Linux,
    THP `always` or `madvise`) and DS4TUI_HUGE_PAGES is not `off`."""
    if os.environ.get("DS4TUI_HUGE_PAGES", "").strip().lower() in ("off", "0", "no"):
        return False
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        setting = THP_SETTING.read_text()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


def read_into_huge_pages(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` (loaded from the safetensors file at `path`, named as in it) with each one
    the header places exactly replaced by a copy read from the file into huge pages; the
    copies live as long as any of them does."""
    out = dict(tensors)
    if not tensors or not huge_pages_wanted():
        return out
    try:
        with open(path, "rb") as f:
            placed = _placed(f, tensors)
            if not placed:
                return out
            total = sum(_aligned(end - start) for start, end in placed.values())
            # MAP_PRIVATE: Python's default anonymous map is shared memory, which THP's
            # `enabled` setting does not cover.
            area = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            area.madvise(mmap.MADV_HUGEPAGE)
            arena = torch.frombuffer(area, dtype=torch.uint8)  # holds a reference to `area`
            view = memoryview(area)
            offset = (-arena.data_ptr()) % HUGE_PAGE  # start on a huge page boundary
            copies = {}
            for name, (start, end) in sorted(placed.items(), key=lambda kv: kv[1][0]):  # file order
                n = end - start
                f.seek(start)
                if f.readinto(view[offset: offset + n]) != n:
                    return out  # the file shrank under us: keep the mapping's tensors
                t = tensors[name]
                copies[name] = arena[offset: offset + n].view(t.dtype).view(t.shape)
                offset += _aligned(n)
            view.release()
    except (OSError, ValueError, OverflowError):
        return out
    out.update(copies)
    return out


def _placed(f, tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """File byte ranges of the tensors whose header entry matches them (dtype, shape, size),
    every range checked against the file's size."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(8)
    if len(head) != 8:
        return {}
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER or 8 + n > size:
        return {}
    try:
        header = json.loads(f.read(n))
    except (ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(header, dict):
        return {}
    base, placed = 8 + n, {}
    for name, t in tensors.items():
        entry = header.get(name)
        if not isinstance(entry, dict) or DTYPES.get(entry.get("dtype")) != t.dtype:
            continue
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if shape != list(t.shape):
            continue
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            continue
        start, end = base + offsets[0], base + offsets[1]
        if not base <= start <= end <= size or end - start != math.prod(t.shape) * t.element_size():
            continue
        placed[name] = (start, end)
    return placed


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
