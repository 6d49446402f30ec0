"""A chunk's forward with each layer as one C call (kernels/chunk.c) against the per-layer
Python steps, alternating in one process.

Usage (from the repo root):

    .venv/bin/python bench/chunk_layer_ab.py --model gemma3-270m --tokens 512 [--rounds 8]

Both paths compute the same bits (tests/engine/kernels/test_chunk_layer.py); this shows what
the ~15 Python and torch calls per layer between the kernels cost. Each round runs one
forward of --tokens tokens from position 0 on each path (`LlamaModel.use_c_layers` on, off);
prints the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI sets it (docs/perf-archive.md)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    import torch

    from ds4tui.bench.engine_bench import bench_tokens
    from ds4tui.engine.loader import load_model

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    if not model.use_c_layers:
        print(f"{args.model}: the C layer does not take this model's chunks", file=sys.stderr)
        return 1
    tokens = bench_tokens(model, args.tokens)
    session = model.new_session(args.tokens + 8)
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for _ in range(args.rounds):
            for use_c in (True, False):
                model.use_c_layers = use_c
                t0 = time.perf_counter()
                with torch.inference_mode():
                    model.forward(session.kv, tokens, 0, True)
                times[use_c].append((time.perf_counter() - t0) * 1e3)
    finally:
        model.use_c_layers = True
    print(f"{args.model}, {args.tokens} tokens, {args.threads} threads, medians of {args.rounds}: "
          f"C layers {statistics.median(times[True]):.1f} ms, Python steps {statistics.median(times[False]):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
