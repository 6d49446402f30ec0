"""Policy knobs: store length, frontiers, headroom and the eviction score (ds4's numbers)."""

from __future__ import annotations

import pytest

from ds4tui.format.kvc import REASON_COLD, REASON_CONTINUED, REASON_EVICT, REASON_SHUTDOWN
from ds4tui.cache.policy import DEFAULT_POLICY, CachePolicy

P = DEFAULT_POLICY
HOUR = 3600


@pytest.mark.parametrize("tokens, stored", [
    (300, 0),        # below min_tokens: nothing worth storing
    (512, 512),      # exactly min, not above min+trim: kept whole
    (600, 600),      # trimmed 568 aligns to 0 < min: kept whole, like ds4
    (2080, 2048),    # 2080-32 = 2048, aligned
    (2079, 2079),    # 2047 aligns to 0: kept whole
    (5000, 4096),
    (30000, 28672),
])
def test_store_len_trims_32_and_aligns_to_2048(tokens, stored):
    assert P.store_len(tokens) == stored


def test_continued_frontiers_round_10000_up_to_10240():
    assert P.continued_step == 10240
    assert P.next_continued_frontier(0) == 10240
    assert P.next_continued_frontier(10240) == 20480
    assert P.next_continued_frontier(15000) == 20480
    assert P.continued_target(10240, 0) == 10240
    assert P.continued_target(10240, 10240) == 0
    assert P.continued_target(10241, 0) == 0
    assert CachePolicy(continued_interval_tokens=0).next_continued_frontier(5) == 0


def test_cold_saves_only_up_to_30000_tokens():
    assert P.cold_allowed(30000) and not P.cold_allowed(30001) and not P.cold_allowed(100)


def test_headroom_is_one_percent_rounded_up():
    assert P.required_bytes(100) == 101
    assert P.required_bytes(101) == 103
    assert P.required_bytes(0) == 0
    assert P.budget_bytes == 4096 * 1024 * 1024


def test_hits_decay_with_a_six_hour_half_life():
    now = 1_000_000
    assert P.effective_hits(8, now - 6 * HOUR, 0, now) == pytest.approx(4)
    assert P.effective_hits(8, now - 12 * HOUR, 0, now) == pytest.approx(2)
    assert P.effective_hits(8, 0, now - 6 * HOUR, now) == pytest.approx(4)  # never used: created_at
    assert P.effective_hits(1, now - 60 * HOUR, 0, now) == 0.0  # under 0.01 counts as none
    assert P.effective_hits(5, 0, 0, now) == 0.0


def _score(reason, superseded=False, hits=0, age=0, now=1_000_000):
    return P.score(hits=hits, tokens=1000, file_bytes=10_000, last_used=now - age, created_at=now - age,
                   reason_code=reason, superseded=superseded, now=now)


def test_score_density_anchor_weight_and_superseded_penalty():
    plain = _score(REASON_CONTINUED)
    assert plain.score == pytest.approx(0.1) and plain.anchor_weight == 1.0
    for anchor in (REASON_COLD, REASON_EVICT, REASON_SHUTDOWN):
        assert _score(anchor).score == pytest.approx(0.2)
    # Never hit: pressed to the 5% floor.
    assert _score(REASON_CONTINUED, superseded=True).superseded_factor == pytest.approx(0.05)
    # One effective hit: h = 1/2, factor 0.05 + 0.45/2.
    parts = _score(REASON_CONTINUED, superseded=True, hits=1)
    assert parts.superseded_factor == pytest.approx(0.275)
    assert parts.score == pytest.approx(2 * 0.1 * 0.275)
    # Many hits approach the 50% ceiling.
    assert _score(REASON_CONTINUED, superseded=True, hits=10_000).superseded_factor == pytest.approx(0.5, abs=1e-3)
