"""Prefill weight products (qgemm.c) on a SmolLM2 layer's four shapes, per ISA variant.

Usage (from the repo root):

    .venv/bin/python bench/gemm_shapes.py [--rows 512] [--threads 1] [--qtype q4_1] [--rounds 7]

Times Y = X W^T for X [rows, cols] and the layer's W (seeded random blocks of --qtype):
[960, 576] (fused QKV), [576, 576] (o), [3072, 576] (gate|up), [576, 1536] (down). The
variants alternate inside each round; each figure is the median round. With one thread
(the default) it times process CPU time, which other processes on a shared machine do not
inflate; with more, wall time. GFLOP/s counts 2 x rows x rows(W) x cols per product, the
count docs/perf-archive.md uses; `--peak` (AVX-512 FMA peak per core, GFLOP/s; default docs/perf-archive.md's
276 for the development VM) gives the share of it, and half of it for AVX2 (8-lane FMAs at
the same two per cycle, as on that Zen 5).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=512, help="activation rows (a prefill chunk's tokens)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--qtype", default="q4_1")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=10, help="products per shape per round")
    p.add_argument("--peak", type=float, default=276.0, help="AVX-512 FMA peak per core, GFLOP/s")
    args = p.parse_args()

    import torch

    from ds4tui.engine.kernels import qgemm, qgemv
    from tests.engine.kernels.test_kernels import random_blocks

    if qgemv.library() is None:
        print(f"no C kernels: {qgemv.backend_reason()}")
        return 1
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    g = torch.Generator().manual_seed(0)
    mats = [(qgemm.make_blocks((args.qtype, random_blocks(args.qtype, r, c, seed=r + c)), torch.empty(r, c)),
             torch.randn(args.rows, c, generator=g)) for r, c in SHAPES]
    variants = [v for v in reversed(qgemv.variants()) if v != "scalar"]
    times = {(v, i): [] for v in variants for i in range(len(SHAPES))}
    for _ in range(args.rounds + 1):  # the first round warms up
        for v in variants:
            with qgemv.use_variant(v):
                for i, (m, x) in enumerate(mats):
                    t0 = clock()
                    for _ in range(args.reps):
                        m.matmul(x)
                    times[(v, i)].append((clock() - t0) / args.reps)
    what = "CPU time, 1 thread" if args.threads == 1 else f"wall time, {args.threads} threads"
    print(f"{args.rows} x {args.qtype} products, {what}, median of {args.rounds} rounds:")
    for v in variants:
        total_t = total_f = 0.0
        for i, (r, c) in enumerate(SHAPES):
            t = statistics.median(times[(v, i)][1:])
            f = 2.0 * args.rows * r * c
            total_t, total_f = total_t + t, total_f + f
            print(f"  {v:7s} [{r:5d}, {c:5d}] {t * 1e3:7.3f} ms {f / t / 1e9:6.1f} GFLOP/s")
        rate = total_f / total_t / 1e9
        peak = args.peak * args.threads * (1.0 if v == "avx512" else 0.5)
        print(f"  {v:7s} layer     {total_t * 1e3:7.3f} ms {rate:6.1f} GFLOP/s, {100 * rate / peak:.0f}% of {peak:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
