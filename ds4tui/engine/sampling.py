"""Choosing the next token from logits: greedy, temperature, top-p, min-p; seeded."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingParams:
    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.95  # nucleus: keep the smallest set of tokens whose mass reaches top_p
    min_p: float = 0.05  # drop tokens whose probability is below min_p x the best one's
    seed: int | None = None


class Sampler:
    """Stateful so a seeded conversation is reproducible token after token."""

    def __init__(self, params: SamplingParams | None = None) -> None:
        self.params = params or SamplingParams()
        self._gen = torch.Generator()
        if self.params.seed is not None:
            self._gen.manual_seed(self.params.seed)
        else:
            self._gen.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        return sample(logits, self.params, self._gen)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    logits = logits.detach().to(torch.float32).reshape(-1)
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.min_p > 0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
    if 0 < params.top_p < 1:
        sorted_p, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_p, dim=-1)
        # keep a token while the mass before it is below top_p (the best token always stays)
        keep = (cumulative - sorted_p) < params.top_p * cumulative[-1]
        sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
