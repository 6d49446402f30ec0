"""KV buffers on transparent huge pages (engine/huge_pages.py): the values and contract of
torch.zeros, 2 MiB pages where the kernel allows them, the mapping gone with the tensor."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch

from ds4tui.engine.huge_pages import HUGE_PAGE, zeros_on_huge_pages
from ds4tui.engine.llama.config import FULL, SLIDING, LlamaConfig
from ds4tui.engine.llama.session import new_kv

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _mapping_of(address: int) -> dict[str, int] | None:
    """The /proc/self/smaps fields (kB) of the mapping holding `address`; None when unmapped."""
    with open("/proc/self/smaps") as fp:
        text = fp.read()
    fields: dict[str, int] | None = None
    for line in text.splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            fields = {} if lo <= address < hi else None
        elif fields is not None and line.split()[-1] == "kB":
            fields[head.rstrip(":")] = int(line.split()[1])
            if head == "VmFlags:":
                break
        if fields is not None and head == "VmFlags:":
            return fields
    return fields


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_huge_page_buffer_is_a_zeroed_writable_tensor(dtype):
    t = zeros_on_huge_pages((3, 2, 1000, 512), dtype)
    assert t.shape == (3, 2, 1000, 512) and t.dtype == dtype and t.is_contiguous()
    assert not t.any()
    t[1, 1, 999, 511] = 2.5
    u = zeros_on_huge_pages((3, 2, 1000, 512), dtype)  # a buffer of its own
    assert float(t.sum()) == 2.5 and not u.any()
    small = zeros_on_huge_pages((4, 8), dtype)  # under one huge page: an ordinary tensor
    assert small.shape == (4, 8) and not small.any()


@pytest.mark.skipif(not sys.platform.startswith("linux") or not THP.exists()
                    or "[never]" in THP.read_text(), reason="this kernel gives no transparent huge pages")
def test_the_buffer_sits_on_huge_pages_and_is_unmapped_when_freed():
    t = zeros_on_huge_pages((8 * HUGE_PAGE // 2,), torch.float16)
    address = t.data_ptr()
    assert address % HUGE_PAGE == 0
    t.fill_(1.0)  # first touch: the kernel picks the page size now
    mapping = _mapping_of(address)
    assert mapping is not None and mapping.get("AnonHugePages", 0) >= 2 * HUGE_PAGE // 1024
    del t
    gc.collect()
    assert _mapping_of(address) is None


def test_session_buffers_are_zeroed_for_both_layouts():
    base = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=8192,
                tie_word_embeddings=True)
    kv = new_kv(LlamaConfig(**base), ctx=8192)  # one [layers, 2, Hkv, ctx, D] buffer, 2 MiB
    assert kv.shape == (2, 2, 2, 8192, 16) and kv.dtype == torch.float16 and kv.is_contiguous() and not kv.any()
    sliding = LlamaConfig(**base, sliding_window=128, layer_types=(SLIDING, FULL))
    ring, whole = new_kv(sliding, ctx=8192, kv_dtype="f32")
    assert ring.shape == (2, 2, 128, 16) and whole.shape == (2, 2, 8192, 16)
    assert ring.dtype == whole.dtype == torch.float32 and not ring.any() and not whole.any()
