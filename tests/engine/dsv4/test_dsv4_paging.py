"""Routed experts under a memory budget (paging.ExpertPager) and `bench engine`'s DSV4 section,
on a slice in ds4's layout at width 256: paging never changes a number, keeps the mapped
experts within the budget, and the bytes a token reads add up to the file's tensors."""

from __future__ import annotations

import pytest
import torch

from ds4tui.bench.dsv4_layers import format_rows, measure_dsv4_layers
from ds4tui.engine.dsv4 import residency
from ds4tui.engine.dsv4 import slice as S
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.dsv4.gguf import load_dsv4_gguf
from ds4tui.engine.dsv4.paging import ExpertPager
from ds4tui.engine.dsv4.tiny import CONFIG

pytestmark = pytest.mark.skipif(not residency.available(), reason="reads /proc/self/pagemap (Linux)")
WIDE = dict(CONFIG, hidden_size=256, moe_intermediate_size=256, vocab_size=2048, n_routed_experts=32)
PROMPT = [3 + (7 * i) % 1500 for i in range(12)]


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    path = tmp_path_factory.mktemp("paging") / "slice.gguf"
    S.write_slice(path, Dsv4Config.from_hf(WIDE), vocab_size=WIDE["vocab_size"])
    return path


def _decode(model, n: int) -> list[torch.Tensor]:
    s = model.new_session(64)
    s.prefill(PROMPT)
    out = []
    for _ in range(n):
        s.decode(int(s.logits.argmax()))
        out.append(s.logits.clone())
    return out


def test_paging_keeps_the_experts_within_the_budget_and_changes_no_number(sliced):
    model = load_dsv4_gguf(sliced, "slice")
    plain = _decode(model, 6)
    unit = sum(getattr(model.net.w.layers[0].moe, w).expert_bytes for w in ("w1", "w3", "w2"))
    budget = 3 * model.cfg.num_experts_per_tok * unit  # three layers' worth of one token's experts
    with pytest.raises(ValueError, match="less than one token"):
        ExpertPager(model, unit)
    pager = ExpertPager(model, budget)
    residency.forget_pages(model)
    model.net.observers.append(pager)
    try:
        paged = _decode(model, 6)
        mapped = sum(p.mapped for p in residency.expert_pages(model).values()) * residency.PAGE
    finally:
        model.net.observers.remove(pager)
        pager.close()
    assert all(torch.equal(a, b) for a, b in zip(plain, paged))
    assert pager.evicted > 0 and pager.prefetched > 0 and pager.resident_bytes <= budget
    # what stays mapped: the units held, plus pages a neighbour's read-ahead or an unaligned
    # expert boundary left (at most 2 pages per matrix edge of the units dropped or held)
    slack = 6 * residency.PAGE * (pager.evicted + len(pager.lru))
    assert mapped <= budget + slack


def test_bench_section_counts_what_a_token_reads(sliced):
    import gguf

    model = load_dsv4_gguf(sliced, "slice")
    b = measure_dsv4_layers(model, PROMPT, 3)
    n = model.cfg.num_hidden_layers
    assert len(b.prefill_ms) == len(b.decode_ms) == len(b.decode_cpu_ms) == len(b.dense_bytes) == n
    assert b.decode_tokens == 3 and all(t > 0 for t in b.decode_ms + b.decode_cpu_ms)
    assert b.experts_per_token == [float(model.cfg.num_experts_per_tok)] * n  # distinct experts per token
    reader = gguf.GGUFReader(str(sliced))
    for li in range(n):  # dense bytes: the layer's tensors in the file, the three expert tensors left out
        in_file = sum(int(t.n_bytes) for t in reader.tensors
                      if t.name.startswith(f"blk.{li}.") and "_exps." not in t.name
                      and not t.name.endswith(("tid2eid.weight", "exp_probs_b.bias")))
        extra = b.dense_bytes[li] - in_file  # the router bias (f32 in both), one tid2eid row (int64 in memory)
        assert 0 <= extra < 64 * 1024, li
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    unit = sum(sizes[f"blk.0.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")) // model.cfg.n_routed_experts
    assert b.expert_unit_bytes == unit
    assert b.bytes_per_token == sum(b.dense_bytes) + unit * sum(b.experts_per_token) + b.head_bytes
    assert b.head_bytes > sizes["output.weight"] and b.rss_bytes > 0
    rows = dict(format_rows(b))
    assert "layer 0" in rows and "GB per decode token" in rows["reads"] and "RSS" in rows["memory"]


def test_the_budget_comes_from_the_environment(sliced, monkeypatch):
    from ds4tui.engine.dsv4.paging import BUDGET_ENV, budget_from_env
    from ds4tui.engine.errors import WeightsError

    assert budget_from_env({}) is None and budget_from_env({BUDGET_ENV: " "}) is None
    assert budget_from_env({BUDGET_ENV: "12"}) == 12_000_000_000
    assert budget_from_env({BUDGET_ENV: "0.5"}) == 500_000_000
    for bad in ("abc", "0", "-3", "nan", "inf"):
        with pytest.raises(ValueError, match=BUDGET_ENV):
            budget_from_env({BUDGET_ENV: bad})
    monkeypatch.setenv(BUDGET_ENV, "0.01")  # 10 MB: many tokens' experts at this width
    model = load_dsv4_gguf(sliced, "slice")
    pagers = [o for o in model.net.observers if isinstance(o, ExpertPager)]
    assert len(pagers) == 1 and pagers[0].budget == 10_000_000
    _decode(model, 2)
    assert 0 < pagers[0].resident_bytes <= pagers[0].budget
    monkeypatch.setenv(BUDGET_ENV, "lots")
    with pytest.raises(WeightsError, match="DS4TUI_EXPERT_BUDGET='lots'"):
        load_dsv4_gguf(sliced, "slice")
