"""Decode speed of whole replies through the chat controller, greedy vs the chat's sampling.

Part of `ds4tui bench engine --chat-tokens N`. Each reply is a ChatController turn in a
fresh conversation (disk cache off), so its speed is `Done.tok_s`: exactly the number
the chat's stats line shows under a reply (sampling, token bookkeeping and the
streaming of text included; prefill excluded). Greedy and sampled replies alternate,
the order flipping each round, so a busy machine slows both alike; their ratio is taken
within each round (the median of those is reported), which cancels slow drifts in load. Replies may end
early at an end-of-turn token; the token counts are reported with the speeds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

PROMPT = "Write a long story about a dragon who learns to bake bread. Use many details."


@dataclass
class ChatDecodeResult:
    max_tokens: int
    rounds: int
    greedy_tok_s: float  # median of Done.tok_s over the greedy replies
    sampled_tok_s: float  # the same with the config's default sampling (0.7, top-p 0.95, min-p 0.05), seeded
    greedy_tokens: float  # median reply length
    sampled_tokens: float
    sampled_over_greedy: float  # median over rounds of sampled / greedy within the round
    greedy_runs: list[float]  # Done.tok_s of each round, in order
    sampled_runs: list[float]


def _reply(model, spec: str, max_tokens: int, greedy: bool, seed: int):
    from ds4tui.config import Config
    from ds4tui.chat.controller import ChatController

    config = Config(model=spec, no_disk_cache=True, max_tokens=max_tokens, seed=seed,
                    ctx=min(model.info.n_ctx, 1024 + max_tokens))
    if greedy:
        config = replace(config, temperature=0.0)
    ctl = ChatController(model, config)
    conv = ctl.new_conversation()
    done = ctl.send(conv.key, PROMPT)
    if done is None:
        raise RuntimeError("a benchmark chat turn failed")
    # The next chat's buffers, which the turn's end has the engine touch in the background
    # (SessionPool.prepare_next), are ready before the next reply, as for someone reading this
    # one: its decode is not measured alongside that touching.
    model.prepare_session(config.ctx, kv_dtype=config.kv_dtype, wait=True)
    return done


def measure_chat_decode(model, spec: str, max_tokens: int = 200, rounds: int = 3) -> ChatDecodeResult:
    _reply(model, spec, 4, False, 0)  # warm-up: first-use costs of sessions and the sampler
    greedy, sampled = [], []
    for i in range(rounds):
        sides = [(True, greedy), (False, sampled)]
        for is_greedy, out in sides[:: -1 if i % 2 else 1]:
            out.append(_reply(model, spec, max_tokens, is_greedy, seed=i))
    g = statistics.median(d.tok_s for d in greedy)
    s = statistics.median(d.tok_s for d in sampled)
    return ChatDecodeResult(
        max_tokens=max_tokens, rounds=rounds,
        greedy_tok_s=round(g, 1), sampled_tok_s=round(s, 1),
        greedy_tokens=statistics.median(d.tokens for d in greedy),
        sampled_tokens=statistics.median(d.tokens for d in sampled),
        # paired by round: the two replies of a round ran back to back, under the same load
        sampled_over_greedy=round(statistics.median(b.tok_s / a.tok_s for a, b in zip(greedy, sampled)), 3),
        greedy_runs=[round(d.tok_s, 1) for d in greedy],
        sampled_runs=[round(d.tok_s, 1) for d in sampled],
    )
