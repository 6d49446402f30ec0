"""Wall time of one decode step at a given position, KV filled with random values.

Usage (from the repo root): .venv/bin/python bench/step_time.py [--model M] [--pos 4095] [--steps 100]

Times `model.forward(kv, [token], pos)` (the fused C step where the model has one) over a
session whose K/V rows are random rather than prefilled, so a position of 4K costs no 4K
prefill first. Prints min and median: compare builds by alternating runs of this script on
a quiet machine (a kernel constant such as qgemv.c's PF_DIST is tuned this way).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--pos", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    import torch

    from ds4tui.engine.loader import load_model

    model = load_model(args.model)
    kv = model.new_session(args.pos + 64).kv
    times = []
    with torch.inference_mode():
        for t in (kv if isinstance(kv, list) else [kv]):
            t.copy_(torch.randn(t.shape) * 0.5)
        for _ in range(args.steps):
            t0 = time.perf_counter()
            model.forward(kv, [5], args.pos, True)
            times.append(time.perf_counter() - t0)
    print(f"{args.model} position {args.pos}, {torch.get_num_threads()} threads: "
          f"min {min(times) * 1e3:.2f} ms, median {statistics.median(times) * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
