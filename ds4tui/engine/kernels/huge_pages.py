"""The weight blocks the kernels stream, moved into transparent huge pages where they lie.

Owns: `move_into_huge_pages(path, tensors)`, which replaces the pages under tensors that are
views of a mapping of a safetensors file (what safetensors' `load_file` returns) with
anonymous memory advised MADV_HUGEPAGE holding the same bytes, at the same addresses;
`MoveInBackground`, which does that on a thread once the model is warm; and
`huge_pages_wanted()`.

Why: a decode step reads every weight block once per token (94 MB for SmolLM2-135M, 240 MB
for Gemma 3 270M). In 4 KiB pages that is tens of thousands of TLB misses a token, page
walks the streaming prefetchers cannot hide; in 2 MiB pages decode runs ~5% faster
(docs/perf-archive.md, "Weights in huge pages"). Anonymous memory also stays resident: a file's
page cache is reclaimed while a chat sits idle (proactive reclaim, memory pressure), and the
next message would read the weights from disk again. The bytes are read (plain reads, ~15
ms for 100 MB from the page cache, ~200 ms from disk) into a region aligned like the target
(address congruent modulo 2 MiB, so whole huge pages line up), then `mremap` moves that
region over the mapped range in one step. Addresses do not change, so every pointer the C
kernels hold (the step's table, each QuantMatrix) stays valid without a swap, and a forward
running meanwhile reads the file's bytes or their copy, the same bytes either way: the
kernel holds the address space's lock for the whole move, so a concurrent access waits for
it and never finds a hole. Hence it can run after the model is ready, off the start-up path.

Nothing moves where huge pages are not wanted (not Linux, THP `never`, DS4TUI_HUGE_PAGES=off
for A/B runs), for a tensor the file's header does not describe exactly (name, dtype, shape,
offsets inside the file), or for a range /proc/self/maps does not show as this file mapped
at the offsets the header gives. A failed read or move leaves the mapping as it was.
"""

from __future__ import annotations

import ctypes
import json
import math
import mmap
import os
import struct
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from ds4tui.engine import background

HUGE_PAGE = 2 << 20
PAGE = mmap.PAGESIZE
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
READ_PIECE = 8 << 20  # a move reads this much at a time (and checks for a stop in between)
DTYPES = {"U8": torch.uint8, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
MAP_FAILED = ctypes.c_void_p(-1).value


def huge_pages_wanted() -> bool:
    """True where anonymous memory advised MADV_HUGEPAGE gets huge pages (Linux, THP `always`
    or `madvise`) and DS4TUI_HUGE_PAGES is not `off`."""
    if os.environ.get("DS4TUI_HUGE_PAGES", "").strip().lower() in ("off", "0", "no"):
        return False
    if not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(os, "preadv"):
        return False
    try:
        setting = THP_SETTING.read_text()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled tensor in fresh private anonymous memory (zero until written, nothing
    touched here), advised MADV_HUGEPAGE and 2 MiB aligned where huge pages are wanted; a
    tensor under 2 MiB is plain `torch.zeros`.

    For a session's KV buffers: decode at depth reads every K/V row of every layer once per
    token (94 MB for SmolLM2 at 4K), and in 4 KiB pages that costs ~7% of the token there
    (docs/perf-archive.md, "KV buffers in huge pages"). Huge pages are faulted in on first write, 2
    MiB at a time: a buffer becomes resident in full soon after its first rows are written
    (its full size is what a session is counted at anyway). The mapping lives as long as the
    tensor and its views."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < HUGE_PAGE:
        return torch.zeros(shape, dtype=dtype)
    huge = huge_pages_wanted()
    try:
        # Private: shared anonymous memory is shmem, whose huge pages are another setting.
        mem = mmap.mmap(-1, nbytes + HUGE_PAGE * huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        whole = torch.frombuffer(mem, dtype=torch.uint8)  # holds a reference to `mem`
        start = -whole.data_ptr() % HUGE_PAGE if huge else 0
        if huge:
            mem.madvise(mmap.MADV_HUGEPAGE, start, (nbytes + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE)
    except (OSError, ValueError, AttributeError, TypeError):  # no such flags or advice here
        return torch.zeros(shape, dtype=dtype)
    return whole[start:start + nbytes].view(dtype).view(shape)


def move_into_huge_pages(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor],
                         stop: Callable[[], bool] = lambda: False) -> int:
    """Moves the pages under `tensors` (views of a mapping of the safetensors file at `path`,
    named as in it) into anonymous huge pages holding the same bytes; returns the bytes moved
    (0 where nothing was). `stop()` true: what is not moved yet stays as it is (checked
    between reads of READ_PIECE bytes)."""
    if not tensors or not huge_pages_wanted():
        return 0
    try:
        libc = _libc()
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            maps = _file_maps(st.st_ino, os.major(st.st_dev), os.minor(st.st_dev))
            spans = _spans(_mapped_ranges(f, tensors, maps), st.st_size)
            return sum(_move(libc, f.fileno(), base, lo, hi, st.st_size, stop) for base, lo, hi in spans
                       if _covered(maps, base, lo, hi))  # a merged span's gaps are this file's too
    except (OSError, ValueError, OverflowError, AttributeError):
        return 0


class MoveInBackground:
    """`move_into_huge_pages(path, tensors)` as a background chore, from `start()` on (the model's
    warm_up calls it last: started earlier, the move's read and the warm-up's first forward
    share the two cores and model-ready comes ~50 ms later). `wait()` starts it if need be and
    returns the bytes moved."""

    def __init__(self, path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], *, start: bool = True) -> None:
        self.moved = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._job = (path, dict(tensors)) if tensors and huge_pages_wanted() else None  # decided now
        if start:
            self.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """At the lowest priority (engine/background.py): a first message sent right at
        model-ready goes first."""
        with self._lock:
            if self._job is not None and self._thread is None:
                self._thread = background.start(self._run, "ds4tui-huge-pages")

    def _run(self) -> None:
        path, tensors = self._job
        self.moved = move_into_huge_pages(path, tensors, background.stopping)

    def wait(self, timeout: float | None = None) -> int:
        self.start()
        if self._thread is not None:
            self._thread.join(timeout)
        return self.moved


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mremap.restype = ctypes.c_void_p
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return libc


def _move(libc, fd: int, base: int, lo: int, hi: int, size: int, stop: Callable[[], bool]) -> int:
    """Addresses [lo, hi) (page aligned; file offset = address - base) -> anonymous huge pages."""
    if stop():
        return 0
    n = hi - lo
    reserve = libc.mmap(None, n + HUGE_PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if reserve in (None, MAP_FAILED):
        return 0
    dest = reserve + (lo - reserve) % HUGE_PAGE  # congruent with lo: huge pages line up
    moved = False
    try:
        libc.madvise(dest, n, mmap.MADV_HUGEPAGE)
        want = min(n, size - (lo - base))  # past the file's end the mapping reads zeros, as does fresh memory
        view = memoryview((ctypes.c_char * want).from_address(dest)).cast("B")
        done = 0
        while done < want:
            if stop():
                return 0
            got = os.preadv(fd, [view[done:done + READ_PIECE]], lo - base + done)
            if got <= 0:
                return 0  # the file shrank under us: keep the mapping
            done += got
        view.release()
        moved = libc.mremap(dest, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, lo) == lo
        return n if moved else 0
    finally:
        # what is left of the reservation: its slack, and the region itself if it did not move
        if moved:
            for a, b in ((reserve, dest), (dest + n, reserve + n + HUGE_PAGE)):
                if b > a:
                    libc.munmap(a, b - a)
        else:
            libc.munmap(reserve, n + HUGE_PAGE)


def _mapped_ranges(f, tensors: Mapping[str, torch.Tensor],
                   maps: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(mapping base, start, end) page-rounded addresses of the tensors that sit in a mapping
    of this file (`maps`) exactly where the header places them (base: where byte 0 is)."""
    placed = _placed(f, tensors)
    out = []
    for name, (start, end) in placed.items():
        addr = tensors[name].data_ptr()
        base = addr - start
        lo, hi = addr // PAGE * PAGE, -(-(addr + end - start) // PAGE) * PAGE
        if _covered(maps, base, lo, hi):
            out.append((base, lo, hi))
    return out


def _spans(ranges: list[tuple[int, int, int]], size: int) -> list[tuple[int, int, int]]:
    """Page ranges of one mapping merged where they touch or nearly do (a gap under a huge
    page moves with them: the same file bytes, so nothing else changes)."""
    out: list[list[int]] = []
    for base, lo, hi in sorted(ranges, key=lambda r: r[1]):
        if out and out[-1][0] == base and lo - out[-1][2] < HUGE_PAGE:
            out[-1][2] = max(out[-1][2], hi)
        else:
            out.append([base, lo, hi])
    return [(b, lo, hi) for b, lo, hi in out if lo - b < size]


def _file_maps(ino: int, major: int, minor: int) -> list[tuple[int, int, int]]:
    """(start, end, file offset) of this process's mappings of the file with that inode."""
    out = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 5 or int(fields[4]) != ino:
                continue
            dev_major, dev_minor = (int(x, 16) for x in fields[3].split(":"))
            if (dev_major, dev_minor) != (major, minor):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.append((lo, hi, int(fields[2], 16)))
    return out


def _covered(maps: list[tuple[int, int, int]], base: int, lo: int, hi: int) -> bool:
    """[lo, hi) lies wholly in mappings of the file whose byte 0 sits at `base`."""
    at = lo
    for start, end, offset in sorted(maps):
        if start <= at < end and start - offset == base:
            at = end
            if at >= hi:
                return True
    return False


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
        if not isinstance(entry, dict) or DTYPES.get(entry.get("dtype")) != t.dtype or not t.is_contiguous():
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
