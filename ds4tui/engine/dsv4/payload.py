"""The DSV4 session payload of a DeepSeek V4 session: ds4's layout, generalized by the config.

Owns the per-layer sections and the checks on load (the framing, the header,
fingerprint, tokens, logits and the per-layer counts, is payload.py's). After
the framing, for each layer in order (all float32, little-endian):

1. raw rows: live_raw_rows x head_dim, in LOGICAL order (oldest position first);
2. ratio != 0: compressed rows n_comp x head_dim, then the frontier state_kv and
   state_score, each (coff*R) x (coff*head_dim), empty score slots as -1e30;
3. ratio == 4: indexer rows n_index x index_head_dim, then the indexer's
   state_kv and state_score, each (2*4) x (2*index_head_dim).

The ratio and coff of each layer come from the model config, which the
fingerprint pins. A load checks everything derivable from the header before
touching the session (version, fingerprint, dims, window, chunk size, counts =
floor(T/R), the exact total size): such a rejection leaves the session as it
was. Then it fills the static buffers; a failure there (a short file, a
non-finite value, a non-canonical frontier) leaves the session empty. Sections
are written and read by one function each, so a storage policy (e.g. dropping
or recomputing the raw window) can replace one section without touching the
others. docs/payload.md is the full table.

SWA storage policies (swa.py, docs/swa_policies.md): `payload_version`
tags the layout. 1 is full (the above); periodic and zero payloads store the
raw window as of an earlier position (or none), put a 16-byte marker block
after the per-layer counts, and a load re-runs the missing tokens.

ds4's own layout (payload ABI 2, `ds4_layout`): a model loaded from ds4's GGUF with V4
Flash's shape writes and reads exactly what ds4's CPU session does, so a session moves
between ds4 and ds4tui on the same file: no fingerprint, the full layout only, ds4's
header values (its prefill chunk min(ctx, 2048), raw capacity min(W, ctx), compressed
capacity ctx/4 + 2). On load, ds4's fields that describe its own buffers (chunk, capacities)
are not checked, and frontier slots not yet written in the current window are cleared:
ds4 leaves the previous window's values there after a decode step (they are overwritten
before anything reads them), where ds4tui's canonical form has (0, -1e30).
"""

from __future__ import annotations

from typing import BinaryIO, Callable

import torch

from ds4tui.engine.dsv4.cache import EMPTY_SCORE, CompressorState, LayerCache
from ds4tui.format.payload import DS4_PAYLOAD_ABI, DSV4_MAGIC, FINGERPRINT_BYTES, Dsv4Header, framing_bytes
from ds4tui.engine.payload import (
    PayloadReader,
    check_field,
    check_finite,
    check_fingerprint,
    write_framing,
    write_tensor,
)
from ds4tui.engine.dsv4.swa import FULL_POLICY, finish_load, layout_for_save, layout_from_header, raw_rows_for_save
from ds4tui.engine.swa_layout import SwaLayout, read_marker, write_marker
from ds4tui.engine.dsv4.state import Dsv4State
from ds4tui.engine.errors import PayloadError


DSV4_PAYLOAD_VERSION = 1  # ds4's DSV4 payload version; ours adds the fingerprint (payload ABI 128)
DS4_PREFILL_CAP = 2048  # ds4's CPU session: prefill chunk min(ctx, 2048) (ds4_default_prefill_cap_for_prompt)


def ds4_layout(s: Dsv4State) -> bool:
    """True when the session's payloads are ds4's own (ABI 2): no fingerprint, full layout."""
    return s.info.payload_abi == DS4_PAYLOAD_ABI


def ds4_header_for(s: Dsv4State) -> Dsv4Header:
    """The header ds4's CPU session writes for this state (ds4.c, ds4_session_save_payload)."""
    cfg, t, ctx = s.cfg, len(s.tokens), s.ctx_size
    raw_cap = max(1, min(cfg.sliding_window, ctx))
    ratios = [lc.ratio for lc in s.layers if lc.ratio == 4] + [lc.ratio for lc in s.layers if lc.ratio]
    return Dsv4Header(
        magic=DSV4_MAGIC, payload_version=DSV4_PAYLOAD_VERSION, saved_ctx=ctx,
        prefill_chunk=max(1, min(DS4_PREFILL_CAP, ctx)), raw_capacity=raw_cap, raw_window=raw_cap,
        compressed_capacity=ctx // ratios[0] + 2 if ratios else ctx, token_count=t,
        layer_count=cfg.num_hidden_layers, head_dim=cfg.head_dim, indexer_head_dim=cfg.index_head_dim,
        vocab_size=cfg.vocab_size, live_raw_rows=min(t, raw_cap),
    )


def header_for(s: Dsv4State, layout: SwaLayout | None = None) -> Dsv4Header:
    if ds4_layout(s):
        return ds4_header_for(s)
    cfg, t = s.cfg, len(s.tokens)
    raw_at = t if layout is None else layout.raw_at
    caps = [lc.attn.capacity for lc in s.layers if lc.attn is not None and lc.ratio == 4]
    caps += [lc.attn.capacity for lc in s.layers if lc.attn is not None]
    return Dsv4Header(
        magic=DSV4_MAGIC,
        payload_version=DSV4_PAYLOAD_VERSION if layout is None else layout.version,
        saved_ctx=s.ctx_size,
        prefill_chunk=s.chunk_size,
        raw_capacity=s.layers[0].raw_cap,
        raw_window=cfg.sliding_window,
        compressed_capacity=caps[0] if caps else 0,
        token_count=t,
        layer_count=cfg.num_hidden_layers,
        head_dim=cfg.head_dim,
        indexer_head_dim=cfg.index_head_dim,
        vocab_size=cfg.vocab_size,
        live_raw_rows=min(raw_at, cfg.sliding_window),
    )


def layer_bytes(lc: LayerCache, t: int, window: int, head_dim: int, raw_at: int | None = None) -> int:
    """Bytes of one layer's sections after t tokens (uses the expected counts t // R), the raw
    window being the one live after raw_at tokens (default t; see swa.py)."""
    n = min(t if raw_at is None else raw_at, window) * head_dim * 4
    for st in (lc.attn, lc.index):
        if st is not None:
            n += (t // st.ratio) * st.dim * 4 + st.state_bytes()
    return n


def save_layout(s: Dsv4State) -> SwaLayout:
    """The layout a save writes: the SWA policy's, or always full in ds4's layout."""
    if ds4_layout(s):
        t = len(s.tokens)
        return SwaLayout(FULL_POLICY, t, t, t)
    return layout_for_save(s)


def payload_size(s: Dsv4State) -> int:
    cfg, t = s.cfg, len(s.tokens)
    layout = save_layout(s)
    body = sum(layer_bytes(lc, t, cfg.sliding_window, cfg.head_dim, layout.raw_at) for lc in s.layers)
    framing = framing_bytes(t, cfg.vocab_size, cfg.num_hidden_layers, fingerprint=not ds4_layout(s))
    return framing + layout.marker_bytes + body


# -- writing, section by section ---------------------------------------------------------------


def write_raw_section(fp: BinaryIO, s: Dsv4State, layout: SwaLayout, li: int) -> None:
    write_tensor(fp, raw_rows_for_save(s, layout, li))  # full: the live window; see swa.py


def write_compressor_section(fp: BinaryIO, st: CompressorState) -> None:
    write_tensor(fp, st.rows[: st.n_rows])
    write_tensor(fp, st.state_kv)
    write_tensor(fp, st.state_score)


def write_payload(s: Dsv4State, fp: BinaryIO) -> None:
    cfg = s.cfg
    logits = s.next_logits()
    if logits is None:
        logits = torch.zeros(cfg.vocab_size, dtype=torch.float32)  # an empty session
    comp = [lc.attn.n_rows if lc.attn is not None else 0 for lc in s.layers]
    index = [lc.index.n_rows if lc.index is not None else 0 for lc in s.layers]
    layout = save_layout(s)
    fingerprint = None if ds4_layout(s) else s.info.fingerprint
    write_framing(fp, header_for(s, layout), fingerprint, s.tokens, logits, comp, index)
    write_marker(fp, layout)
    for li, lc in enumerate(s.layers):
        write_raw_section(fp, s, layout, li)
        for st in (lc.attn, lc.index):
            if st is not None:
                write_compressor_section(fp, st)


# -- reading -----------------------------------------------------------------------------------


def read_payload(s: Dsv4State, fp: BinaryIO, nbytes: int, begin: Callable[[], None]) -> None:
    """Restore s from exactly nbytes of fp; raises PayloadError. `begin()` is called (and must
    empty the session) once everything but the sections themselves has been checked. A
    periodic or zero payload then re-runs the tokens whose raw rows it does not hold."""
    cfg = s.cfg
    r = PayloadReader(fp, nbytes)
    h = r.read_header()
    ds4 = ds4_layout(s)
    checks = [
        ("layer_count", cfg.num_hidden_layers),
        ("head_dim", cfg.head_dim),
        ("indexer_head_dim", cfg.index_head_dim),
        ("vocab_size", cfg.vocab_size),
    ]
    if ds4:
        # ds4's own file: no fingerprint, always the full layout; its chunk and capacities
        # describe ds4's buffers, not the state (ds4 writes its raw capacity as the window)
        check_field(h, "payload_version", DSV4_PAYLOAD_VERSION)
        layout = SwaLayout(FULL_POLICY, h.token_count, h.token_count, h.token_count)
        checks.append(("raw_window", min(cfg.sliding_window, h.saved_ctx)))
    else:
        layout = layout_from_header(h)  # the payload_version check: full (1), periodic or zero
        check_fingerprint(r.read_bytes(FINGERPRINT_BYTES, "the fingerprint"), s.info.fingerprint, s.info.name)
        checks += [("raw_window", cfg.sliding_window), ("prefill_chunk", s.chunk_size)]
    for name, want in checks:
        check_field(h, name, want)
    t = h.token_count
    if t > s.ctx_size:
        raise PayloadError(f"payload holds {t} tokens, this session's context is {s.ctx_size}")
    check_field(h, "live_raw_rows", min(layout.raw_at, cfg.sliding_window))
    tokens = r.read_tokens(t, cfg.vocab_size)
    logits = r.read_f32((cfg.vocab_size,), "the logits")
    check_finite(logits, "logits")
    comp = r.read_u32(cfg.num_hidden_layers, "the compressed row counts")
    index = r.read_u32(cfg.num_hidden_layers, "the indexer row counts")
    for li, lc in enumerate(s.layers):
        want_c = t // lc.ratio if lc.ratio else 0
        want_i = t // lc.ratio if lc.index is not None else 0
        if comp[li] != want_c or index[li] != want_i:
            raise PayloadError(
                f"layer {li} (ratio {lc.ratio}) has {comp[li]} compressed / {index[li]} indexer rows, "
                f"{t} tokens make {want_c} / {want_i}"
            )
    read_marker(r, layout)
    body = sum(layer_bytes(lc, t, cfg.sliding_window, cfg.head_dim, layout.raw_at) for lc in s.layers)
    if body > r.remaining:
        raise PayloadError(f"payload truncated: the layer sections need {body} bytes, {r.remaining} left")
    if body < r.remaining:
        raise PayloadError(f"payload has {r.remaining - body} trailing bytes after the last section")
    begin()
    for li, lc in enumerate(s.layers):
        read_raw_section(r, lc, layout.raw_at, cfg.sliding_window, li)
        for kind, st in (("compressor", lc.attn), ("indexer", lc.index)):
            if st is not None:
                read_compressor_section(r, st, t // st.ratio, t, f"layer {li} {kind}", clear_unwritten=ds4)
    r.finish()
    s.tokens = tokens
    s.logits = logits if t else None
    finish_load(s, layout)  # periodic / zero: re-run the tokens whose raw rows were not stored


def read_raw_section(r: PayloadReader, lc: LayerCache, t: int, window: int, li: int) -> None:
    positions = lc.raw_positions(t, window)
    rows = r.read_f32((len(positions), lc.raw.shape[1]), f"layer {li} raw rows")
    check_finite(rows, f"layer {li} raw rows")
    lc.raw[lc.raw_slots(positions)] = rows


def read_compressor_section(r: PayloadReader, st: CompressorState, n: int, t: int, what: str,
                            clear_unwritten: bool = False) -> None:
    """clear_unwritten: set the slots not yet written at t tokens to (0, empty) instead of
    refusing data there (ds4's files keep the previous window's values in them)."""
    if n > st.capacity:
        raise PayloadError(f"{what}: {n} rows exceed this session's capacity {st.capacity}")
    r.read_into(st.rows[:n], f"{what} rows")
    st.n_rows = n
    r.read_into(st.state_kv, f"{what} frontier kv")
    r.read_into(st.state_score, f"{what} frontier scores")
    for tensor, part in ((st.rows[:n], "rows"), (st.state_kv, "frontier kv"), (st.state_score, "frontier scores")):
        check_finite(tensor, f"{what} {part}")
    # Canonical form: the unwritten slots of the current window are exactly (0, empty).
    free = st.current_offset + t % st.ratio
    if clear_unwritten:
        st.state_kv[free:] = 0.0
        st.state_score[free:] = EMPTY_SCORE
    elif bool(st.state_kv[free:].any()) or bool((st.state_score[free:] != EMPTY_SCORE).any()):
        raise PayloadError(f"{what} frontier has data in slots not yet written at {t} tokens")
