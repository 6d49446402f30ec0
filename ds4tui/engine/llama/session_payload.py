"""A LlamaSession's payload: its state written into, and read back from, the DSV4 framing of
ds4tui/format/payload.py.

Owns the file layout of a llama-family session and every check on the way in. Full
attention is the degenerate DSV4 case: one raw window covering the whole context (the K
and V of every KV head for each token), no compressed or indexer rows. A sliding layer
(Gemma 3) is stored under the session's SWA policy (swa.py); global layers whole.

The payload stores the rows in the buffers' head-major order (kv_buffers.py; the
KV_HEAD_MAJOR bit of payload_version): per layer, for K then V, for each KV head, that
head's rows in token order. So a save writes each such run from the buffer as it lies,
and a load reads each run straight into the buffer slice where attention will read it
(one readinto per run, 180 of 512 KiB for 4K tokens of SmolLM2 in f16, hashed by a
verifying stream as it arrives), then checks it for NaN/infinity while it is still in
the core's cache: no staging buffer, no reordering copy. A sliding layer's run is its
window oldest first: the ring's slots from the oldest row to the end, then from the
start. Files written before the head-major order hold token-major rows ([T, 2, Hkv, D]
per layer, ds4's raw-row order); they still load, through a staging buffer per layer and
a numpy reordering copy on the calling thread (torch's copy_ of this size is split over
its OpenMP threads, and on a busy 2-core machine one preempted thread stalls the whole
copy; docs/perf-archive.md, "KV buffer layout and the reorder copy").

A disk hit restores a prefix and then prefills the new message after it. The forward
of layer l reads only layer l's rows, so a load told the message's tokens
(`load_payload_ahead`) runs the message's first prefill chunk while the rows are still
being read: a reader thread fills the head-major rows layer by layer (overlap.py) and the
forward waits before each layer until that layer is in (the model's `before_layer` hook).
The reader writes rows < T, the forward rows T.. of the same buffers: disjoint. Nothing is
kept until the whole payload is read, its checksum verified and every run checked finite;
then the chunk is kept aside (`_Ahead`, beyond the session's tokens) and the next prefill
of those very tokens at T takes it instead of running the same forward again (any other
forward, a rewind or a reset drops it). On any failure the session is reset to empty as
for any failed load. Only where it is simple: full attention (the chunk's rows would go
into ring slots the read also fills, and a zero or periodic file's rings are rebuilt by a
replay after the read), head-major files, chunks of 2+ tokens (one token runs as the fused
C step, all layers in one call), a message of at most a chunk's worth of tokens (a long
prefill keeps its first progress event and cancel point) that fits the context.

The rows are stored in the session's `kv_dtype` and the payload says so (the KV_F16 bit of
payload_version, format/swa_policy.py), so a file is only ever read by a session of its
own type: an f16 file into an f32 session, or the reverse, is rejected.
"""

from __future__ import annotations

import dataclasses
from typing import Any, BinaryIO, Callable, Iterator, Protocol

import numpy as np
import torch

from ds4tui.engine.errors import PayloadError
from ds4tui.engine.llama.kv_buffers import KV_DTYPES
from ds4tui.engine.llama.overlap import LayerGate, read_while_forward
from ds4tui.engine.llama.swa import LlamaSwa, layout_for_save, layout_from_header
from ds4tui.engine.payload import (
    PayloadReader,
    check_field,
    check_finite,
    check_finite_array,
    check_fingerprint,
    write_array,
    write_framing,
)
from ds4tui.engine.swa_layout import RestoreInfo, SwaLayout, read_marker, replay_tail, write_marker
from ds4tui.format.payload import DSV4_MAGIC, FINGERPRINT_BYTES, Dsv4Header, framing_bytes
from ds4tui.format.swa_policy import (
    FULL_POLICY,
    HEAD_MAJOR,
    KV_F16,
    KV_HEAD_MAJOR,
    PERIODIC,
    kv_dtype_of_version,
    row_order_of_version,
)

# Version of the llama per-layer sections inside the DSV4 framing (header field payload_version):
# the `full` tag of the SWA policies, which is all a model without sliding layers writes.
LLAMA_PAYLOAD_VERSION = 1


@dataclasses.dataclass(frozen=True)
class _Ahead:
    """A prefill chunk run alongside a restore and not yet part of the session: its K/V rows
    lie at pos..pos+len(tokens)-1 of the buffers (beyond the session's tokens, so nothing
    reads them), its logits are those of its last token (None: not computed)."""

    pos: int
    tokens: list[int]
    logits: torch.Tensor | None


class PayloadSession(Protocol):
    """What the payload reads and writes of its session: a LlamaSession (session.py). That
    module imports this one, so the session is named by this protocol, not imported (nothing
    imports in a circle); these functions are the session's other half and use its state."""

    model: Any  # session.LlamaForward: cfg, info, forward
    kv: Any  # kv_buffers.KvBuffers
    kv_dtype: str
    ctx_size: int
    chunk_size: int
    tokens: list[int]
    logits: torch.Tensor | None
    swa: LlamaSwa
    _ahead: _Ahead | None
    _ends: list[int]

    def _check_live(self) -> None: ...

    def _window_rows(self, layer: int, at: int) -> torch.Tensor: ...

    def _maybe_snapshot(self, end: int) -> None: ...

    def keep_mark(self) -> None: ...

    def reset(self) -> None: ...


def _layout(session: PayloadSession) -> SwaLayout:
    cfg, t = session.model.cfg, len(session.tokens)
    if not cfg.sliding_layers:
        return SwaLayout(FULL_POLICY, t, t, t)
    return layout_for_save(session.swa, t, session.chunk_size, len(cfg.sliding_layers), cfg.sliding_window)


def _rows(session: PayloadSession, layout: SwaLayout, layer: int) -> int:
    """Rows a payload of this layout holds for one layer."""
    cfg = session.model.cfg
    return min(layout.raw_at, cfg.sliding_window) if cfg.is_sliding(layer) else layout.tokens


def _header(session: PayloadSession, layout: SwaLayout) -> Dsv4Header:
    cfg, t = session.model.cfg, layout.tokens
    sliding = bool(cfg.sliding_layers)
    return Dsv4Header(
        magic=DSV4_MAGIC,
        payload_version=layout.version | KV_HEAD_MAJOR | (KV_F16 if session.kv_dtype == "f16" else 0),
        saved_ctx=session.ctx_size,
        prefill_chunk=session.chunk_size,
        raw_capacity=session.ctx_size,
        raw_window=cfg.sliding_window if sliding else session.ctx_size,
        compressed_capacity=0,
        token_count=t,
        layer_count=cfg.num_layers,
        head_dim=cfg.kv_row_floats,
        indexer_head_dim=0,
        vocab_size=cfg.vocab_size,
        # the rows of a sliding layer (every global layer holds token_count)
        live_raw_rows=min(layout.raw_at, cfg.sliding_window) if sliding else t,
    )


def payload_bytes(session: PayloadSession) -> int:
    cfg = session.model.cfg
    layout = _layout(session)
    rows = sum(_rows(session, layout, i) for i in range(cfg.num_layers))
    return (framing_bytes(layout.tokens, cfg.vocab_size, cfg.num_layers) + layout.marker_bytes
            + KV_DTYPES[session.kv_dtype].itemsize * rows * cfg.kv_row_floats)


def save(session: PayloadSession, fp: BinaryIO) -> None:
    session._check_live()
    cfg = session.model.cfg
    layout = _layout(session)
    # A session stopped between prefill chunks has no next-token logits; it is saved with
    # zero logits (no real model emits an all-zero row), which load turns back into None.
    logits = session.logits if session.logits is not None else torch.zeros(cfg.vocab_size)
    zeros = [0] * cfg.num_layers
    write_framing(fp, _header(session, layout), session.model.info.fingerprint, session.tokens, logits, zeros, zeros)
    write_marker(fp, layout)
    # Head-major rows, written from the buffers as they lie: per (K or V, head) one
    # contiguous run of rows, or two for a ring that has wrapped.
    for layer in range(cfg.num_layers):
        for part, rows in _row_runs(session, layer, layout):
            write_array(fp, rows, part)


def _row_runs(session: PayloadSession, layer: int, layout: SwaLayout) -> Iterator[tuple[str, np.ndarray]]:
    """(what, array) of one layer's payload rows in head-major file order: views of the KV
    buffer (a periodic save of a sliding layer: of the snapshot)."""
    cfg = session.model.cfg
    if not cfg.is_sliding(layer):
        buf = _kv_array(session, layer)
        for kv in range(2):
            for head in range(cfg.num_kv_heads):
                yield f"layer {layer} {'KV'[kv]} rows of head {head}", buf[kv, head, :layout.tokens]
        return
    at = layout.raw_at
    if at == 0:
        return
    if at != layout.tokens:  # periodic: the window as of raw_at, kept as [2, Hkv, m, D]
        assert session.swa.snapshot is not None and session.swa.snapshot_at == at
        yield f"layer {layer} window rows", session.swa.snapshot[cfg.sliding_layers.index(layer)].numpy()
        return
    for kv, head, rows in _ring_runs(session, layer, at):
        yield f"layer {layer} {'KV'[kv]} window rows of head {head}", rows


def _kv_array(session: PayloadSession, layer: int) -> np.ndarray:
    """Layer `layer`'s buffer [2, Hkv, rows, D] as a numpy view (its slices are what the
    payload reads into and writes from)."""
    return session.kv[layer].numpy()


def _ring_runs(session: PayloadSession, layer: int, at: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """(kv, head, view) of a sliding layer's live window after `at` tokens, oldest first:
    per head the ring's slots (at - m) % R .. R-1, then 0 .. (wrapped)."""
    ring = _kv_array(session, layer)
    r = ring.shape[2]
    m = min(at, session.model.cfg.sliding_window, r)
    start = (at - m) % r
    first = min(m, r - start)
    for kv in range(2):
        for head in range(session.model.cfg.num_kv_heads):
            yield kv, head, ring[kv, head, start:start + first]
            if m > first:
                yield kv, head, ring[kv, head, :m - first]


def load(session: PayloadSession, fp: BinaryIO, nbytes: int, ahead: list[int]) -> None:
    """Long because every check of the header comes before a byte of rows is read, in the file's order, and
    nothing is kept until the end."""
    session._check_live()
    cfg = session.model.cfg
    session.reset()
    r = PayloadReader(fp, nbytes)
    h = r.read_header()
    check_fingerprint(r.read_bytes(FINGERPRINT_BYTES, "the fingerprint"), session.model.info.fingerprint, session.model.info.name)
    payload_version = h.payload_version
    file_dtype, version = kv_dtype_of_version(payload_version)
    if file_dtype != session.kv_dtype:
        raise PayloadError(f"payload holds {file_dtype} K/V rows, this session's kv_dtype is {session.kv_dtype}")
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
    if t > session.ctx_size:
        raise PayloadError(f"payload holds {t} tokens, this session's context is {session.ctx_size}")
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
    chunk = _first_chunk(session, t, ahead) if head_major else []
    ahead_logits = None
    if chunk:
        want = len(chunk) == len(ahead)
        ahead_logits = read_while_forward(
            lambda gate: _read_rows(session, r, layout, gate),
            lambda before_layer: _forward_ahead(session, chunk, t, want, before_layer))
    elif head_major:
        _read_rows(session, r, layout, None)
    else:
        _read_token_major(session, r, layout)
        r.finish()
    # Every byte read and the checksum verified: the state (and the chunk run ahead) is kept.
    session.tokens = tokens
    # numpy on this thread: torch's any() wakes its OpenMP threads, which on a busy
    # 2-core host stalled a restore for milliseconds
    session.logits = None if not logits.numpy().any() else logits
    if cfg.sliding_layers:
        _finish_load(session, layout)  # the rings first: a mark copies them
    session._ends = [t] if t else []
    session.keep_mark()
    if chunk:
        session._ahead = _Ahead(t, chunk, ahead_logits)


def _read_rows(session: PayloadSession, r: PayloadReader, layout: SwaLayout, gate: LayerGate | None) -> None:
    """The head-major rows straight into the buffers: each run's bytes are read (and hashed,
    by a verifying stream) into the slice where attention reads them, then checked while
    in cache; then the end of the payload. With a gate (a forward runs alongside): each
    finished layer is announced, and a stop asked for by the forward is obeyed."""
    for layer in range(session.model.cfg.num_layers):
        for part, rows in _row_runs_for_load(session, layer, layout):
            if gate is not None and gate.stopped:
                return
            r.read_into_array(rows, part)
            check_finite_array(rows, part)
        if gate is not None:
            gate.filled(layer + 1)
    r.finish()


def _first_chunk(session: PayloadSession, t: int, ahead: list[int]) -> list[int]:
    """The chunk of `ahead` a restore of `t` tokens runs alongside its reads: the first one
    a prefill of `ahead` after t would run (it ends on a multiple of the chunk size);
    empty where it is not done. Only full attention (see the module docstring). At least
    two tokens: one runs as the fused C step, all layers in one call, no layer to wait
    for (and it is a millisecond's work). At most a chunk's worth of tokens in all: a
    longer message is a long prefill, where the read is a small share and the first
    progress event and cancel point stay where they were. The whole of `ahead` must fit
    the context (else the turn refuses it) and be in the vocab (else the prefill says why)."""
    cfg = session.model.cfg
    if cfg.sliding_layers or t == 0 or t + len(ahead) > session.ctx_size or len(ahead) > session.chunk_size:
        return []
    if any(not 0 <= x < cfg.vocab_size for x in ahead):
        return []
    boundary = (t // session.chunk_size + 1) * session.chunk_size
    chunk = ahead[:boundary - t]
    return chunk if len(chunk) >= 2 else []


def _forward_ahead(session: PayloadSession, chunk: list[int], t: int, want_logits: bool,
                   before_layer: Callable[[int], None]) -> torch.Tensor | None:
    """The chunk's forward at t as a prefill would run it (same call, same inputs), each
    layer once its restored rows are in."""
    with torch.inference_mode():
        return session.model.forward(session.kv, chunk, t, want_logits, False, before_layer=before_layer)


def _row_runs_for_load(session: PayloadSession, layer: int, layout: SwaLayout) -> Iterator[tuple[str, np.ndarray]]:
    """Where a head-major payload's rows of one layer go: the buffer's slices, a sliding
    layer's into the ring slots of the window as of raw_at (never a snapshot)."""
    if session.model.cfg.is_sliding(layer):
        for kv, head, rows in _ring_runs(session, layer, layout.raw_at):
            yield f"layer {layer} {'KV'[kv]} window rows of head {head}", rows
        return
    yield from _row_runs(session, layer, layout)


# Files written before the head-major order (no KV_HEAD_MAJOR bit): the rows are token-major,
# [T, 2, Hkv, D] per layer, so they go through a staging buffer and a reordering copy.


def _read_token_major(session: PayloadSession, r: PayloadReader, layout: SwaLayout) -> None:
    cfg, t = session.model.cfg, layout.tokens
    stage = None
    for layer in range(cfg.num_layers):
        if cfg.is_sliding(layer):
            _read_ring_token_major(session, r, layer, layout.raw_at)
            continue
        if stage is None:  # size bounded by ctx_size, checked by the caller
            stage = torch.empty((t, 2, cfg.num_kv_heads, cfg.head_dim), dtype=KV_DTYPES[session.kv_dtype])
        r.read_into(stage, f"layer {layer} KV rows")
        check_finite(stage, f"layer {layer} KV rows")  # while the layer is still in cache
        # [T, 2, Hkv, D] -> [2, Hkv, T, D] in numpy, on this thread (see the module docstring)
        np.copyto(session.kv[layer][:, :, :t].numpy(), stage.numpy().transpose(1, 2, 0, 3))


def _read_ring_token_major(session: PayloadSession, r: PayloadReader, layer: int, at: int) -> None:
    """Rows of the window live after `at` tokens, oldest first, into their ring slots."""
    ring = session.kv[layer]
    m = min(at, session.model.cfg.sliding_window)
    rows = r.read_f32((m, 2, session.model.cfg.num_kv_heads, session.model.cfg.head_dim), f"layer {layer} window rows",
                      KV_DTYPES[session.kv_dtype])
    check_finite(rows, f"layer {layer} window rows")
    if m:
        slots = torch.arange(at - m, at) % ring.shape[2]
        ring.index_copy_(2, slots, rows.permute(1, 2, 0, 3))


def _finish_load(session: PayloadSession, layout: SwaLayout) -> None:
    """Keep a periodic file's window as this session's snapshot, then rebuild the sliding
    windows by re-running the tokens the file did not store them for."""
    t = layout.tokens
    if layout.policy.kind == PERIODIC and session.swa.policy.kind == PERIODIC and 0 < layout.raw_at < t:
        session.swa.snapshot = [session._window_rows(i, layout.raw_at) for i in session.model.cfg.sliding_layers]
        session.swa.snapshot_at = layout.raw_at
    info = RestoreInfo(str(layout.policy), t, 0, 0.0, None)
    if layout.replay_from < t:
        info = replay_tail(session, session.swa, layout)
    session.swa.last_restore = info
    session._maybe_snapshot(t)
