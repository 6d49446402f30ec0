"""SWA storage policies of DSV4 checkpoints: the setting, and its tag in the payload header.

Pure Python on purpose (no torch): the config file, the settings screen and
`ds4tui kv inspect` use it; the engine side (snapshots, layouts, the replay)
is ds4tui/engine/dsv4/swa.py. docs/swa_policies.md is the full story.

A DeepSeek V4 checkpoint holds compressed rows (CSA/HCA, compact and immutable
once their block is complete) and the raw sliding-window (SWA) rows of every
layer (exact local state). The policy says which raw rows a file keeps:

- `full`: the window as of the file's last token T; a load recomputes nothing.
- `periodic:K`: the window as of P = floor(T/K)*K (K is rounded up to a
  multiple of the prefill chunk, so P is a chunk boundary); a load re-runs
  tokens P..T-1.
- `zero`: no raw rows at all; a load re-runs the last L*(W-1)+1 tokens (L
  layers, window W), which is exactly the receptive field of the last window.

In every policy the file also holds everything else for the whole prefix:
tokens, compressed and indexer rows, compressor frontiers at T.

The tag: DSV4 header field 1 (`payload_version`, u32) is
    bits 0..5   layout code: 1 full, 2 periodic, 3 zero
    bit  6      KV_HEAD_MAJOR: the K/V rows of each layer are head-major (llama family only:
                for K then V, for each KV head, that head's rows in token order), the order of
                the session's buffers; without it they are token-major (ds4's raw-row order)
    bit  7      KV_F16: the K/V rows are f16 (llama-family sessions with kv_dtype f16)
    bits 8..31  the period K of a periodic file (tokens), else 0
so ds4's version 1 is a full, token-major f32 payload, and a reader that only knows
version 1 rejects the others (every llama file ds4tui writes now among them). Periodic and zero payloads also
carry a 16-byte marker block between the per-layer counts and the layer
sections: b"SWAP", u32 code, u32 K, u32 the position of the stored window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ds4tui.format.payload import MODEL_ID_LLAMA

FULL, PERIODIC, ZERO = "full", "periodic", "zero"
CODES = {FULL: 1, PERIODIC: 2, ZERO: 3}
KINDS = {code: kind for kind, code in CODES.items()}
KV_F16 = 0x80  # payload_version bit: K/V rows stored as f16 (llama family only)
KV_HEAD_MAJOR = 0x40  # payload_version bit: K/V rows head-major, as the session's buffers (llama only)
HEAD_MAJOR, TOKEN_MAJOR = "head-major", "token-major"
MAX_PERIOD = (1 << 24) - 1  # K lives in the 24 upper bits of payload_version
MARKER_MAGIC = b"SWAP"
MARKER_BYTES = 16
# Queries per attention score block in the DSV4 engine. Defined here, not in the engine,
# because a zero payload's replay start (zero_replay_start) sits on this grid: changing it
# changes which tokens a load of an existing file re-runs.
QUERY_BLOCK = 64


@dataclass(frozen=True)
class SwaPolicy:
    kind: str = FULL
    period: int = 0  # K, tokens (periodic only)

    def __post_init__(self) -> None:
        if self.kind not in CODES:
            raise ValueError(f"unknown SWA policy {self.kind!r} (full, periodic:K or zero)")
        if (self.kind == PERIODIC) != (self.period > 0):
            raise ValueError("a periodic policy needs a period K >= 1; the others take none")
        if self.period > MAX_PERIOD:
            raise ValueError(f"SWA period {self.period} exceeds {MAX_PERIOD}")

    def __str__(self) -> str:
        return f"{PERIODIC}:{self.period}" if self.kind == PERIODIC else self.kind

    def effective_period(self, chunk: int) -> int:
        """K rounded up to a multiple of the prefill chunk: periodic windows sit on chunk
        boundaries, so the replay after a load runs the same chunks as a cold prefill."""
        return -(-self.period // chunk) * chunk if self.kind == PERIODIC else 0


FULL_POLICY = SwaPolicy()


def parse_policy(text: str) -> SwaPolicy:
    """'full', 'zero' or 'periodic:K' (K tokens >= 1); ValueError with the accepted forms."""
    s = text.strip().lower()
    if s in (FULL, ZERO):
        return SwaPolicy(s)
    kind, sep, k = s.partition(":")
    if kind == PERIODIC and sep:
        try:
            period = int(k)
        except ValueError:
            period = 0
        if period >= 1:
            return SwaPolicy(PERIODIC, period)
    raise ValueError(f"{text!r} is not an SWA policy: use full, zero or periodic:K (K tokens >= 1)")


def check_policy_text(text: str) -> str | None:
    """config.py's checker: None when valid, else the problem."""
    try:
        parse_policy(text)
    except ValueError as exc:
        return str(exc)
    return None


def payload_version(policy: SwaPolicy) -> int:
    return (policy.period << 8) | CODES[policy.kind]


def policy_of_version(version: int) -> SwaPolicy:
    """The policy a payload_version stands for; ValueError for anything else (the KV_F16 and
    KV_HEAD_MAJOR bits included: a llama-family caller strips them first, see kv_dtype_of_version)."""
    kind = KINDS.get(version & 0xFF)
    if kind is None or (kind != PERIODIC and version >> 8):
        raise ValueError(f"payload_version {version:#x} is no known DSV4 payload layout")
    return SwaPolicy(kind, version >> 8)


def kv_dtype_of_version(version: int) -> tuple[str, int]:
    """("f16" or "f32", the layout version: without the KV_F16 and KV_HEAD_MAJOR bits)."""
    return ("f16" if version & KV_F16 else "f32"), version & ~(KV_F16 | KV_HEAD_MAJOR)


def row_order_of_version(version: int) -> str:
    """HEAD_MAJOR or TOKEN_MAJOR: the order of a llama-family payload's K/V rows."""
    return HEAD_MAJOR if version & KV_HEAD_MAJOR else TOKEN_MAJOR


def zero_replay_start(tokens: int, layers: int, window: int, chunk: int, block: int = QUERY_BLOCK) -> int:
    """First token a zero-policy load re-runs.

    The raw row of layer l at position t depends on tokens t - l*(W-1) .. t only
    (each layer looks W-1 tokens back; compressed rows are restored, not recomputed),
    so the last window of the top layer, positions T-W..T-1, needs the last
    L*(W-1)+1 tokens. The start is moved back onto the query-block grid of a cold
    prefill (chunk starts + multiples of `block`), so the replayed tokens go through
    the same attention blocks as a cold prefill's.
    """
    need = max(0, tokens - (layers * (window - 1) + 1))
    c0 = need // chunk * chunk
    return c0 + (need - c0) // block * block


def stored_window_at(policy: SwaPolicy, tokens: int, chunk: int) -> int:
    """The position whose raw window a file of this policy stores: T, P or 0 (none)."""
    if policy.kind == FULL:
        return tokens
    if policy.kind == PERIODIC:
        k = policy.effective_period(chunk)
        return tokens // k * k
    return 0


def payload_kv_dtype(header: Mapping[str, int], model_id: int | None = None) -> str:
    """The K/V row type a payload header announces: "f16" or "f32" (DSV4 files: always f32 here;
    their own cache_f16 option is a training-time rounding, not a storage type)."""
    if model_id != MODEL_ID_LLAMA:
        return "f32"
    return kv_dtype_of_version(int(header.get("payload_version", 1)))[0]


def payload_row_order(header: Mapping[str, int], model_id: int | None = None) -> str:
    """The order of a payload's K/V rows: "head-major" or "token-major" (DSV4 files: always
    token-major, ds4's raw rows)."""
    if model_id != MODEL_ID_LLAMA:
        return TOKEN_MAJOR
    return row_order_of_version(int(header.get("payload_version", 1)))


def describe_payload(header: Mapping[str, int], model_id: int | None = None) -> str:
    """One line for `kv inspect`, from the DSV4 header fields alone (52 bytes, no torch) and the
    KVC header's model id (a llama-family file's zero replay depends on how many of its layers
    slide, which the header does not say: the line gives the bound for all of them)."""
    try:
        version = int(header["payload_version"])
        if model_id == MODEL_ID_LLAMA:
            version = kv_dtype_of_version(version)[1]
        policy = policy_of_version(version)
    except (KeyError, ValueError) as exc:
        return f"unknown ({exc})"
    t, chunk = int(header.get("token_count", 0)), max(1, int(header.get("prefill_chunk", 1)))
    if policy.kind == FULL:
        return "full (raw window stored; nothing recomputed on load)"
    if policy.kind == PERIODIC:
        p = stored_window_at(policy, t, chunk)
        return f"{policy} (raw window as of token {p}; a load re-runs {t - p} tokens)"
    if model_id == MODEL_ID_LLAMA:
        start = zero_replay_start(t, int(header.get("layer_count", 0)), int(header.get("raw_window", 1)), chunk, chunk)
        return f"zero (no sliding-window rows; a load re-runs at most the last {t - start} tokens)"
    start = zero_replay_start(t, int(header.get("layer_count", 0)), int(header.get("raw_window", 1)), chunk)
    return f"zero (no raw window; a load re-runs the last {t - start} tokens)"
