"""The fast sampler against a plain sort-based reference: same kept tokens, same distribution."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ds4tui.engine.sampling import Sampler, SamplingParams, kept_tokens, sample


def reference_kept(logits, p: SamplingParams) -> dict[int, float]:
    """Token -> probability, computed the obvious way: softmax, full sort, filters in order."""
    x = np.asarray(logits, dtype=np.float64)
    w = np.exp((x - x.max()) / p.temperature)
    probs = w / w.sum()
    order = sorted(range(len(x)), key=lambda i: (-probs[i], i))  # ties: lower id first
    kept = [i for i in order if probs[i] > 0]
    if p.top_k > 0:
        kept = kept[: p.top_k]
    if p.min_p > 0:
        kept = [i for i in kept if probs[i] >= p.min_p * probs[order[0]]]
    if 0 < p.top_p < 1:
        mass = sum(probs[i] for i in kept)
        nucleus, before = [], 0.0
        for i in kept:
            if before < p.top_p * mass:
                nucleus.append(i)
            before += probs[i]
        kept = nucleus
    total = sum(probs[i] for i in kept)
    return {i: probs[i] / total for i in kept}


def random_logits(rng: np.random.Generator, n: int) -> np.ndarray:
    """A mix of shapes: peaked, flat, heavy ties, -inf entries."""
    kind = rng.integers(5)
    if kind == 0:
        x = rng.normal(0, rng.uniform(0.5, 6), n)
    elif kind == 1:
        x = rng.normal(0, 0.05, n)  # nearly flat: many survivors
    elif kind == 2:
        x = rng.integers(0, 4, n).astype(np.float64) * rng.uniform(0.1, 2)  # few distinct values
    elif kind == 3:
        x = rng.normal(0, 3, n)
        x[rng.random(n) < 0.5] = -np.inf
    else:
        x = rng.standard_cauchy(n)  # a few huge outliers
    return x.astype(np.float32)


PARAM_GRID = [
    SamplingParams(),  # the chat's defaults: 0.7, 0.95, 0.05
    SamplingParams(temperature=1.0, top_p=1.0, min_p=0.0),  # plain temperature
    SamplingParams(temperature=1.0, top_p=0.9, min_p=0.0),  # top-p alone
    SamplingParams(temperature=0.8, top_p=1.0, min_p=0.1),  # min-p alone
    SamplingParams(temperature=1.3, top_p=0.5, min_p=0.01, top_k=7),
    SamplingParams(temperature=0.5, top_p=0.99, min_p=0.0, top_k=40),
    SamplingParams(temperature=1e-6, top_p=0.95, min_p=0.05),  # tiny temperature
    SamplingParams(temperature=1e-30, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=50.0, top_p=0.3, min_p=0.0),  # nearly uniform, big nucleus
]


@pytest.mark.parametrize("params", PARAM_GRID, ids=lambda p: f"T{p.temperature}-p{p.top_p}-m{p.min_p}-k{p.top_k}")
def test_kept_set_equals_reference(params):
    rng = np.random.default_rng(1234)
    for case in range(150):
        n = int(rng.choice([1, 2, 5, 50, 700, 3000]))
        x = random_logits(rng, n)
        if not np.isfinite(x).any():
            x[rng.integers(n)] = 0.0
        ids, weights = kept_tokens(torch.from_numpy(x), params)
        want = reference_kept(x, params)
        assert list(ids) == list(want), f"case {case}: n={n}"  # same tokens, same order
        got = weights / weights.sum()
        np.testing.assert_allclose(got, [want[i] for i in ids], rtol=1e-9, atol=1e-15)


def test_kept_set_edge_cases():
    d = SamplingParams()
    # ties at the top: both stay, the best token always does
    assert list(kept_tokens(np.array([1.0, 3.0, 3.0, -2.0], np.float32), d)[0]) == [1, 2]
    # one finite logit among -inf
    x = np.full(10, -np.inf, np.float32)
    x[7] = -5.0
    assert list(kept_tokens(x, d)[0]) == [7]
    # top-p cutting inside a group of equal tokens keeps the lower ids: 4 x 0.25, top_p 0.5
    flat = np.zeros(4, np.float32)
    assert list(kept_tokens(flat, SamplingParams(temperature=1.0, top_p=0.5, min_p=0.0))[0]) == [0, 1]
    assert list(kept_tokens(flat, SamplingParams(temperature=1.0, top_p=0.51, min_p=0.0))[0]) == [0, 1, 2]
    # top-k inside a tie group, as in the reference
    assert list(kept_tokens(flat, SamplingParams(temperature=1.0, top_p=1.0, min_p=0.0, top_k=3))[0]) == [0, 1, 2]
    # a vocabulary-sized flat row with min-p off: the nucleus (95% of 49152) is found by widening
    big = np.zeros(49152, np.float32)
    ids, _ = kept_tokens(big, SamplingParams(temperature=1.0, top_p=0.95, min_p=0.0))
    assert list(ids) == list(reference_kept(big, SamplingParams(temperature=1.0, top_p=0.95, min_p=0.0)))
    with pytest.raises(ValueError):
        kept_tokens(np.full(5, -np.inf, np.float32), d)
    with pytest.raises(ValueError):
        kept_tokens(np.array([0.0, np.nan], np.float32), d)


def test_temperature_zero_is_argmax():
    rng = np.random.default_rng(5)
    for _ in range(50):
        x = torch.from_numpy(random_logits(rng, 300))
        x[int(rng.integers(300))] = 1e4
        assert sample(x, SamplingParams(temperature=0.0)) == int(torch.argmax(x))
    # ties: the first best, like torch.argmax
    assert Sampler(SamplingParams(temperature=0))(torch.tensor([0.0, 2.0, 2.0])) == 1


def chi_square_p_value(stat: float, df: int) -> float:
    """Upper tail of the chi-square distribution (Wilson-Hilferty normal approximation)."""
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def draw_counts(x: np.ndarray, params: SamplingParams, draws: int) -> np.ndarray:
    sampler = Sampler(params)
    t = torch.from_numpy(x)
    return np.bincount([sampler(t) for _ in range(draws)], minlength=len(x))


def chi_square(counts: np.ndarray, probs: dict[int, float]) -> tuple[float, int]:
    draws = int(counts.sum())
    stat = sum((counts[i] - draws * p) ** 2 / (draws * p) for i, p in probs.items())
    return stat, len(probs) - 1


@pytest.mark.parametrize("params", [
    SamplingParams(seed=11),
    SamplingParams(temperature=0.5, top_p=0.8, min_p=0.0, seed=12),
    SamplingParams(temperature=1.5, top_p=1.0, min_p=0.02, top_k=20, seed=13),
], ids=["defaults", "top-p", "min-p+top-k"])
def test_draws_follow_the_reference_distribution(params):
    x = (np.random.default_rng(7).normal(0, 1.5, 2000)).astype(np.float32)
    want = reference_kept(x, params)
    assert 8 <= len(want) <= 200 and min(want.values()) * 20_000 >= 5  # chi-square applies
    counts = draw_counts(x, params, 20_000)
    assert set(np.flatnonzero(counts)) <= set(want)  # nothing outside the kept set, ever
    stat, df = chi_square(counts, want)
    assert chi_square_p_value(stat, df) > 1e-3, (stat, df)
    # the test can tell: the same draws against the distribution without top-p/min-p fail it
    w = np.exp((x.astype(np.float64) - x.max()) / params.temperature)
    unfiltered = {i: w[i] / w.sum() for i in range(len(x)) if w[i] / w.sum() * 20_000 >= 5}
    stat, df = chi_square(counts, {i: p / sum(unfiltered.values()) for i, p in unfiltered.items()})
    assert chi_square_p_value(stat, df) < 1e-6


def test_seeded_samplers_repeat_and_unseeded_ones_differ():
    x = torch.from_numpy(np.random.default_rng(3).normal(0, 1, 500).astype(np.float32))
    params = SamplingParams(temperature=1.0, top_p=1.0, min_p=0.0, seed=42)
    a, b = Sampler(params), Sampler(params)
    first = [a(x) for _ in range(200)]
    assert first == [b(x) for _ in range(200)]
    other = Sampler(SamplingParams(temperature=1.0, top_p=1.0, min_p=0.0, seed=43))
    assert first != [other(x) for _ in range(200)]
    fresh = [Sampler(SamplingParams(temperature=1.0, top_p=1.0, min_p=0.0))(x) for _ in range(50)]
    assert len(set(fresh)) > 1


def test_a_torch_generator_is_still_accepted():
    x = torch.from_numpy(np.random.default_rng(4).normal(0, 1, 100).astype(np.float32))
    p = SamplingParams(temperature=1.0)
    draws = [sample(x, p, torch.Generator().manual_seed(9)) for _ in range(3)]
    assert len(set(draws)) == 1 and draws[0] in set(kept_tokens(x, p)[0])


def reference_penalized(logits: np.ndarray, drawn: list[int], frequency: float, presence: float) -> np.ndarray:
    """OpenAI's definition (and llama.cpp's penalties sampler): mu[j] - c[j] * alpha_frequency
    - (c[j] > 0) * alpha_presence, c[j] the times token j was generated so far."""
    c = np.bincount(drawn, minlength=len(logits)).astype(np.float64)
    return logits.astype(np.float64) - c * frequency - (c > 0) * presence


@pytest.mark.parametrize("frequency,presence", [(0.7, 0.0), (0.0, 1.3), (0.5, 0.5), (-0.8, 0.3)])
def test_penalties_follow_the_openai_formula(frequency, presence):
    rng = np.random.default_rng(21)
    x = rng.normal(0, 2, 300).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_p=1.0, min_p=0.0, seed=5, frequency_penalty=frequency,
                            presence_penalty=presence)
    sampler = Sampler(params)
    drawn = [sampler(torch.from_numpy(x)) for _ in range(40)]
    assert sampler.counts == {t: drawn.count(t) for t in set(drawn)}
    # the distribution of the next draw: the reference's softmax over the penalized logits
    want = reference_penalized(x, drawn, frequency, presence)
    probs = np.exp((want - want.max()) / 0.9)
    probs /= probs.sum()
    from ds4tui.engine.sampling import penalize

    ids, w = kept_tokens(penalize(x, sampler.counts, frequency, presence), params)
    got = np.zeros(len(x))
    got[ids] = w / w.sum()
    np.testing.assert_allclose(got, probs, rtol=1e-5, atol=1e-9)
    if frequency > 0 and presence >= 0:  # penalties push the drawn tokens down: fewer repeats
        plain = Sampler(SamplingParams(temperature=0.9, top_p=1.0, min_p=0.0, seed=5))
        assert len(set(drawn)) > len({plain(torch.from_numpy(x)) for _ in range(40)})


def test_penalties_apply_to_greedy_and_top_k_one_is_greedy():
    x = torch.tensor([0.0, 3.0, 2.5, 1.0])
    greedy = Sampler(SamplingParams(temperature=0.0, presence_penalty=1.0))
    assert [greedy(x) for _ in range(3)] == [1, 2, 1]  # 3.0 -> 2.0 < 2.5; then 2.5 -> 1.5 < 2.0
    freq = Sampler(SamplingParams(temperature=0.0, frequency_penalty=0.4))
    # 3.0 -> 2.6 (> 2.5) -> 2.2 (< 2.5): then token 2, and so on
    assert [freq(x) for _ in range(4)] == [1, 1, 2, 1]
    top1 = Sampler(SamplingParams(temperature=1.0, top_p=1.0, min_p=0.0, top_k=1, seed=3))
    assert {top1(x) for _ in range(50)} == {1}
