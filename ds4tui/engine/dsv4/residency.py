"""Which routed experts' bytes a GGUF-loaded DeepSeek V4 model has touched, page by page.

Owns the measurement behind "a token reads only its experts": `forget_pages(model)` drops
this process's page-table entries for the model's file mapping (madvise DONTNEED), evicts the
file from the page cache (fsync, then posix_fadvise DONTNEED) and turns off read-ahead
(MADV_RANDOM), so that the next read of a page reads and maps that page alone (a fault maps
the pages around it only when those are cached: the kernel's fault-around, up to 64 KB,
would otherwise mark a tiny model's neighbouring experts as read);
`expert_pages(model)` then reads /proc/self/pagemap's present bits over every ExpertBank and
reports, per layer and matrix, which experts have a page mapped and how many pages are.
Linux only (`available()`); a measurement for tests and benchmarks, never for inference.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from ds4tui.engine.dsv4.linear import ExpertBank

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def available() -> bool:
    return os.path.exists("/proc/self/pagemap") and hasattr(mmap, "MADV_DONTNEED")


def _mapping(model) -> mmap.mmap:
    m = getattr(getattr(model, "reader", None), "data", None)
    mm = getattr(m, "_mmap", None)
    if mm is None:
        raise ValueError("not a GGUF-loaded model (no file mapping)")
    return mm


def forget_pages(model) -> None:
    """Unmap every page of the model's file from this process and evict it from the page cache."""
    mm = _mapping(model)
    mm.madvise(mmap.MADV_RANDOM)
    mm.madvise(mmap.MADV_DONTNEED)
    fd = os.open(model.source_file, os.O_RDONLY)
    try:
        os.fsync(fd)  # a freshly written file's dirty pages would stay cached
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def present(addr: int, nbytes: int) -> np.ndarray:
    """Present bits of the pages covering [addr, addr + nbytes) in this process."""
    first, last = addr // PAGE, (addr + nbytes - 1) // PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read((last - first + 1) * 8)
    return (np.frombuffer(raw, dtype="<u8") >> np.uint64(63)).astype(bool)


@dataclass
class BankPages:
    """One ExpertBank's residency: pages mapped, pages in all, and the experts with a page
    mapped that lies wholly inside their own rows (a page shared with a neighbour is not
    evidence for either)."""

    mapped: int
    pages: int
    experts: frozenset[int]
    bytes_per_expert: int


def bank_pages(bank: ExpertBank) -> BankPages:
    addr, nbytes = bank.blocks.data_ptr(), bank.blocks.numel()
    bits = present(addr, nbytes)
    first = addr // PAGE
    eb = bank.expert_bytes
    touched = set()
    for e in range(bank.n_experts):
        lo, hi = addr + e * eb, addr + (e + 1) * eb
        p0, p1 = -(-lo // PAGE), hi // PAGE  # pages wholly inside [lo, hi)
        if p1 > p0 and bits[p0 - first:p1 - first].any():
            touched.add(e)
    return BankPages(int(bits.sum()), int(bits.size), frozenset(touched), eb)


def mapped_bytes(model) -> int:
    """Bytes of the model's file mapped in this process now (whole pages)."""
    m = model.reader.data
    return int(present(m.ctypes.data, m.nbytes).sum()) * PAGE


def expert_pages(model) -> dict[tuple[int, str], BankPages]:
    """(layer, "w1" | "w3" | "w2") -> that bank's residency now."""
    out = {}
    for li, lw in enumerate(model.net.w.layers):
        for w in ("w1", "w3", "w2"):
            bank = getattr(lw.moe, w)
            if isinstance(bank, ExpertBank):
                out[(li, w)] = bank_pages(bank)
    return out
