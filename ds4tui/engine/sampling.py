"""Choosing the next token from logits: penalties, greedy, temperature, top-k, min-p, top-p; seeded.

Penalties first (OpenAI's definition, which llama.cpp's penalties sampler follows): a token
generated c > 0 times so far in this reply has its logit lowered by
c x frequency_penalty + presence_penalty (negative values favour repeats). They apply to
greedy decoding too. The Sampler counts the tokens it has drawn itself.

Then, for temperature T > 0 and weights w_i = exp((l_i - max l) / T) (the best token's is 1):

1. top-k (k > 0): keep the k best tokens;
2. min-p: keep tokens with w_i >= min_p (probability at least min_p x the best one's);
3. top-p (0 < top_p < 1): order the survivors by weight, best first, and keep a token while
   the survivors' mass before it is below top_p x their total (the best token always stays);
4. draw one of the kept tokens in proportion to w.

Ties are ordered by token id (lower first), so the kept set never depends on a sort's
stability. Tokens whose weight underflows to 0 are never kept.

Speed: this runs once per generated token, between two C decode steps, so it must cost
far less than a step (~2.6 ms for SmolLM2). It never sorts or exponentiates the whole
vocabulary when min-p or top-k is set: min-p becomes a threshold on the raw logits
(w_i >= min_p  <=>  l_i >= max l + T ln min_p), and only the survivors are exponentiated
and sorted; when they are few (the usual case) on Python lists, since right after a decode
step every numpy call pays for cold caches. It uses numpy, not torch: torch's multi-threaded
ops on a 49k vector fight the kernels' thread pool for the cores (a 1.5 ms sampler measured 12 ms
per token inside the chat that way).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

import numpy as np

# Tokens whose logit lies this far (relative) below the min-p threshold are still looked at
# exactly (their weight is computed and compared), so float rounding in the threshold on the
# float32 logits can never drop a token the rule keeps.
_THRESHOLD_SLACK = 1e-4
# With many survivors (min-p off), top-p looks at the best candidates only, doubling their
# number until their mass reaches top_p.
_TOP_P_FIRST_CANDIDATES = 256
# Survivors up to this many go through top-p and the draw as Python lists (_top_p_few).
_FEW = 64


@dataclass
class SamplingParams:
    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.95  # nucleus: keep the smallest set of tokens whose mass reaches top_p
    min_p: float = 0.05  # drop tokens whose probability is below min_p x the best one's
    seed: int | None = None
    top_k: int = 0  # keep only the k most likely tokens; 0 = off
    frequency_penalty: float = 0.0  # per earlier occurrence in the reply, off the logit
    presence_penalty: float = 0.0  # once for any token already in the reply

    @property
    def penalized(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty)


class Sampler:
    """Stateful so a seeded conversation is reproducible token after token, and so the
    penalties know what this reply has drawn so far."""

    def __init__(self, params: SamplingParams | None = None) -> None:
        self.params = params or SamplingParams()
        # Made at the first draw: greedy needs none, and seeding from the OS's entropy is
        # ~0.1 ms of a reply's time to first token (docs/perf-archive.md, "The disk hit: a parked
        # reader thread"). The same seed gives the same stream either way.
        self._rng: np.random.Generator | None = None
        self.counts: dict[int, int] = {}  # token id -> times drawn (only with penalties)

    def __call__(self, logits) -> int:
        params = self.params
        if params.penalized and self.counts:
            logits = penalize(logits, self.counts, params.frequency_penalty, params.presence_penalty)
        if params.temperature <= 0:
            token = sample(logits, params)
        else:
            if self._rng is None:
                self._rng = np.random.default_rng(params.seed)  # seed None: fresh OS entropy
            token = sample(logits, params, self._rng)
        if params.penalized:
            self.counts[token] = self.counts.get(token, 0) + 1
        return token


def penalize(logits, counts: dict[int, int], frequency: float, presence: float) -> np.ndarray:
    """A copy of `logits` with each counted token's logit lowered by count x frequency + presence."""
    x = _as_numpy(logits).astype(np.float32, copy=True)
    ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    c = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    x[ids] -= c * np.float32(frequency) + np.float32(presence)
    return x


def sample(logits, params: SamplingParams, generator=None) -> int:
    """One token id from `logits` (a 1-D torch tensor or numpy array).

    `generator`: a numpy Generator, a torch.Generator (one uniform drawn from it per call),
    or None (numpy's fresh default).
    """
    x = _as_numpy(logits)
    if params.temperature <= 0:
        return int(np.argmax(x))
    ids, weights = _kept(x, params)
    if len(ids) == 1:
        return int(ids[0])
    cumulative = list(itertools.accumulate(weights)) if isinstance(weights, list) else np.cumsum(weights)
    u = _uniform(generator) * cumulative[-1]
    i = bisect.bisect_right(cumulative, u)  # numpy's searchsorted(side="right"), on a list too
    return int(ids[min(i, len(ids) - 1)])


def kept_tokens(logits, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The tokens `sample` may draw (temperature > 0) and their unnormalized weights.

    Ordered best first (ties: lower id first); every weight is > 0.
    """
    ids, w = _kept(_as_numpy(logits), params)
    return np.asarray(ids, dtype=np.int64), np.asarray(w, dtype=np.float64)


def _kept(x: np.ndarray, params: SamplingParams) -> tuple:
    """kept_tokens' answer, as arrays or (a few survivors) as lists."""
    t = float(params.temperature)
    if t <= 0:
        raise ValueError("kept_tokens needs a temperature > 0 (0 is greedy)")
    best = float(x.max())
    if not math.isfinite(best):
        raise ValueError(f"cannot sample: the largest logit is {best}")
    ids = _candidates(x, best, t, params.min_p)
    if len(ids) <= _FEW:
        return _kept_few(ids.tolist(), x[ids].tolist(), best, t, params)
    w = np.exp((x[ids].astype(np.float64) - best) / t)
    keep = w >= params.min_p if params.min_p > 0 else w > 0
    if params.top_k > 0 and int(keep.sum()) > params.top_k:
        keep &= _best_k_mask(w, params.top_k)
    ids, w = ids[keep], w[keep]
    return _top_p(ids, w, params.top_p)


def _as_numpy(logits) -> np.ndarray:
    if isinstance(logits, np.ndarray):
        return logits.reshape(-1)
    import torch

    # float32 on the CPU (the engines' logits): a view, no copy
    return logits.detach().reshape(-1).to("cpu", torch.float32).numpy()


def _candidates(x: np.ndarray, best: float, t: float, min_p: float) -> np.ndarray:
    """Token ids (ascending) that may pass min-p: all with a logit at or above its threshold."""
    if min_p <= 0:
        return np.arange(len(x))
    threshold = best + t * math.log(min_p)
    threshold -= _THRESHOLD_SLACK * max(1.0, abs(threshold), abs(best))
    return np.flatnonzero(x >= threshold)


def _best_k_mask(w: np.ndarray, k: int) -> np.ndarray:
    """Mask of the k largest weights of `w` (w ordered by token id: ties go to the lower id)."""
    cut = np.partition(w, len(w) - k)[len(w) - k]  # the k-th largest weight
    mask = w > cut
    ties = np.flatnonzero(w == cut)
    mask[ties[: k - int(mask.sum())]] = True
    return mask


def _order(w: np.ndarray) -> np.ndarray:
    """Positions of w, largest first; ties keep their (ascending id) order."""
    return np.argsort(-w, kind="stable")


def _top_p(ids: np.ndarray, w: np.ndarray, top_p: float) -> tuple:
    """The nucleus of the survivors `ids` (ascending) with weights `w`, ordered best first."""
    if len(w) <= _FEW:
        return _top_p_few(ids.tolist(), w.tolist(), top_p)
    if not 0 < top_p < 1:
        order = _order(w)
        return ids[order], w[order]
    total = float(w.sum())
    n = _TOP_P_FIRST_CANDIDATES
    while True:
        whole = n >= len(w)
        if whole:
            sub = _order(w)
        else:
            # every weight >= the n-th largest (ties included): an ordered prefix of all tokens
            cut = np.partition(w, len(w) - n)[len(w) - n]
            sub = np.flatnonzero(w >= cut)
            sub = sub[_order(w[sub])]
        cumulative = np.cumsum(w[sub])
        if whole:
            total = float(cumulative[-1])  # the mass summed in the same order as the prefix
        if whole or cumulative[-1] >= top_p * total:
            # beyond the prefix, the mass before any token is >= top_p x total: none is kept
            before = cumulative - w[sub]
            count = max(1, int(np.count_nonzero(before < top_p * total)))
            sub = sub[:count]
            return ids[sub], w[sub]
        n *= 4


def _kept_few(ids: list, logits: list, best: float, t: float, params: SamplingParams) -> tuple[list, list]:
    """_kept's filters for a few candidates (ascending ids), in plain Python (see _top_p_few)."""
    w = [math.exp((v - best) / t) for v in logits]
    keep = [i for i, wi in enumerate(w) if (wi >= params.min_p if params.min_p > 0 else wi > 0)]
    if 0 < params.top_k < len(keep):
        keep = sorted(sorted(keep, key=lambda i: -w[i])[: params.top_k])  # the k best; ties: lower id
    return _top_p_few([ids[i] for i in keep], [w[i] for i in keep], params.top_p)


def _top_p_few(ids: list, w: list, top_p: float) -> tuple[list, list]:
    """_top_p for a few survivors (min-p's usual case) in plain Python: the same sort (stable,
    best first), the same left-to-right float sums, so the same answer. Right after a decode
    step each numpy call runs with cold caches (15-35 us each, docs/perf-archive.md "Sampling"); these
    few list operations cost less than one of them."""
    order = sorted(range(len(w)), key=lambda i: -w[i])  # stable: ties keep ascending ids
    ids, w = [ids[i] for i in order], [w[i] for i in order]
    if not 0 < top_p < 1:
        return ids, w
    cumulative = list(itertools.accumulate(w))
    limit = top_p * cumulative[-1]
    count = max(1, sum(1 for c, x in zip(cumulative, w) if c - x < limit))
    return ids[:count], w[:count]


_fallback_rng = np.random.default_rng()


def _uniform(generator) -> float:
    """One uniform draw in [0, 1)."""
    if generator is None:
        return float(_fallback_rng.random())
    if isinstance(generator, np.random.Generator):
        return float(generator.random())
    import torch

    return float(torch.rand((), generator=generator, dtype=torch.float64))
