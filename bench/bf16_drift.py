"""How far bf16 moves a real model's next-token distribution from fp32.

Usage (from the repo root, on a CPU with AVX-512 and AVX512_BF16):

    .venv/bin/python bench/bf16_drift.py --model smollm2-135m-instruct --context 512,1100,4096

For each context N: a session prefills N tokens of the bench text, then a 20-token follow-up
(a short product, and attention over N keys), then decodes 24 greedy steps; once with bf16 on
(products of long chunks and of Q4_1, attention over 512 keys or more: qgemm.c, attn.c) and
once with everything fp32 (`qgemv.use_bf16`). Prints the KL divergence KL(fp32 || bf16) of
the follow-up's next-token distribution, the largest logit difference against the logit
range, and how many of the 24 greedy tokens agree. The numbers docs/perf-archive.md quotes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI sets it (docs/perf-archive.md)

FOLLOW_UP = 20
GREEDY = 24


def run(model, tokens: list[int], context: int, bf16: bool):
    import torch

    from ds4tui.engine.kernels import qgemv

    with qgemv.use_bf16(bf16), torch.inference_mode():
        s = model.new_session(context + FOLLOW_UP + GREEDY + 8)
        s.prefill(tokens[:context])
        s.prefill(tokens[context:])
        logits = s.logits.double().clone()
        steps = []
        for _ in range(GREEDY):
            steps.append(int(s.logits.argmax()))
            s.decode(steps[-1])
    return logits, steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--context", default="300,512,1100,4096", help="comma-separated prompt lengths")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from ds4tui.bench.engine_bench import bench_tokens
    from ds4tui.engine.kernels import qgemv
    from ds4tui.engine.loader import load_model

    if not qgemv.bf16_available():
        print("this CPU (or build) has no AVX512_BF16: bf16 never runs here", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    for context in (int(c) for c in args.context.split(",")):
        tokens = bench_tokens(model, context + FOLLOW_UP)
        bf, bf_steps = run(model, tokens, context, True)
        fp, fp_steps = run(model, tokens, context, False)
        p, q = torch.log_softmax(fp, -1), torch.log_softmax(bf, -1)
        kl = float((p.exp() * (p - q)).sum())
        same = sum(a == b for a, b in zip(bf_steps, fp_steps))
        print(f"{args.model} {context} + {FOLLOW_UP}: KL {kl:.2e}, largest logit difference "
              f"{float((bf - fp).abs().max()):.3f} of a range of {float(fp.max() - fp.min()):.1f}, "
              f"greedy {same}/{GREEDY} the same")
    return 0


if __name__ == "__main__":
    sys.exit(main())
