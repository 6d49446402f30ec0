"""Where a decode token's time goes, for a GGUF llama model on the fused C step.

Usage (from the repo root): .venv/bin/python bench/decode_breakdown.py [--model M] [--threads N]

Times, from the round (of --rounds) with the fastest token; each round measures all three
back to back, so they share one machine load (other processes only ever slow a round down):
  token    `session.decode` per token (the C step, plus Python: session bookkeeping, argmax)
  step     the C step alone (`model.fast.step`)
  gemv     the step's matrix-vector products alone: every layer's matrices and the head,
           one `QuantMatrix.matvec` each, minus the measured cost of a call into the library
Shares of the token: Python = token - step; GEMV (weight streaming) = gemv; the rest of the
step (attention, norms, RoPE, SwiGLU, pool hand-offs between the products) = step - gemv.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--ctx", type=int, default=64, help="tokens already in the session (default 64)")
    args = p.parse_args()

    import torch

    from ds4tui.engine.kernels import qgemv
    from ds4tui.engine.kernels.qgemv import QuantMatrix
    from ds4tui.engine.loader import load_model

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    fast = model.fast
    if fast is None:
        print(f"no fused C step for {args.model} ({qgemv.backend_reason()})", file=sys.stderr)
        return 1
    s = model.new_session(args.ctx + 64)
    s.prefill(list(range(1, args.ctx + 1)))
    kv, pos, reps = s.kv, args.ctx, 16

    def token():
        del s.tokens[args.ctx:]  # decode at the same position again
        s.decode(int(torch.argmax(s.logits)))

    def step():
        fast.step(kv, 5, pos, True)

    mats = [m for m in fast._keep if isinstance(m, QuantMatrix)]
    xs = {m.cols: torch.randn(m.cols) for m in mats}
    outs = [torch.empty(m.rows) for m in mats]

    def gemvs():
        for m, o in zip(mats, outs):
            m.matvec(xs[m.cols], o)

    tiny = QuantMatrix(torch.zeros(2, 20, dtype=torch.uint8), "q4_1", 32)
    x32, o2 = torch.zeros(32), torch.empty(2)
    with torch.inference_mode():
        # The four measurements run back to back in every round, so a round sees one load;
        # the round with the fastest token is reported.
        rounds = []
        for _ in range(args.rounds):
            t_call = timed(lambda: tiny.matvec(x32, o2), 200)
            rounds.append((timed(token, reps), timed(step, reps), timed(gemvs, 4) - len(mats) * t_call))
        t_token, t_step, t_gemv = min(rounds)
    ms = 1e3
    print(f"{args.model}, {args.threads} threads, kernels {qgemv.backend()}, position {pos}, best of {args.rounds}")
    print(f"token {t_token * ms:.2f} ms ({1 / t_token:.1f} tok/s); step {t_step * ms:.2f} ms; "
          f"gemv {t_gemv * ms:.2f} ms over {len(mats)} matrices ({sum(m.nbytes for m in mats) / 1e6:.1f} MB)")
    for name, t in (("GEMV (weight streaming)", t_gemv), ("rest of the C step", t_step - t_gemv),
                    ("Python per token", t_token - t_step)):
        print(f"  {name:<24} {t * ms:6.2f} ms  {100 * t / t_token:5.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
