"""LlamaSession: one conversation on a llama-family model (static KV buffer + payload I/O).

Owns the session state (tokens, next-token logits, the KV buffer) and its
payload in the DSV4 framing of ds4tui/format/payload.py. Full attention is the degenerate
DSV4 case: one raw window covering the whole context, a raw row per token
holding K then V of every KV head, no compressed or indexer rows.

The KV buffer is laid out [layers, 2 (K, V), Hkv, ctx, D]: each head's keys are
contiguous rows, which attention reads without a copy (a token-major layout,
[ctx, 2, Hkv, D], matched the payload but made long-context decode slower:
strided K/V). The payload is token-major, so save and load move one layer at a
time through a reused staging buffer [T, 2, Hkv, D] (6.4 MB at 4K tokens: it stays
in L3 between the read and the copy). The reordering copy runs in numpy, on the
calling thread: torch's copy_ of this size is split over its OpenMP threads, and
on a busy 2-core machine one preempted thread stalls the whole copy. Measurements:
docs/perf.md, "KV buffer layout and the reorder copy".
"""

from __future__ import annotations

from typing import BinaryIO, Protocol

import numpy as np
import torch

from ds4tui.format.payload import DSV4_MAGIC, FINGERPRINT_BYTES, Dsv4Header, framing_bytes
from ds4tui.engine.payload import (
    PayloadReader,
    check_field,
    check_finite,
    check_fingerprint,
    write_framing,
    write_tensor,
)
from ds4tui.engine.errors import PayloadError
from ds4tui.engine.llama.config import LlamaConfig
from ds4tui.engine.model import ModelInfo
from ds4tui.engine.session import ProgressFn, RewindCost, Session

# Version of the llama per-layer sections inside the DSV4 framing (header field payload_version).
LLAMA_PAYLOAD_VERSION = 1


class LlamaForward(Protocol):
    """What a session needs of its model (LlamaModel): the shapes, the identity its payloads
    carry, and one forward over the session's KV buffer."""

    cfg: LlamaConfig
    info: ModelInfo

    def forward(self, kv: torch.Tensor, tokens: list[int], pos: int, want_logits: bool) -> torch.Tensor | None: ...


class LlamaSession(Session):
    def __init__(self, model: LlamaForward, ctx_size: int, chunk_size: int,
                 kv: torch.Tensor | None = None) -> None:
        """kv: a buffer of this session's shape to adopt (the model's pre-touched spare, see
        LlamaModel.warm_up); its content is irrelevant."""
        super().__init__(ctx_size, chunk_size)
        self.model = model
        cfg = model.cfg
        shape = (cfg.num_layers, 2, cfg.num_kv_heads, ctx_size, cfg.head_dim)
        if kv is not None and (tuple(kv.shape) != shape or kv.dtype != torch.float32 or not kv.is_contiguous()):
            raise ValueError(f"kv buffer {tuple(kv.shape)} {kv.dtype} does not fit {shape} float32")
        # Rows >= len(self.tokens) are never read, so the buffer need not be zeroed.
        self.kv = kv if kv is not None else torch.empty(shape, dtype=torch.float32)

    def _forward(self, tokens: list[int], want_logits: bool) -> torch.Tensor | None:
        vocab = self.model.cfg.vocab_size
        for t in tokens:
            if not 0 <= t < vocab:
                raise ValueError(f"token id {t} outside vocab of {vocab}")
        with torch.inference_mode():
            return self.model.forward(self.kv, tokens, len(self.tokens), want_logits)

    def reset(self) -> None:
        self.tokens = []
        self.logits = None
        self._marks = {}
        self._ends = []

    # -- rewind and fork: every layer keeps full KV, so the rows of a prefix never change ---

    def _rewind_plan(self, n_tokens: int) -> RewindCost:
        if n_tokens in self._marks:
            return RewindCost(n_tokens, n_tokens, 0, "kept")
        # The rows before n are intact; only the logits at n are missing: run the last token
        # again (a decode step: exactly what produced them if that token was decoded).
        return RewindCost(n_tokens, n_tokens - 1, 1, "recompute")

    def _rewind_to(self, plan: RewindCost, on_progress: ProgressFn | None) -> None:
        n = plan.target
        if plan.how == "kept":
            self.tokens = self.tokens[:n]
            self.logits = self._marks[n]
            return
        last = self.tokens[n - 1]
        self.tokens = self.tokens[: n - 1]
        self.logits = self._forward([last], want_logits=True)
        self.tokens.append(last)
        if on_progress is not None:
            on_progress(1, 1)

    def _copy(self, n_tokens: int) -> "LlamaSession":
        other = LlamaSession(self.model, self.ctx_size, self.chunk_size)
        n = n_tokens
        # One numpy copy of the prefix's rows (see the module docstring on torch's copy_).
        np.copyto(other.kv.numpy()[:, :, :, :n], self.kv.numpy()[:, :, :, :n])
        other.tokens = self.tokens[:n]
        other.logits = self.logits if n == len(self.tokens) else self._marks.get(n)
        return other

    # -- payload --------------------------------------------------------------------------

    def _header(self, token_count: int) -> Dsv4Header:
        cfg = self.model.cfg
        return Dsv4Header(
            magic=DSV4_MAGIC,
            payload_version=LLAMA_PAYLOAD_VERSION,
            saved_ctx=self.ctx_size,
            prefill_chunk=self.chunk_size,
            raw_capacity=self.ctx_size,
            raw_window=self.ctx_size,
            compressed_capacity=0,
            token_count=token_count,
            layer_count=cfg.num_layers,
            head_dim=cfg.kv_row_floats,
            indexer_head_dim=0,
            vocab_size=cfg.vocab_size,
            live_raw_rows=token_count,
        )

    def payload_bytes(self) -> int:
        cfg = self.model.cfg
        t = len(self.tokens)
        return framing_bytes(t, cfg.vocab_size, cfg.num_layers) + 4 * cfg.num_layers * t * cfg.kv_row_floats

    def save_payload(self, fp: BinaryIO) -> None:
        cfg = self.model.cfg
        t = len(self.tokens)
        # A session stopped between prefill chunks has no next-token logits; it is saved with
        # zero logits (no real model emits an all-zero row), which load turns back into None.
        logits = self.logits if self.logits is not None else torch.zeros(cfg.vocab_size)
        zeros = [0] * cfg.num_layers
        write_framing(fp, self._header(t), self.model.info.fingerprint, self.tokens, logits, zeros, zeros)
        stage = self._stage(t)
        kv, st = self.kv.numpy(), stage.numpy()
        for layer in range(cfg.num_layers):
            np.copyto(st, kv[layer, :, :, :t].transpose(2, 0, 1, 3))  # [2, Hkv, T, D] -> [T, 2, Hkv, D]
            write_tensor(fp, stage, f"layer {layer} KV rows")

    def _stage(self, t: int) -> torch.Tensor:
        """A [T, 2, Hkv, D] buffer for one layer's payload rows."""
        cfg = self.model.cfg
        return torch.empty((t, 2, cfg.num_kv_heads, cfg.head_dim), dtype=torch.float32)

    def load_payload(self, fp: BinaryIO, nbytes: int) -> None:
        try:
            self._load(fp, nbytes)
        except BaseException:
            self.reset()  # never half-restored: an empty, usable session
            raise

    def _load(self, fp: BinaryIO, nbytes: int) -> None:
        cfg = self.model.cfg
        self.reset()
        r = PayloadReader(fp, nbytes)
        h = r.read_header()
        check_fingerprint(r.read_bytes(FINGERPRINT_BYTES, "the fingerprint"), self.model.info.fingerprint, self.model.info.name)
        check_field(h, "payload_version", LLAMA_PAYLOAD_VERSION)
        check_field(h, "layer_count", cfg.num_layers)
        check_field(h, "head_dim", cfg.kv_row_floats)
        check_field(h, "indexer_head_dim", 0)
        check_field(h, "compressed_capacity", 0)
        check_field(h, "vocab_size", cfg.vocab_size)
        check_field(h, "raw_window", h.raw_capacity)  # full attention: the window is the context
        check_field(h, "live_raw_rows", h.token_count)
        t = h.token_count
        if t > self.ctx_size:
            raise PayloadError(f"payload holds {t} tokens, this session's context is {self.ctx_size}")
        if t > h.raw_capacity:
            raise PayloadError(f"payload holds {t} tokens but says its context was {h.raw_capacity}")
        tokens = r.read_u32(t, "the tokens")
        bad = next((x for x in tokens if x >= cfg.vocab_size), None)
        if bad is not None:
            raise PayloadError(f"payload token {bad} is outside the vocab of {cfg.vocab_size}")
        logits = r.read_f32((cfg.vocab_size,), "the logits")
        check_finite(logits, "the logits")
        for what in ("compressed row counts", "indexer row counts"):
            counts = r.read_u32(cfg.num_layers, what)
            if any(counts):
                raise PayloadError(f"payload has nonzero {what}: a llama model has none")
        stage = self._stage(t)  # size bounded by ctx_size, checked above
        kv, st = self.kv.numpy(), stage.numpy()
        for layer in range(cfg.num_layers):
            r.read_into(stage, f"layer {layer} KV rows")
            check_finite(stage, f"layer {layer} KV rows")  # while the layer is still in cache
            np.copyto(kv[layer, :, :, :t], st.transpose(1, 2, 0, 3))  # [T, 2, Hkv, D] -> [2, Hkv, T, D]
        r.finish()
        self.tokens = tokens
        self.logits = None if not bool(logits.any()) else logits
        self._ends = [t] if t else []
        self.keep_mark()
