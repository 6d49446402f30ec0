"""KV buffers on huge pages or on 4 KiB pages: decode steps and a short chunk at depth, A/B in one process.

Usage (from the repo root):

    .venv/bin/python bench/huge_pages.py [--model smollm2-135m-instruct] [--pos 4096] [--rounds 8]

Two sessions of the same model and context: one with the buffer new_kv gives (huge pages
where the kernel allows, engine/huge_pages.py), one with an ordinary torch.zeros buffer
(4 KiB pages). Their rows are filled alike (the cost does not depend on the values); each
round times, alternating, 40 decode steps at --pos and an 18-token chunk (a follow-up after a
disk hit) just after it. Prints the medians and every round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--pos", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()

    import torch

    from ds4tui.engine.huge_pages import HUGE_PAGE
    from ds4tui.engine.loader import load_model

    model = load_model(args.model)
    ctx = args.pos + 512
    model.warm_up(ctx)
    huge = model.new_session(ctx)
    small = model.new_session(ctx)
    if not isinstance(small.kv, torch.Tensor):
        raise SystemExit("a model with sliding layers: its buffers are per layer, this bench takes one")
    small.kv = torch.zeros(small.kv.shape, dtype=small.kv.dtype)
    for s in (huge, small):
        s.kv.fill_(1.0)
    print(f"huge-page buffer 2 MiB aligned: {huge.kv.data_ptr() % HUGE_PAGE == 0}")

    def steps(kv, n=40) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i in range(n):
                model.forward(kv, [100 + i % 7], args.pos + i, True)
        return (time.perf_counter() - t0) * 1000.0 / n

    def chunk(kv) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.forward(kv, list(range(100, 118)), args.pos + 64, True)
        return (time.perf_counter() - t0) * 1000.0

    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, s in (("4 KiB", small), ("huge", huge)):
            rows.setdefault(f"decode step, {name}", []).append(steps(s.kv))
            rows.setdefault(f"18-token chunk, {name}", []).append(chunk(s.kv))
    print(f"{args.model}, position {args.pos}, {args.rounds} rounds (ms)")
    for name, values in rows.items():
        print(f"  {name:22} median {statistics.median(values):6.2f}   " + " ".join(f"{v:.2f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
