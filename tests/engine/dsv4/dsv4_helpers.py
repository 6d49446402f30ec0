"""Shared helpers for the DSV4 engine tests: the tiny model (float32 and float64), tokens, payload bytes.

Models are loaded once per test process (lru_cache; load_model memoizes too).
Torch runs single-threaded inside these tests (`single_thread` fixture): the
tensors are tiny, and on a busy 2-core machine OpenMP thread hand-offs cost
milliseconds per op.
"""

from __future__ import annotations

import functools
import io

import pytest
import torch

from ds4tui.engine.dsv4.model import Dsv4Model, load_dsv4
from ds4tui.engine.dsv4.tiny import ensure_tiny_dsv4


@functools.lru_cache(maxsize=None)
def tiny(dtype: torch.dtype = torch.float32, **overrides) -> Dsv4Model:
    return load_dsv4(ensure_tiny_dsv4(), "tiny-dsv4", dtype=dtype, **overrides)


def tokens(n: int, seed: int = 1) -> list[int]:
    """n random ids above the special tokens (ids 0..7)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(8, 512, (n,), generator=g).tolist()


def save(session) -> bytes:
    buf = io.BytesIO()
    session.save_payload(buf)
    data = buf.getvalue()
    assert len(data) == session.payload_bytes()
    return data


def load(session, data: bytes) -> None:
    session.load_payload(io.BytesIO(data), len(data))


def expected_size(cfg, t: int) -> int:
    """The size formula of docs/payload.md, written independently of the writer."""
    d, idim, w = cfg.head_dim, cfg.index_head_dim, cfg.sliding_window
    n = 52 + 32 + 4 * t + 4 * cfg.vocab_size + 8 * cfg.num_hidden_layers
    for r in cfg.compress_ratios:
        n += min(t, w) * d * 4
        if r:
            coff = 2 if r == 4 else 1
            n += (t // r) * d * 4 + 2 * (coff * r) * (coff * d) * 4
        if r == 4:
            n += (t // 4) * idim * 4 + 2 * 8 * (2 * idim) * 4
    return n


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
