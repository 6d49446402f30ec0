"""Cache policy knobs and the small pure functions built on them.

Owns: how many tokens a checkpoint stores (trim + align), when cold and
continued checkpoints are due, the 1% budget headroom, and the eviction score.
Leaves to callers: deciding to save at all, and every file operation (store.py).

The numbers default to ds4's (ds4_kvstore.c) except the last two, which are ds4tui's
own (the design it follows; ds4's code scores (decayed hits + 1) x tokens / size);
the reasons, in short:
- trim 32 tail tokens: a tokenizer may merge text across the prompt boundary,
  so the last few tokens of a prompt are not a stable prefix of the next one;
- align to 2048: the prefill chunk schedule is 2048-aligned, so a checkpoint on
  a 2048 boundary finalizes compressor rows exactly where a cold prefill does
  (bit-identical restore);
- continued every 10000 tokens, rounded up to the alignment (10240);
- cold saves only up to 30000 tokens: longer first prompts are rarely shared;
- 1% headroom: a file that just fits must not be evicted by its own budget pass;
- hits decay with a 6 h half-life: hits are evidence of usefulness only while
  the workload still resembles the one that produced them;
- (ds4tui's) cold/evict/shutdown are deliberate anchors and weigh 2x;
- (ds4tui's) a continued checkpoint whose text is a strict prefix of a newer file is a
  waypoint on a path already covered: pressed to 5%..50% of its score, nearer
  50% the more (recent) hits it has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ds4tui.format.kvc import REASON_COLD, REASON_EVICT, REASON_SHUTDOWN

MIB = 1024 * 1024
ANCHOR_REASONS = frozenset({REASON_COLD, REASON_EVICT, REASON_SHUTDOWN})


@dataclass(frozen=True)
class CachePolicy:
    """Tunables of the disk cache; the defaults are ds4's but for the anchor weight and the
    superseded factors (ds4tui's)."""

    budget_mb: int = 4096
    min_tokens: int = 512
    cold_max_tokens: int = 30000
    continued_interval_tokens: int = 10000
    boundary_trim_tokens: int = 32
    boundary_align_tokens: int = 2048
    headroom_percent: int = 1
    hit_half_life_s: float = 6 * 3600.0
    # Below this many effective hits a checkpoint counts as never hit.
    min_effective_hits: float = 0.01
    anchor_weight: float = 2.0
    superseded_min_factor: float = 0.05
    superseded_hit_factor: float = 0.45
    # A `.tmp` older than this was left by a crashed writer (a live writer keeps
    # bumping its mtime); eviction removes it.
    stale_tmp_s: float = 3600.0

    @property
    def budget_bytes(self) -> int:
        return self.budget_mb * MIB

    @property
    def superseded_max_factor(self) -> float:
        """The most a superseded file keeps of its score (0.5 by default)."""
        return self.superseded_min_factor + self.superseded_hit_factor

    def store_len(self, tokens: int) -> int:
        """Tokens to store for a prefix of `tokens`, or 0 when it is too short to keep.

        Trim the unstable tail, then align down. Like ds4, a prefix that has not
        reached its first aligned boundary after trimming is kept whole.
        """
        trim, align = self.boundary_trim_tokens, self.boundary_align_tokens
        n = tokens
        if tokens > self.min_tokens + trim:
            stable = tokens - trim
            if align > 0:
                stable -= stable % align
            if stable >= self.min_tokens:
                n = stable
        return n if n >= self.min_tokens else 0

    def cold_allowed(self, tokens: int) -> bool:
        """Whether a first prompt of this length gets a cold checkpoint."""
        return self.min_tokens <= tokens <= self.cold_max_tokens

    @property
    def continued_step(self) -> int:
        """Distance between continued frontiers: the interval rounded up to the alignment."""
        step, align = self.continued_interval_tokens, self.boundary_align_tokens
        if step <= 0:
            return 0
        if align > 0:
            step = max(align, -(-step // align) * align)
        return step

    def next_continued_frontier(self, last_stored: int) -> int:
        """The first frontier after `last_stored` tokens (0 when continued saves are off)."""
        step = self.continued_step
        if step <= 0:
            return 0
        frontier = (max(last_stored, 0) // step + 1) * step
        while frontier < self.min_tokens:
            frontier += step
        return frontier

    def continued_target(self, live_tokens: int, last_stored: int) -> int:
        """ds4's rule: a continued checkpoint is due exactly on a frontier past the last one."""
        step = self.continued_step
        if step <= 0 or live_tokens < self.min_tokens or live_tokens % step:
            return 0
        return live_tokens if live_tokens > last_stored else 0

    def required_bytes(self, file_bytes: int) -> int:
        """File size plus the headroom (rounded up) a save must fit in the budget."""
        return file_bytes + -(-file_bytes * self.headroom_percent // 100)

    def effective_hits(self, hits: int, last_used: int, created_at: int, now: float) -> float:
        used_at = last_used or created_at
        if used_at == 0:
            return 0.0
        eff = float(hits)
        if now > used_at:
            eff *= math.exp2(-(now - used_at) / self.hit_half_life_s)
            if eff < self.min_effective_hits:
                eff = 0.0
        return eff

    def score(self, *, hits: int, tokens: int, file_bytes: int, last_used: int,
              created_at: int, reason_code: int, superseded: bool, now: float,
              titled: bool = False) -> ScoreParts:
        """Eviction score parts; the lowest score goes first. A titled session (the user's
        own, named) weighs as an anchor, as cold/evict/shutdown files do (both ds4tui's weights, not ds4's)."""
        eff = self.effective_hits(hits, last_used, created_at, now)
        anchor = self.anchor_weight if reason_code in ANCHOR_REASONS or titled else 1.0
        factor = 1.0
        if superseded:
            h = eff / (eff + 1.0) if eff > 0 else 0.0
            factor = self.superseded_min_factor + self.superseded_hit_factor * h
        density = tokens / file_bytes if file_bytes > 0 else 0.0
        return ScoreParts(eff, anchor, factor, (eff + 1.0) * density * anchor * factor)


@dataclass(frozen=True)
class ScoreParts:
    """Why a file scores what it does, for the cache browser and `kv ls`."""

    effective_hits: float
    anchor_weight: float
    superseded_factor: float
    score: float


DEFAULT_POLICY = CachePolicy()
