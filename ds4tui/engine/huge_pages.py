"""Zeroed tensors on transparent huge pages (Linux), for the big buffers a forward streams through.

Owns: `zeros_on_huge_pages`, a zero-filled tensor in its own anonymous mapping, aligned
to 2 MiB and marked MADV_HUGEPAGE before anything touches it, so the kernel backs it with
2 MiB pages where it can. A session's KV buffer (106 MB for SmolLM2 at 4.6K context) is
read whole by every forward's attention and filled whole by a disk restore: with 4 KiB
pages each layer's 3.5 MB of rows spans ~900 TLB entries, with huge pages 2. Measured on
the development VM (docs/perf.md, "KV buffers on huge pages"): an 18-token forward at
position 4,169 30.0 -> 29.0 ms, the restore's read of 94 MB 7.2 -> 6.9 ms.

Anywhere the mapping or the advice is not available (not Linux, THP set to never, an
old kernel) the buffer is an ordinary zeroed tensor: same values, same contract.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # linux/mman.h
MIN_BYTES = HUGE_PAGE  # smaller buffers cannot hold a huge page

_libc = None


def _madvise():
    global _libc
    if _libc is None:
        # The process's own symbols (libc's madvise among them): find_library("c") would run
        # ldconfig in a subprocess, ~200 ms on the first buffer.
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype=dtype), on huge pages where the system gives them. The
    tensor keeps its mapping alive (numpy holds the mmap) and unmaps it when freed."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
    if not sys.platform.startswith("linux") or nbytes < MIN_BYTES:
        return torch.zeros(shape, dtype=dtype)
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    try:
        # One spare huge page: mmap aligns to 4 KiB, the buffer starts at the next 2 MiB boundary.
        mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return torch.zeros(shape, dtype=dtype)
    raw = np.frombuffer(mapping, dtype=np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE
    _madvise()(raw.ctypes.data + start, size, MADV_HUGEPAGE)  # advice only: a failure leaves 4 KiB pages
    region = raw[start:start + nbytes]  # zeros: a fresh anonymous mapping reads as zeros
    return torch.from_numpy(region).view(dtype).view(shape)
