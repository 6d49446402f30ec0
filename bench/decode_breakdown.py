"""Where a decode token's time goes, for a GGUF llama model on the fused C step.

Usage (from the repo root): .venv/bin/python bench/decode_breakdown.py [--model M] [--threads N]
                            [--samples 200] [--ctx 64] [--json]

Every sample times, back to back and in this order (so neighbours share one machine load):
  token    `session.decode` of one token (the C step plus Python: session bookkeeping, argmax)
  step     the C step alone (`model.fast.step`)
  gemv     the step's matrix-vector products alone: every layer's matrices and the head,
           one `QuantMatrix.matvec` call each (ctypes call + pool hand-off + weight streaming)
  handoff  a matvec of a tiny 8-row matrix: two chunks, so the pool hands one to a worker
           (what each of the step's products pays besides its work)
  call     a matvec of a tiny 2-row matrix: one chunk, run on the caller (the ctypes call alone)
The components, each the median over samples of a per-sample difference (paired, so a
load spike that slows one sample slows both sides of its difference):
  weight streaming      gemv - n x handoff              (n = number of matrices)
  pool hand-offs        n x (handoff - call)            (thread wake-ups and the wait for the slowest chunk)
  rest of the C step    step - (gemv - n x call)        (attention, norms, RoPE, SwiGLU, the step's own glue)
  Python per token      token - step
Shares are of the median token. The load average before and after is printed: on a
shared machine the medians still move with it, the paired differences much less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--ctx", type=int, default=64, help="tokens already in the session (default 64)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args()

    import numpy as np
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
    kv, pos = s.kv, args.ctx

    def token():
        del s.tokens[args.ctx:]  # decode at the same position again
        s.decode(int(np.argmax(s.logits.numpy())))  # as the chat's greedy Sampler (torch.argmax: 0.14 ms at 262K)

    def step():
        fast.step(kv, 5, pos, True)

    mats = [m for m in fast._keep if isinstance(m, QuantMatrix)]
    xs = {m.cols: torch.randn(m.cols) for m in mats}
    outs = [torch.empty(m.rows) for m in mats]

    def gemvs():
        for m, o in zip(mats, outs):
            m.matvec(xs[m.cols], o)

    one_chunk = QuantMatrix(torch.zeros(2, 20, dtype=torch.uint8), "q4_1", 32)
    two_chunks = QuantMatrix(torch.zeros(8, 20, dtype=torch.uint8), "q4_1", 32)
    x32, o2, o8 = torch.zeros(32), torch.empty(2), torch.empty(8)
    probe_reps = 20

    def handoff():
        for _ in range(probe_reps):
            two_chunks.matvec(x32, o8)

    def call():
        for _ in range(probe_reps):
            one_chunk.matvec(x32, o2)

    n = len(mats)
    load_before = os.getloadavg()[0]
    rows = {k: [] for k in ("token", "step", "gemv", "handoff", "call")}
    with torch.inference_mode():
        for _ in range(3):  # warm: first calls, pages, the pool's threads
            token(), step(), gemvs()
        for _ in range(args.samples):
            rows["token"].append(once(token))
            rows["step"].append(once(step))
            rows["gemv"].append(once(gemvs))
            rows["handoff"].append(once(handoff) / probe_reps)
            rows["call"].append(once(call) / probe_reps)
    load_after = os.getloadavg()[0]
    t = {k: statistics.median(v) for k, v in rows.items()}
    parts = {
        "weight streaming (GEMV)": [g - n * h for g, h in zip(rows["gemv"], rows["handoff"])],
        "pool hand-offs": [n * (h - c) for h, c in zip(rows["handoff"], rows["call"])],
        "rest of the C step": [st - (g - n * c) for st, g, c in zip(rows["step"], rows["gemv"], rows["call"])],
        "Python per token": [tk - st for tk, st in zip(rows["token"], rows["step"])],
    }
    ms = 1e3
    result = {
        "model": args.model, "threads": args.threads, "kernels": qgemv.backend(), "position": pos,
        "samples": args.samples, "matrices": n, "weight_mb": sum(m.nbytes for m in mats) / 1e6,
        "load_average": [load_before, load_after],
        "median_ms": {k: v * ms for k, v in t.items()},
        "parts_ms": {k: [x * ms for x in quartiles(v)] for k, v in parts.items()},
        "shares": {k: statistics.median(v) / t["token"] for k, v in parts.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.model}, {args.threads} threads, kernels {qgemv.backend()}, position {pos}, "
          f"{args.samples} samples, load average {load_before:.1f} -> {load_after:.1f}")
    print(f"token {t['token'] * ms:.2f} ms ({1 / t['token']:.1f} tok/s); step {t['step'] * ms:.2f} ms; "
          f"gemv {t['gemv'] * ms:.2f} ms over {n} matrices ({result['weight_mb']:.1f} MB); "
          f"hand-off {t['handoff'] * 1e6:.1f} us, call {t['call'] * 1e6:.1f} us (medians)")
    print(f"  {'part':<24} {'median':>8} {'p25..p75':>16} {'share':>7}")
    for name, (q1, med, q3) in result["parts_ms"].items():
        print(f"  {name:<24} {med:6.2f} ms {q1:6.2f}..{q3:6.2f} ms {100 * result['shares'][name]:6.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
