"""Prefill products in bf16 (kernels/qgemm.c) on the real models: a 512-token prompt and a
20-token follow-up (SmolLM2's Q4_1 products take the bf16 tiles at any length) prefilled with
bf16 products leave the same next-token distribution as with fp32 ones, up to rounding, and
the same greedy continuation. Measured (docs/perf-archive.md, "Prefill products in bf16"): KL
divergence 3e-6 (Gemma 3) and 1e-5 (SmolLM2), largest logit difference 0.07-0.1 over a logit
range of 35-44. Attention over 512 keys or more runs on bf16 pairs too (kernels/attn.c;
docs/perf-archive.md, "bf16 attention at depth"): both prompts' chunks here, the second one deeper.
With it, the largest KL measured is 1.2e-3, SmolLM2's follow-up after 512 tokens (a flat
distribution: logit range 31, largest difference 0.18; after 300, 700, 900 tokens 2e-5 or
less); the bound leaves room for that, the logit and greedy checks stay as strict."""

from __future__ import annotations

import pytest
import torch

from ds4tui.bench.engine_bench import bench_tokens
from ds4tui.engine.errors import ModelNotFoundError
from ds4tui.engine.kernels import qgemv
from ds4tui.engine.loader import load_model

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.usefixtures("bf16_cpu"),
]


@pytest.mark.parametrize("name,context", [("smollm2-135m-instruct", 512), ("gemma3-270m", 512),
                                          ("smollm2-135m-instruct", 1100), ("gemma3-270m", 1100)])
def test_bf16_prefill_keeps_the_next_token_distribution(name, context):
    try:
        model = load_model(name)
    except ModelNotFoundError as exc:
        pytest.fail(f"{exc} (`make test` does this before running the tests)")
    prompt = bench_tokens(model, context + 20)
    got = {}
    for on in (True, False):
        with qgemv.use_variant("avx512"), qgemv.use_bf16(on):  # the variant with bf16 tiles
            s = model.new_session(context + 88)
            s.prefill(prompt[:context])
            s.prefill(prompt[context:])  # a follow-up message: a short product (and deep attention)
            logits = s.logits.double().clone()
            steps = []
            for _ in range(8):
                steps.append(int(s.logits.argmax()))
                s.decode(steps[-1])
        got[on] = (logits, steps)
    (bf, bf_steps), (fp, fp_steps) = got[True], got[False]
    assert not torch.equal(bf, fp)  # the bf16 tiles ran
    p, q = torch.log_softmax(fp, -1), torch.log_softmax(bf, -1)
    kl = float((p.exp() * (p - q)).sum())
    assert kl < 3e-3, kl
    assert float((bf - fp).abs().max()) < 0.5
    assert bf_steps == fp_steps
