"""LlamaSession: one conversation on a llama-family model (KV buffers + payload I/O).

Owns the session state (tokens, next-token logits, the KV buffers) and its
payload in the DSV4 framing of ds4tui/format/payload.py. Full attention is the degenerate
DSV4 case: one raw window covering the whole context (the K and V of every KV
head for each token), no compressed or indexer rows. A model with
sliding-window layers (Gemma 3) keeps, per sliding layer, a ring of its last W
rows only (the row of position p at slot p % W), and stores them under the
session's SWA policy (swa.py); global layers are stored whole.

The KV buffers are laid out [2 (K, V), Hkv, rows, D] per layer (a model without
sliding layers has them as one [layers, 2, Hkv, ctx, D] tensor, which the fused C
decode step reads): each head's keys are contiguous rows, which attention reads
without a copy (a token-major layout, [ctx, 2, Hkv, D], made long-context decode
slower: strided K/V). The payload stores the rows in the same head-major order
(the KV_HEAD_MAJOR bit of payload_version): per layer, for K then V, for each KV
head, that head's rows in token order. So save writes each such run from the buffer
as it lies, and load reads each run straight into the buffer slice where attention
will read it (one readinto per run, 180 of 512 KiB for 4K tokens of SmolLM2 in f16,
hashed by a verifying stream as it arrives), then checks it for NaN/infinity while
it is still in the core's cache: no staging buffer, no reordering copy. A sliding
layer's run is its window oldest first: the ring's slots from the oldest row to the
end, then from the start. Files written before the head-major order hold
token-major rows ([T, 2, Hkv, D] per layer, ds4's raw-row order); they still load,
through a staging buffer per layer and a numpy reordering copy on the calling
thread (torch's copy_ of this size is split over its OpenMP threads, and on a busy
2-core machine one preempted thread stalls the whole copy; docs/perf-archive.md, "KV buffer
layout and the reorder copy").

A disk hit restores a prefix and then prefills the new message after it. The forward
of layer l reads only layer l's rows, so `load_payload_ahead` (told the message's
tokens) runs the message's first prefill chunk while the rows are still being read:
a reader thread fills the head-major rows layer by layer (overlap.py) and the forward
waits before each layer until that layer is in (the model's `before_layer` hook). The
reader writes rows < T, the forward rows T.. of the same buffers: disjoint. Nothing is
kept until the whole payload is read, its checksum verified and every run checked
finite; then the chunk is kept aside (`_ahead`, beyond the session's tokens) and the
next prefill of those very tokens at T takes it instead of running the same forward
again (any other forward, a rewind or a reset drops it). On any failure the session is
reset to empty as for any failed load. Only where it is simple: full attention (the
chunk's rows would go into ring slots the read also fills, and a zero or periodic
file's rings are rebuilt by a replay after the read), head-major files, chunks of 2+
tokens (one token runs as the fused C step, all layers in one call), a message of at
most a chunk's worth of tokens (a long prefill keeps its first progress event and
cancel point) that fits the context.

The buffers hold f16 (the default, as llama.cpp's cache) or f32, the session's
`kv_dtype`; the payload stores the rows in that type and says so (the KV_F16 bit of
payload_version, format/swa_policy.py), so a file is only ever read by a session of
its own type: an f16 file into an f32 session, or the reverse, is rejected.
"""

from __future__ import annotations

import dataclasses
import os
from typing import BinaryIO, Callable, Iterator, Protocol, Sequence, Union

import numpy as np
import torch

from ds4tui.format.payload import DSV4_MAGIC, FINGERPRINT_BYTES, Dsv4Header, framing_bytes
from ds4tui.format.swa_policy import (
    FULL_POLICY,
    HEAD_MAJOR,
    KV_F16,
    KV_HEAD_MAJOR,
    PERIODIC,
    SwaPolicy,
    kv_dtype_of_version,
    parse_policy,
    row_order_of_version,
)
from ds4tui.engine.payload import (
    PayloadReader,
    check_field,
    check_finite,
    check_finite_array,
    check_fingerprint,
    write_array,
    write_framing,
)
from ds4tui.engine.errors import PayloadError
from ds4tui.engine.kernels import huge_pages
from ds4tui.engine.llama.config import LlamaConfig
from ds4tui.engine.llama.overlap import LayerGate, read_while_forward
from ds4tui.engine.llama.swa import LlamaSwa, layout_for_save, layout_from_header, zero_start
from ds4tui.engine.model import ModelInfo
from ds4tui.engine.session import ForwardInterrupted, ProgressFn, RewindCost, Session
from ds4tui.engine.swa_layout import RestoreInfo, SwaLayout, read_marker, replay_tail, write_marker

# Version of the llama per-layer sections inside the DSV4 framing (header field payload_version):
# the `full` tag of the SWA policies, which is all a model without sliding layers writes.
LLAMA_PAYLOAD_VERSION = 1

# The K/V types a session can hold ("f16" rounds each row once, when it is written).
KV_DTYPES = {"f16": torch.float16, "f32": torch.float32}
DEFAULT_KV_DTYPE = "f16"

# One decode step for several sessions at once (LlamaModel.decode_batch); DS4TUI_BATCH_DECODE=0
# decodes each on its own (the fused C step), one after another.
def batch_decode_enabled() -> bool:
    return os.environ.get("DS4TUI_BATCH_DECODE", "1") != "0"


# Memory the marks of a session with sliding layers may hold in ring copies.
MARK_BYTES = 64 << 20
# One [layers, 2, Hkv, ctx, D] tensor (no sliding layers) or one [2, Hkv, rows, D] per layer.
KvBuffers = Union[torch.Tensor, list]


def kv_shapes(cfg: LlamaConfig, ctx: int) -> list[tuple[int, ...]]:
    """Per layer [2, Hkv, rows, D]: rows = ctx for a global layer, min(W, ctx) for a sliding one."""
    ring = min(cfg.sliding_window, ctx) if cfg.sliding_layers else ctx
    return [(2, cfg.num_kv_heads, ring if cfg.is_sliding(i) else ctx, cfg.head_dim) for i in range(cfg.num_layers)]


def kv_torch_dtype(kv_dtype: str) -> torch.dtype:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype {kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")
    return KV_DTYPES[kv_dtype]


def new_kv(cfg: LlamaConfig, ctx: int, kv_dtype: str = DEFAULT_KV_DTYPE) -> KvBuffers:
    """Zero-filled buffers (a zero-policy replay attends to ring rows it has not rebuilt yet),
    in huge pages where the system has them: decode at depth reads them all every token
    (kernels/huge_pages.py)."""
    dtype = kv_torch_dtype(kv_dtype)
    if not cfg.sliding_layers:
        return huge_pages.zeros((cfg.num_layers, 2, cfg.num_kv_heads, ctx, cfg.head_dim), dtype)
    return [huge_pages.zeros(shape, dtype) for shape in kv_shapes(cfg, ctx)]


def kv_bytes(kv: KvBuffers) -> int:
    if isinstance(kv, torch.Tensor):
        return kv.numel() * kv.element_size()
    return sum(t.numel() * t.element_size() for t in kv)


def fits(kv: KvBuffers, cfg: LlamaConfig, ctx: int, dtype: torch.dtype) -> bool:
    """Whether `kv` is a buffer set of these shapes (kv_shapes) and type, each contiguous.
    One tensor is checked whole: iterating it makes a view per layer (torch's unbind, whose
    first call in a process took ~0.2 ms of a disk hit)."""
    if isinstance(kv, torch.Tensor):
        want = (cfg.num_layers, 2, cfg.num_kv_heads, ctx, cfg.head_dim)
        return not cfg.sliding_layers and tuple(kv.shape) == want and kv.dtype == dtype and kv.is_contiguous()
    return ([tuple(t.shape) for t in kv] == kv_shapes(cfg, ctx)
            and all(t.dtype == dtype and t.is_contiguous() for t in kv))


class LlamaForward(Protocol):
    """What a session needs of its model (LlamaModel): the shapes, the identity its payloads
    carry, one forward over the session's KV buffers, and its spare buffers for a copy."""

    cfg: LlamaConfig
    info: ModelInfo

    def forward(self, kv: KvBuffers, tokens: list[int], pos: int, want_logits: bool,
                frozen_global: bool = False, before_layer: Callable[[int], None] | None = None
                ) -> torch.Tensor | None: ...

    def take_spare(self, ctx: int, kv_dtype: str) -> KvBuffers | None: ...


@dataclasses.dataclass(frozen=True)
class _Ahead:
    """A prefill chunk run alongside a restore and not yet part of the session: its K/V rows
    lie at pos..pos+len(tokens)-1 of the buffers (beyond the session's tokens, so nothing
    reads them), its logits are those of its last token (None: not computed)."""

    pos: int
    tokens: list[int]
    logits: torch.Tensor | None


class LlamaSession(Session):
    def __init__(self, model: LlamaForward, ctx_size: int, chunk_size: int,
                 kv: KvBuffers | None = None, kv_dtype: str = DEFAULT_KV_DTYPE) -> None:
        """kv: buffers of this session's shapes and kv_dtype ("f16" or "f32") to adopt (the
        model's pre-touched spare, see LlamaModel.warm_up); their content is irrelevant."""
        super().__init__(ctx_size, chunk_size)
        self.model = model
        cfg = model.cfg
        self.kv_dtype = kv_dtype
        dtype = kv_torch_dtype(kv_dtype)
        self.swa = LlamaSwa()
        if kv is not None:
            if not fits(kv, cfg, ctx_size, dtype):
                raise ValueError(f"kv buffers do not fit {kv_shapes(cfg, ctx_size)} {kv_dtype}")
            if cfg.sliding_layers:
                for t in kv:
                    t.zero_()
        # Rows of global layers >= len(self.tokens) are never read, so they need no zeroing.
        self.kv = kv if kv is not None else new_kv(cfg, ctx_size, kv_dtype)
        # The first chunk of the next prefill, when a restore ran it already (load_payload_ahead).
        self._ahead: _Ahead | None = None

    @property
    def kv_bytes(self) -> int:
        """Bytes of K/V this session holds in memory (sliding layers: their rings only)."""
        return 0 if self.kv is None else kv_bytes(self.kv)

    def release(self) -> KvBuffers | None:
        """Hand over this session's KV buffers (for another session to adopt: the model's
        spare, LlamaModel.release_session) and with them its state; None when already
        released. Anything that would read or write them afterwards raises."""
        kv, self.kv = self.kv, None
        self.reset()
        return kv

    def _check_live(self) -> None:
        if self.kv is None:
            raise RuntimeError("this session was released: its KV buffers belong to another session now")

    def _forward(self, tokens: list[int], want_logits: bool) -> torch.Tensor | None:
        self._check_live()
        vocab = self.model.cfg.vocab_size
        for t in tokens:
            if not 0 <= t < vocab:
                raise ValueError(f"token id {t} outside vocab of {vocab}")
        # A chunk a restore already ran is taken as it is (the same call with the same inputs);
        # any other forward may overwrite its rows or the rows it read: it is dropped.
        ahead, self._ahead = self._ahead, None
        if (ahead is not None and ahead.pos == len(self.tokens) and ahead.tokens == tokens
                and (ahead.logits is not None or not want_logits) and not self.swa.replaying):
            return ahead.logits if want_logits else None
        # A chat's prefill may stop between two layers of a chunk (Session.prefill's interrupt):
        # a global layer's rows of the chunk lie beyond self.tokens, never read; a sliding
        # layer's ring slots are put back as they were (the one-token fused step has no layers
        # to stop between).
        check = self._layer_check() if len(tokens) > 1 and not self.swa.replaying else None
        undo = self._ring_slots(len(self.tokens), len(tokens)) if check is not None else None
        try:
            with torch.inference_mode():
                out = self.model.forward(self.kv, tokens, len(self.tokens), want_logits, self.swa.replaying,
                                         before_layer=check)
        except ForwardInterrupted:
            if undo is not None:
                slots, rows = undo
                with torch.inference_mode():
                    for i, saved in zip(self.model.cfg.sliding_layers, rows):
                        self.kv[i].index_copy_(2, slots, saved)
            raise
        if not self.swa.replaying:
            self._maybe_snapshot(len(self.tokens) + len(tokens))
        return out

    def _ring_slots(self, pos: int, n: int) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """The ring slots a chunk of n tokens at pos overwrites in each sliding layer, and a copy
        of what they hold now (None without sliding layers): what undoes a half-run chunk."""
        cfg = self.model.cfg
        if not cfg.sliding_layers:
            return None
        ring = self.kv[cfg.sliding_layers[0]].shape[2]
        slots = torch.arange(pos, pos + min(n, ring)) % ring
        return slots, [self.kv[i].index_select(2, slots) for i in cfg.sliding_layers]

    def _forward_together(self, others: Sequence[Session], tokens: Sequence[int]) -> list[torch.Tensor] | None:
        batch = [self, *others]
        model = self.model
        if (not hasattr(model, "decode_batch") or not batch_decode_enabled()
                or any(not isinstance(s, LlamaSession) or s.model is not model or s.swa.replaying for s in batch)):
            return None
        vocab = model.cfg.vocab_size
        for s, t in zip(batch, tokens):
            s._check_live()
            if not 0 <= t < vocab:
                raise ValueError(f"token id {t} outside vocab of {vocab}")
            s._ahead = None  # as any forward of its own would
        with torch.inference_mode():
            logits = model.decode_batch([s.kv for s in batch], list(tokens), [len(s.tokens) for s in batch])
        for s in batch:
            s._maybe_snapshot(len(s.tokens) + 1)
        return logits

    def reset(self) -> None:
        self._ahead = None
        self.tokens = []
        self.logits = None
        self._marks = {}
        self._ends = []
        self.swa.forget()
        if self.model.cfg.sliding_layers and self.kv is not None:
            for t in self.kv:
                t.zero_()

    # -- SWA storage policy ---------------------------------------------------------------

    def set_storage_policy(self, policy: SwaPolicy | str) -> bool:
        if not self.model.cfg.sliding_layers:
            return False
        self.swa.policy = parse_policy(policy) if isinstance(policy, str) else policy
        if self.swa.policy.kind != PERIODIC:
            self.swa.snapshot_at = self.swa.snapshot = None  # only periodic saves read it
        else:
            self._maybe_snapshot(len(self.tokens))
        return True

    def _maybe_snapshot(self, end: int) -> None:
        # Prefill chunks end on multiples of the chunk size, and the effective period is one,
        # so every frontier is the end of some forward (or a decode step).
        k = self.swa.policy.effective_period(self.chunk_size)
        if k and end and end % k == 0:
            self.swa.snapshot = [self._window_rows(i, end) for i in self.model.cfg.sliding_layers]
            self.swa.snapshot_at = end

    def _window_rows(self, layer: int, at: int) -> torch.Tensor:
        """A copy of a sliding layer's live ring as [2, Hkv, min(at, W), D], oldest first (the
        payload's head-major order); `at` is the number of tokens the ring has seen."""
        ring = self.kv[layer]
        m = min(at, self.model.cfg.sliding_window, ring.shape[2])
        slots = torch.arange(at - m, at) % ring.shape[2]
        return ring.index_select(2, slots)

    # -- rewind and fork ----------------------------------------------------------------------
    # Global layers keep full KV: the rows of a prefix never change. A sliding layer's ring
    # only holds its last W rows, so a mark also keeps a copy of the rings, and a rewind to a
    # point without one rebuilds them like a zero-policy load (swa.py): re-run the tokens of
    # the receptive field with the global layers frozen.

    def _capture_mark(self) -> object:
        if not self.model.cfg.sliding_layers:
            return self.logits
        return self.logits, [self.kv[i].clone() for i in self.model.cfg.sliding_layers]

    @property
    def max_marks(self) -> int:  # type: ignore[override]
        """Full attention: the base class's count (a mark is the logits). Sliding layers: as
        many ring copies as fit in MARK_BYTES (at least 2)."""
        cfg = self.model.cfg
        if not cfg.sliding_layers:
            return Session.max_marks
        ring = sum(t.numel() * t.element_size() for i, t in enumerate(self.kv) if cfg.is_sliding(i))
        return max(2, min(Session.max_marks, MARK_BYTES // max(ring, 1)))

    def _rewind_plan(self, n_tokens: int) -> RewindCost:
        if n_tokens in self._marks:
            return RewindCost(n_tokens, n_tokens, 0, "kept")
        cfg = self.model.cfg
        if not cfg.sliding_layers:
            # The rows before n are intact; only the logits at n are missing: run the last token
            # again (a decode step: exactly what produced them if that token was decoded).
            return RewindCost(n_tokens, n_tokens - 1, 1, "recompute")
        below = [m for m in self._marks if m < n_tokens]
        start = zero_start(n_tokens, len(cfg.sliding_layers), cfg.sliding_window, self.chunk_size)
        if below and max(below) >= start:
            m = max(below)
            return RewindCost(n_tokens, m, n_tokens - m, "mark")
        return RewindCost(n_tokens, start, n_tokens - start, "rebuild")

    def _rewind_to(self, plan: RewindCost, on_progress: ProgressFn | None) -> None:
        self._ahead = None
        n = plan.target
        sliding = self.model.cfg.sliding_layers
        if plan.how == "kept":
            self.tokens = self.tokens[:n]
            mark = self._marks[n]
            if sliding:
                mark, rings = mark
                for i, ring in zip(sliding, rings):
                    self.kv[i].copy_(ring)
            self.logits = mark
        elif plan.how == "recompute":
            last = self.tokens[n - 1]
            self.tokens = self.tokens[: n - 1]
            self.logits = self._forward([last], want_logits=True)
            self.tokens.append(last)
            if on_progress is not None:
                on_progress(1, 1)
        else:  # "mark" or "rebuild": the rings as of plan.restore_from, then the tokens up to n again
            tokens = self.tokens[:n]
            if plan.how == "mark":
                for i, ring in zip(sliding, self._marks[plan.restore_from][1]):
                    self.kv[i].copy_(ring)
            else:
                for i in sliding:
                    self.kv[i].zero_()
            self.tokens, self.logits = tokens[: plan.restore_from], None
            self.swa.replaying = True  # global layers read their rows and write none
            try:
                self._replay(plan.restore_from, tokens, on_progress)
            finally:
                self.swa.replaying = False
        if self.swa.snapshot_at is not None and self.swa.snapshot_at > n:
            self.swa.snapshot_at = self.swa.snapshot = None

    def _copy(self, n_tokens: int) -> "LlamaSession":
        self._check_live()
        # Into the model's spare when it has one (memory already faulted in: a fork of a 4K chat
        # copies 92 MB, and into fresh memory the faults cost more than the copy).
        other = LlamaSession(self.model, self.ctx_size, self.chunk_size, kv_dtype=self.kv_dtype,
                             kv=self.model.take_spare(self.ctx_size, self.kv_dtype))
        n = n_tokens
        # One numpy copy of the prefix's rows (see the module docstring on torch's copy_);
        # a sliding layer's whole ring (rewind then restores or rebuilds it for n).
        for i, (src, dst) in enumerate(zip(self.kv, other.kv)):
            rows = src.shape[2] if self.model.cfg.is_sliding(i) else n
            np.copyto(dst.numpy()[:, :, :rows], src.numpy()[:, :, :rows])
        other.tokens = self.tokens[:n]
        other.logits = self.logits if n == len(self.tokens) else None
        other.swa.policy = self.swa.policy
        return other

    # -- payload --------------------------------------------------------------------------

    def _layout(self) -> SwaLayout:
        cfg, t = self.model.cfg, len(self.tokens)
        if not cfg.sliding_layers:
            return SwaLayout(FULL_POLICY, t, t, t)
        return layout_for_save(self.swa, t, self.chunk_size, len(cfg.sliding_layers), cfg.sliding_window)

    def _rows(self, layout: SwaLayout, layer: int) -> int:
        """Rows a payload of this layout holds for one layer."""
        cfg = self.model.cfg
        return min(layout.raw_at, cfg.sliding_window) if cfg.is_sliding(layer) else layout.tokens

    def _header(self, layout: SwaLayout) -> Dsv4Header:
        cfg, t = self.model.cfg, layout.tokens
        sliding = bool(cfg.sliding_layers)
        return Dsv4Header(
            magic=DSV4_MAGIC,
            payload_version=layout.version | KV_HEAD_MAJOR | (KV_F16 if self.kv_dtype == "f16" else 0),
            saved_ctx=self.ctx_size,
            prefill_chunk=self.chunk_size,
            raw_capacity=self.ctx_size,
            raw_window=cfg.sliding_window if sliding else self.ctx_size,
            compressed_capacity=0,
            token_count=t,
            layer_count=cfg.num_layers,
            head_dim=cfg.kv_row_floats,
            indexer_head_dim=0,
            vocab_size=cfg.vocab_size,
            # the rows of a sliding layer (every global layer holds token_count)
            live_raw_rows=min(layout.raw_at, cfg.sliding_window) if sliding else t,
        )

    def payload_bytes(self) -> int:
        cfg = self.model.cfg
        layout = self._layout()
        rows = sum(self._rows(layout, i) for i in range(cfg.num_layers))
        return (framing_bytes(layout.tokens, cfg.vocab_size, cfg.num_layers) + layout.marker_bytes
                + KV_DTYPES[self.kv_dtype].itemsize * rows * cfg.kv_row_floats)

    def save_payload(self, fp: BinaryIO) -> None:
        self._check_live()
        cfg = self.model.cfg
        layout = self._layout()
        # A session stopped between prefill chunks has no next-token logits; it is saved with
        # zero logits (no real model emits an all-zero row), which load turns back into None.
        logits = self.logits if self.logits is not None else torch.zeros(cfg.vocab_size)
        zeros = [0] * cfg.num_layers
        write_framing(fp, self._header(layout), self.model.info.fingerprint, self.tokens, logits, zeros, zeros)
        write_marker(fp, layout)
        # Head-major rows, written from the buffers as they lie: per (K or V, head) one
        # contiguous run of rows, or two for a ring that has wrapped.
        for layer in range(cfg.num_layers):
            for part, rows in self._row_runs(layer, layout):
                write_array(fp, rows, part)

    def _row_runs(self, layer: int, layout: SwaLayout) -> Iterator[tuple[str, np.ndarray]]:
        """(what, array) of one layer's payload rows in head-major file order: views of the KV
        buffer (a periodic save of a sliding layer: of the snapshot)."""
        cfg = self.model.cfg
        if not cfg.is_sliding(layer):
            buf = self._kv_array(layer)
            for kv in range(2):
                for head in range(cfg.num_kv_heads):
                    yield f"layer {layer} {'KV'[kv]} rows of head {head}", buf[kv, head, :layout.tokens]
            return
        at = layout.raw_at
        if at == 0:
            return
        if at != layout.tokens:  # periodic: the window as of raw_at, kept as [2, Hkv, m, D]
            assert self.swa.snapshot is not None and self.swa.snapshot_at == at
            yield f"layer {layer} window rows", self.swa.snapshot[cfg.sliding_layers.index(layer)].numpy()
            return
        for kv, head, rows in self._ring_runs(layer, at):
            yield f"layer {layer} {'KV'[kv]} window rows of head {head}", rows

    def _kv_array(self, layer: int) -> np.ndarray:
        """Layer `layer`'s buffer [2, Hkv, rows, D] as a numpy view (its slices are what the
        payload reads into and writes from)."""
        return self.kv[layer].numpy()

    def _ring_runs(self, layer: int, at: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """(kv, head, view) of a sliding layer's live window after `at` tokens, oldest first:
        per head the ring's slots (at - m) % R .. R-1, then 0 .. (wrapped)."""
        ring = self._kv_array(layer)
        r = ring.shape[2]
        m = min(at, self.model.cfg.sliding_window, r)
        start = (at - m) % r
        first = min(m, r - start)
        for kv in range(2):
            for head in range(self.model.cfg.num_kv_heads):
                yield kv, head, ring[kv, head, start:start + first]
                if m > first:
                    yield kv, head, ring[kv, head, :m - first]

    def load_payload(self, fp: BinaryIO, nbytes: int) -> None:
        self.load_payload_ahead(fp, nbytes, ())

    def load_payload_ahead(self, fp: BinaryIO, nbytes: int, ahead: Sequence[int]) -> None:
        """load_payload, running the first prefill chunk of `ahead` (the tokens the caller
        will prefill next) while the rows are still coming from disk; the next prefill of
        those tokens then takes that chunk as done. See the module docstring for when."""
        try:
            self._load(fp, nbytes, list(ahead))
        except BaseException:
            self.reset()  # never half-restored: an empty, usable session
            raise

    def _load(self, fp: BinaryIO, nbytes: int, ahead: list[int]) -> None:
        self._check_live()
        cfg = self.model.cfg
        self.reset()
        r = PayloadReader(fp, nbytes)
        h = r.read_header()
        check_fingerprint(r.read_bytes(FINGERPRINT_BYTES, "the fingerprint"), self.model.info.fingerprint, self.model.info.name)
        payload_version = h.payload_version
        file_dtype, version = kv_dtype_of_version(payload_version)
        if file_dtype != self.kv_dtype:
            raise PayloadError(f"payload holds {file_dtype} K/V rows, this session's kv_dtype is {self.kv_dtype}")
        h = dataclasses.replace(h, payload_version=version)
        check_field(h, "layer_count", cfg.num_layers)
        check_field(h, "head_dim", cfg.kv_row_floats)
        check_field(h, "indexer_head_dim", 0)
        check_field(h, "compressed_capacity", 0)
        check_field(h, "vocab_size", cfg.vocab_size)
        if cfg.sliding_layers:
            layout = layout_from_header(h, len(cfg.sliding_layers), cfg.sliding_window)
            check_field(h, "raw_window", cfg.sliding_window)
            check_field(h, "live_raw_rows", min(layout.raw_at, cfg.sliding_window))
        else:
            check_field(h, "payload_version", LLAMA_PAYLOAD_VERSION)
            check_field(h, "raw_window", h.raw_capacity)  # full attention: the window is the context
            check_field(h, "live_raw_rows", h.token_count)
            layout = SwaLayout(FULL_POLICY, h.token_count, h.token_count, h.token_count)
        t = h.token_count
        if t > self.ctx_size:
            raise PayloadError(f"payload holds {t} tokens, this session's context is {self.ctx_size}")
        if t > h.raw_capacity:
            raise PayloadError(f"payload holds {t} tokens but says its context was {h.raw_capacity}")
        tokens = r.read_tokens(t, cfg.vocab_size)
        logits = r.read_f32((cfg.vocab_size,), "the logits")
        check_finite(logits, "the logits")
        for what in ("compressed row counts", "indexer row counts"):
            counts = r.read_u32(cfg.num_layers, what)
            if any(counts):
                raise PayloadError(f"payload has nonzero {what}: a llama model has none")
        read_marker(r, layout)
        head_major = row_order_of_version(payload_version) == HEAD_MAJOR
        chunk = self._first_chunk(t, ahead) if head_major else []
        ahead_logits = None
        if chunk:
            want = len(chunk) == len(ahead)
            ahead_logits = read_while_forward(
                lambda gate: self._read_rows(r, layout, gate),
                lambda before_layer: self._forward_ahead(chunk, t, want, before_layer))
        elif head_major:
            self._read_rows(r, layout, None)
        else:
            self._read_token_major(r, layout)
            r.finish()
        # Every byte read and the checksum verified: the state (and the chunk run ahead) is kept.
        self.tokens = tokens
        # numpy on this thread: torch's any() wakes its OpenMP threads, which on a busy
        # 2-core host stalled a restore for milliseconds
        self.logits = None if not logits.numpy().any() else logits
        if cfg.sliding_layers:
            self._finish_load(layout)  # the rings first: a mark copies them
        self._ends = [t] if t else []
        self.keep_mark()
        if chunk:
            self._ahead = _Ahead(t, chunk, ahead_logits)

    def _read_rows(self, r: PayloadReader, layout: SwaLayout, gate: LayerGate | None) -> None:
        """The head-major rows straight into the buffers: each run's bytes are read (and hashed,
        by a verifying stream) into the slice where attention reads them, then checked while
        in cache; then the end of the payload. With a gate (a forward runs alongside): each
        finished layer is announced, and a stop asked for by the forward is obeyed."""
        for layer in range(self.model.cfg.num_layers):
            for part, rows in self._row_runs_for_load(layer, layout):
                if gate is not None and gate.stopped:
                    return
                r.read_into_array(rows, part)
                check_finite_array(rows, part)
            if gate is not None:
                gate.filled(layer + 1)
        r.finish()

    def _first_chunk(self, t: int, ahead: list[int]) -> list[int]:
        """The chunk of `ahead` a restore of `t` tokens runs alongside its reads: the first one
        a prefill of `ahead` after t would run (it ends on a multiple of the chunk size);
        empty where it is not done. Only full attention (see the module docstring). At least
        two tokens: one runs as the fused C step, all layers in one call, no layer to wait
        for (and it is a millisecond's work). At most a chunk's worth of tokens in all: a
        longer message is a long prefill, where the read is a small share and the first
        progress event and cancel point stay where they were. The whole of `ahead` must fit
        the context (else the turn refuses it) and be in the vocab (else the prefill says why)."""
        cfg = self.model.cfg
        if cfg.sliding_layers or t == 0 or t + len(ahead) > self.ctx_size or len(ahead) > self.chunk_size:
            return []
        if any(not 0 <= x < cfg.vocab_size for x in ahead):
            return []
        boundary = (t // self.chunk_size + 1) * self.chunk_size
        chunk = ahead[:boundary - t]
        return chunk if len(chunk) >= 2 else []

    def _forward_ahead(self, chunk: list[int], t: int, want_logits: bool,
                       before_layer: Callable[[int], None]) -> torch.Tensor | None:
        """The chunk's forward at t as a prefill would run it (same call, same inputs), each
        layer once its restored rows are in."""
        with torch.inference_mode():
            return self.model.forward(self.kv, chunk, t, want_logits, False, before_layer=before_layer)

    def _row_runs_for_load(self, layer: int, layout: SwaLayout) -> Iterator[tuple[str, np.ndarray]]:
        """Where a head-major payload's rows of one layer go: the buffer's slices, a sliding
        layer's into the ring slots of the window as of raw_at (never a snapshot)."""
        if self.model.cfg.is_sliding(layer):
            for kv, head, rows in self._ring_runs(layer, layout.raw_at):
                yield f"layer {layer} {'KV'[kv]} window rows of head {head}", rows
            return
        yield from self._row_runs(layer, layout)

    # Files written before the head-major order (no KV_HEAD_MAJOR bit): the rows are token-major,
    # [T, 2, Hkv, D] per layer, so they go through a staging buffer and a reordering copy.

    def _read_token_major(self, r: PayloadReader, layout: SwaLayout) -> None:
        cfg, t = self.model.cfg, layout.tokens
        stage = None
        for layer in range(cfg.num_layers):
            if cfg.is_sliding(layer):
                self._read_ring_token_major(r, layer, layout.raw_at)
                continue
            if stage is None:  # size bounded by ctx_size, checked by the caller
                stage = torch.empty((t, 2, cfg.num_kv_heads, cfg.head_dim), dtype=KV_DTYPES[self.kv_dtype])
            r.read_into(stage, f"layer {layer} KV rows")
            check_finite(stage, f"layer {layer} KV rows")  # while the layer is still in cache
            # [T, 2, Hkv, D] -> [2, Hkv, T, D] in numpy, on this thread (see the module docstring)
            np.copyto(self.kv[layer][:, :, :t].numpy(), stage.numpy().transpose(1, 2, 0, 3))

    def _read_ring_token_major(self, r: PayloadReader, layer: int, at: int) -> None:
        """Rows of the window live after `at` tokens, oldest first, into their ring slots."""
        ring = self.kv[layer]
        m = min(at, self.model.cfg.sliding_window)
        rows = r.read_f32((m, 2, self.model.cfg.num_kv_heads, self.model.cfg.head_dim), f"layer {layer} window rows",
                          KV_DTYPES[self.kv_dtype])
        check_finite(rows, f"layer {layer} window rows")
        if m:
            slots = torch.arange(at - m, at) % ring.shape[2]
            ring.index_copy_(2, slots, rows.permute(1, 2, 0, 3))

    def _finish_load(self, layout: SwaLayout) -> None:
        """Keep a periodic file's window as this session's snapshot, then rebuild the sliding
        windows by re-running the tokens the file did not store them for."""
        t = layout.tokens
        if layout.policy.kind == PERIODIC and self.swa.policy.kind == PERIODIC and 0 < layout.raw_at < t:
            self.swa.snapshot = [self._window_rows(i, layout.raw_at) for i in self.model.cfg.sliding_layers]
            self.swa.snapshot_at = layout.raw_at
        info = RestoreInfo(str(layout.policy), t, 0, 0.0, None)
        if layout.replay_from < t:
            info = replay_tail(self, self.swa, layout)
        self.swa.last_restore = info
        self._maybe_snapshot(t)


