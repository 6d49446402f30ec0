"""Fixtures of the llama-family tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models and batch-1 steps run many small ops: with a second OpenMP thread on a shared
    2-core machine each op waits for it (docs/perf-archive.md, "Gemma 3 270M Q4_K_M")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
