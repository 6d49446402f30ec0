"""Routed experts paged from the GGUF mapping under a memory budget, and per-layer observers.

Owns the hooks the DSV4 forward calls for every layer (`LayerObserver`: before the layer,
with the experts its router chose, after it) and two observers:
- `ExpertPager`: a bounded resident set of routed experts over the file mapping, ds4's "SSD
  streaming" on Linux's page cache. A (layer, expert) unit is that expert's gate, up and
  down rows. Units are kept in least-recently-used order; when the units in use exceed the
  budget, the oldest are dropped from this process (madvise DONTNEED) and from the page
  cache (posix_fadvise DONTNEED), so RAM holds at most `budget` bytes of experts plus the
  dense weights. Read-ahead: when layer L starts, the experts layer L + 1 will likely use
  are requested from the disk (madvise WILLNEED, asynchronous), so the reads overlap layer
  L's compute: a hash layer's are known exactly (tid2eid of the tokens), a top-k layer's
  are guessed as the ones it chose for the previous token. Expert ranges are marked
  MADV_RANDOM, so a fault reads the page it needs, not its neighbours' experts.
- `LayerClock`: seconds per layer, prefill (chunks) and decode (single tokens) apart.
`process_memory()` and `disk_read_bytes()` read /proc/self (Linux; zeros elsewhere).
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections import OrderedDict
from typing import Mapping

import torch

from ds4tui.engine.dsv4.linear import ExpertBank

PAGE = mmap.PAGESIZE
BUDGET_ENV = "DS4TUI_EXPERT_BUDGET"  # GB of routed experts a GGUF-loaded model keeps resident


def budget_from_env(environ: Mapping[str, str] = os.environ) -> int | None:
    """DS4TUI_EXPERT_BUDGET (GB, decimal) in bytes; None when unset or empty; ValueError
    naming the variable for anything but a positive number."""
    raw = environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return None
    try:
        gb = float(raw)
    except ValueError:
        gb = -1.0
    if not gb > 0 or gb != gb or gb == float("inf"):
        raise ValueError(f"{BUDGET_ENV}={raw!r}: expected a positive number of GB, e.g. 12")
    return int(gb * 1e9)


class LayerObserver:
    """No-op hooks; the net calls every observer in `net.observers` (forward's order)."""

    def layer_start(self, layer: int, token_ids: torch.Tensor) -> None:
        pass

    def routed(self, layer: int, ids: torch.Tensor) -> None:
        pass

    def layer_done(self, layer: int, seconds: float, n_tokens: int) -> None:
        pass


class LayerClock(LayerObserver):
    """Seconds and tokens per layer: decode (one token per forward) and prefill apart; wall
    time, and this process's CPU time (every thread: a busy machine stretches the first, not
    the second)."""

    def __init__(self, n_layers: int) -> None:
        self.decode_s = [0.0] * n_layers
        self.prefill_s = [0.0] * n_layers
        self.decode_cpu_s = [0.0] * n_layers
        self.decode_tokens = [0] * n_layers
        self.prefill_tokens = [0] * n_layers
        self._cpu0 = 0.0

    def layer_start(self, layer: int, token_ids: torch.Tensor) -> None:
        self._cpu0 = time.process_time()

    def layer_done(self, layer: int, seconds: float, n_tokens: int) -> None:
        if n_tokens == 1:
            self.decode_s[layer] += seconds
            self.decode_cpu_s[layer] += time.process_time() - self._cpu0
            self.decode_tokens[layer] += 1
        else:
            self.prefill_s[layer] += seconds
            self.prefill_tokens[layer] += n_tokens


def _ranges(model, layer: int, expert: int) -> list[tuple[int, int]]:
    """File byte ranges (offset, length) of one expert's gate, up and down rows."""
    base = model.reader.data.ctypes.data
    out = []
    for w in ("w1", "w3", "w2"):
        bank: ExpertBank = getattr(model.net.w.layers[layer].moe, w)
        eb = bank.expert_bytes
        out.append((bank.blocks.data_ptr() - base + expert * eb, eb))
    return out


def _inner_pages(off: int, length: int) -> tuple[int, int]:
    """The whole pages inside [off, off + length): (start, length), length 0 if none."""
    start = -(-off // PAGE) * PAGE
    end = (off + length) // PAGE * PAGE
    return start, max(0, end - start)


def _outer_pages(off: int, length: int) -> tuple[int, int]:
    start = off // PAGE * PAGE
    return start, -(-(off + length) // PAGE) * PAGE - start


class ExpertPager(LayerObserver):
    """At most `budget_bytes` of routed experts resident (a GGUF-loaded model)."""

    def __init__(self, model, budget_bytes: int, readahead: bool = True) -> None:
        mm = getattr(getattr(model, "reader", None), "data", None)
        if getattr(mm, "_mmap", None) is None:
            raise ValueError("expert paging needs a GGUF-loaded model (a file mapping)")
        self.model, self.mm = model, mm._mmap
        self.budget = int(budget_bytes)
        self.readahead = readahead
        moe0 = model.net.w.layers[0].moe
        self.unit_bytes = sum(getattr(moe0, w).expert_bytes for w in ("w1", "w3", "w2"))
        if self.budget < self.unit_bytes * model.cfg.num_experts_per_tok:
            raise ValueError(f"an expert budget of {self.budget} bytes holds less than one token's experts "
                             f"({model.cfg.num_experts_per_tok} x {self.unit_bytes} bytes)")
        self.fd = os.open(model.source_file, os.O_RDONLY)
        self.lru: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.last: dict[int, list[int]] = {}  # layer -> experts it chose for the latest token
        self.evicted = self.prefetched = 0
        self._lock = threading.Lock()  # sessions of one model may run in different threads
        n = model.cfg.num_hidden_layers
        self.tid2eid = [model.net.w.layers[li].moe.tid2eid for li in range(n)]
        for li in range(n):  # no kernel read-ahead into other experts' rows
            for w in ("w1", "w3", "w2"):
                bank = getattr(model.net.w.layers[li].moe, w)
                off, length = _inner_pages(bank.blocks.data_ptr() - model.reader.data.ctypes.data, bank.blocks.numel())
                if length:
                    self.mm.madvise(mmap.MADV_RANDOM, off, length)

    @property
    def resident_bytes(self) -> int:
        """Bytes of the units this pager holds (an upper bound of what the experts occupy)."""
        return len(self.lru) * self.unit_bytes

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _prefetch(self, layer: int, experts) -> None:
        for e in experts:
            if (layer, e) in self.lru:
                continue
            for off, length in _ranges(self.model, layer, e):
                start, n = _outer_pages(off, length)
                self.mm.madvise(mmap.MADV_WILLNEED, start, n)
            self.prefetched += 1

    def layer_start(self, layer: int, token_ids: torch.Tensor) -> None:
        if not self.readahead:
            return
        with self._lock:
            self._readahead(layer, token_ids)

    def _readahead(self, layer: int, token_ids: torch.Tensor) -> None:
        for li in ((0, 1) if layer == 0 else (layer + 1,)):  # layer 0 has no layer before it
            if li >= len(self.tid2eid):
                continue
            table = self.tid2eid[li]
            if table is not None:  # a hash layer: its experts are the tokens' rows of tid2eid
                self._prefetch(li, sorted(set(table[token_ids].flatten().tolist())))
            elif li in self.last:
                self._prefetch(li, self.last[li])

    def routed(self, layer: int, ids: torch.Tensor) -> None:
        with self._lock:
            self._use(layer, sorted(set(ids.flatten().tolist())))

    def _use(self, layer: int, used: list[int]) -> None:
        self.last[layer] = used
        for e in used:
            self.lru[(layer, e)] = None
            self.lru.move_to_end((layer, e))
        # a unit in use by this step is never dropped: trim only what older steps left
        keep = set((layer, e) for e in used)
        while self.resident_bytes > self.budget:
            victim = next((k for k in self.lru if k not in keep), None)
            if victim is None:
                break
            del self.lru[victim]
            self._drop(*victim)

    def _drop(self, layer: int, expert: int) -> None:
        for off, length in _ranges(self.model, layer, expert):
            start, n = _inner_pages(off, length)
            if n:
                self.mm.madvise(mmap.MADV_DONTNEED, start, n)
                os.posix_fadvise(self.fd, start, n, os.POSIX_FADV_DONTNEED)
        self.evicted += 1


def process_memory() -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of this process in bytes (zeros where /proc is missing)."""
    out = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in out:
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def disk_read_bytes() -> int:
    """Bytes this process caused to be read from storage (/proc/self/io read_bytes; 0 if none)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


