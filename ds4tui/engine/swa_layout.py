"""How one payload stores its sliding-window rows: the part of the SWA storage policies
that every family with sliding-window layers shares (DSV4 and the llama family's Gemma 3).

Owns `SwaLayout` (which window a payload stores, where a load's replay starts), reading
the policy from a payload header, the 16-byte marker block of periodic and zero
payloads, and the replay itself (`replay_tail`, reported as a `RestoreInfo`). What a
family stores per layer, and what it freezes during a replay, stays with the family
(ds4tui/engine/dsv4/swa.py, ds4tui/engine/llama/swa.py). The policy's text form and
header tag are ds4tui/format/swa_policy.py's; docs/swa_policies.md is the full story.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Sequence

from ds4tui.engine.errors import PayloadError
from ds4tui.engine.payload import PayloadReader
from ds4tui.engine.session import Session
from ds4tui.format.payload import Dsv4Header
from ds4tui.format.swa_policy import (
    CODES,
    FULL,
    MARKER_BYTES,
    MARKER_MAGIC,
    PERIODIC,
    SwaPolicy,
    payload_version,
    policy_of_version,
)

_MARKER = struct.Struct("<4sIII")  # magic, layout code, period K, position of the stored window


@dataclass(frozen=True)
class SwaLayout:
    """How one payload stores the sliding-window rows."""

    policy: SwaPolicy  # periodic: with the effective period (a multiple of the chunk)
    tokens: int  # T
    raw_at: int  # the stored rows are the window live after this many tokens: T, P or 0
    replay_from: int  # a load re-runs tokens replay_from..T-1 (T: none)

    @property
    def version(self) -> int:
        return payload_version(self.policy)

    @property
    def marker_bytes(self) -> int:
        return 0 if self.policy.kind == FULL else MARKER_BYTES

    @property
    def replayed(self) -> int:
        return self.tokens - self.replay_from


def header_policy(h: Dsv4Header) -> SwaPolicy:
    """The policy a payload header announces; PayloadError for unknown versions and for a
    period that is not a multiple of the payload's prefill chunk."""
    try:
        pol = policy_of_version(h.payload_version)
    except ValueError:
        raise PayloadError(
            f"payload_version is {h.payload_version:#x}: not a DSV4 layout this engine reads "
            f"(1 full, (K << 8) | 2 periodic, 3 zero)"
        ) from None
    if pol.kind == PERIODIC and (h.prefill_chunk == 0 or pol.period % h.prefill_chunk):
        raise PayloadError(f"periodic payload: period {pol.period} is not a multiple of the chunk {h.prefill_chunk}")
    return pol


def write_marker(fp: BinaryIO, layout: SwaLayout) -> None:
    if layout.marker_bytes:
        fp.write(_MARKER.pack(MARKER_MAGIC, CODES[layout.policy.kind], layout.policy.period, layout.raw_at))


def read_marker(r: PayloadReader, layout: SwaLayout) -> None:
    """Check the marker block against the header: a file is never read under another policy."""
    if not layout.marker_bytes:
        return
    magic, code, period, raw_at = _MARKER.unpack(r.read_bytes(MARKER_BYTES, "the SWA marker block"))
    want = (MARKER_MAGIC, CODES[layout.policy.kind], layout.policy.period, layout.raw_at)
    if (magic, code, period, raw_at) != want:
        raise PayloadError(
            f"SWA marker block {magic!r} code {code} period {period} window at {raw_at} disagrees with "
            f"the header ({layout.policy}, window at {layout.raw_at})"
        )


@dataclass(frozen=True)
class RestoreInfo:
    """What the last load did: for the bench, the UI and tests."""

    policy: str
    tokens: int
    replayed: int  # tokens re-run to rebuild the sliding windows
    replay_ms: float
    # max |replayed - stored| next-token logit: 0 when the replay is bit-exact (the file came
    # from a cold prefill); rounding-sized otherwise. None when nothing was replayed or the
    # file has no logits.
    logit_delta: float | None


def replay_tail(session: Session, swa: Any, layout: SwaLayout, frozen: Sequence[Any] = ()) -> RestoreInfo:
    """Re-run the tokens `layout` did not store windows for, after a load restored the rest.

    `swa.replaying` is set meanwhile (the family takes no periodic snapshots then), and each
    of `frozen` (state the file restored whole, e.g. DSV4's compressor frontiers) has its
    `frozen` flag set so the replay leaves it as loaded. Chunks end on absolute multiples of
    the chunk size, as in a cold prefill."""
    tokens, stored = list(session.tokens), session.logits
    start = layout.replay_from
    session.tokens, session.logits = tokens[:start], None
    for st in frozen:
        st.frozen = True
    swa.replaying = True
    t0 = time.perf_counter()
    try:
        session.prefill(tokens[start:])
    finally:
        for st in frozen:
            st.frozen = False
        swa.replaying = False
    ms = (time.perf_counter() - t0) * 1000.0
    delta = None
    if stored is not None and session.logits is not None:
        delta = float((session.logits - stored).abs().max())
    return RestoreInfo(str(layout.policy), len(tokens), len(tokens) - start, ms, delta)
