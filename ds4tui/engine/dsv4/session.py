"""Dsv4Session: one conversation on a DeepSeek V4 model.

Owns the live state (tokens, next-token logits, the per-layer `LayerCache`
list of cache.py) and ties it to the network (net.py) and the
payload (payload.py).

Chunk size: prefill chunks end on absolute multiples of `chunk_size` (the base
class does it), and chunk_size must be a multiple of every compression ratio
(128 for Flash). Then every chunk boundary is also a compressor window
boundary: a chunk never closes a window that an earlier chunk opened, so a
cold prefill and a restored session that resumes on a chunk boundary emit
every compressed row from the same batched computation, bit for bit. (Between
a chunk of n tokens and n single-token decodes the math is the same but the
matmul shapes differ, so results agree to rounding, with identical discrete
choices; tests check both.)
"""

from __future__ import annotations

from typing import BinaryIO

import torch

from ds4tui.engine.dsv4.cache import new_layer_caches
from ds4tui.engine.dsv4.net import Dsv4Net, Dsv4Trace
from ds4tui.engine.dsv4.payload import payload_size, read_payload, write_payload
from ds4tui.engine.dsv4.state import SwaState
from ds4tui.engine.dsv4.swa import after_forward, set_policy
from ds4tui.engine.model import ModelInfo
from ds4tui.engine.session import Session
from ds4tui.format.swa_policy import SwaPolicy


class Dsv4Session(Session):
    def __init__(self, net: Dsv4Net, info: ModelInfo, ctx_size: int, chunk_size: int) -> None:
        """net: the model's network (shared by its sessions); info: the model's identity,
        whose fingerprint every payload carries."""
        super().__init__(ctx_size, chunk_size)
        cfg = net.cfg
        if chunk_size % cfg.ratio_lcm:
            raise ValueError(f"chunk size {chunk_size} is not a multiple of the compression ratios ({cfg.ratio_lcm})")
        self.net = net
        self.info = info
        self.cfg = cfg
        self.layers = new_layer_caches(
            cfg.compress_ratios, cfg.head_dim, cfg.index_head_dim, cfg.sliding_window, ctx_size
        )
        self.trace: Dsv4Trace | None = None  # set to record discrete choices (tests, debugging)
        self._last_streams: torch.Tensor | None = None  # HC streams of the last position [1, hc, D]
        self.swa = SwaState()  # SWA storage policy of saves, periodic snapshots (swa.py)

    def _forward(self, tokens: list[int], want_logits: bool) -> torch.Tensor | None:
        vocab = self.cfg.vocab_size
        for tok in tokens:
            if not 0 <= tok < vocab:
                raise ValueError(f"token id {tok} outside vocab of {vocab}")
        with torch.no_grad():
            logits, last = self.net.forward(self.layers, tokens, len(self.tokens), want_logits, self.trace)
        self._last_streams = last
        after_forward(self, len(self.tokens) + len(tokens))  # periodic SWA snapshots
        return logits

    def next_logits(self) -> torch.Tensor | None:
        """The next-token logits, computed from the last position's streams when a prefill
        was stopped between chunks (self.logits is then None). None for an empty session."""
        if self.logits is None and self.tokens and self._last_streams is not None:
            with torch.no_grad():
                self.logits = self.net.logits_of(self._last_streams)[0]
        return self.logits

    def reset(self) -> None:
        self.tokens = []
        self.logits = None
        self._last_streams = None
        self.swa.forget()
        for lc in self.layers:
            lc.reset()

    def set_storage_policy(self, policy: SwaPolicy | str) -> bool:
        set_policy(self, policy)
        return True

    # -- payload (payload.py) -----------------------------------------------------------

    def payload_bytes(self) -> int:
        return payload_size(self)

    def save_payload(self, fp: BinaryIO) -> None:
        write_payload(self, fp)

    def load_payload(self, fp: BinaryIO, nbytes: int) -> None:
        """A payload rejected by its header, fingerprint, counts or size leaves the session as
        it was; a failure while reading the sections (a short file, non-finite values) leaves
        it empty. Never half-restored."""
        touched = False

        def begin() -> None:
            nonlocal touched
            touched = True
            self.reset()

        try:
            read_payload(self, fp, nbytes, begin)
        except BaseException:
            if touched:
                self.reset()
            raise
