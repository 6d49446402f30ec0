"""Time the chunk attention kernel (kernels/attn.c) alone, as a forward calls it.

Usage (from the repo root):

    .venv/bin/python bench/attn_kernel.py --threads 1 --cpu
    .venv/bin/python bench/attn_kernel.py --shape 23@4073 --heads 4/1 --head-dim 256

For each shape S@POS (S queries at positions POS..POS+S-1 over every key before them, a
global layer's causal attention) one call per layer over that layer's own K/V rows, so a
deep context's rows come from memory as in a real forward (one layer's rows would stay in
cache). Random rows and queries (the cost does not depend on their values). Prints the
median time of all layers' calls and the GFLOP/s it means (QK and PV, 4 FLOP per query head,
key and dimension). Defaults: SmolLM2-135M's 9 query / 3 KV heads of 64, 30 layers, f16 K/V.
`--cpu` times process CPU time (with `--threads 1`: what other jobs on a shared machine do
not inflate) instead of wall time.
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
    ap.add_argument("--shape", action="append", help="S@POS (repeatable); default 23@4073, 1@4095, 512@0, 512@3584")
    ap.add_argument("--heads", default="9/3", help="query heads / KV heads")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--kv", choices=("f16", "f32"), default="f16")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="process CPU time instead of wall time")
    args = ap.parse_args()

    import torch

    from ds4tui.engine.kernels import attn, qgemv

    if not attn.available():
        print("the C kernels are not available (torch backend)")
        return 1
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu else time.perf_counter
    hq, hkv = (int(x) for x in args.heads.split("/"))
    d = args.head_dim
    shapes = [tuple(int(x) for x in sh.split("@")) for sh in (args.shape or ["23@4073", "1@4095", "512@0", "512@3584"])]
    dtype = torch.float16 if args.kv == "f16" else torch.float32
    rows = max(pos + s for s, pos in shapes)
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(args.layers, 2, hkv, rows, d, generator=g).to(dtype)
    what = "CPU" if args.cpu else "wall"
    print(f"attn.c ({qgemv.backend()}), {hq}/{hkv} heads of {d}, {args.layers} layers, {args.kv} K/V, "
          f"{args.threads} threads, {what} time, median of {args.runs}:")
    for s, pos in shapes:
        q = torch.randn(s, hq, d, generator=g)
        end = pos + s

        def forward_attention() -> None:
            for layer in range(args.layers):
                attn.attend(q, kv[layer, 0], kv[layer, 1], qpos=pos, kbase=end, scale=d ** -0.5)

        forward_attention()  # warm-up
        times = []
        for _ in range(args.runs):
            t0 = clock()
            forward_attention()
            times.append(clock() - t0)
        t = statistics.median(times)
        flop = 4 * hq * d * sum(pos + i + 1 for i in range(s)) * args.layers
        print(f"  {s:4d} queries at {pos:5d}: {t * 1e3:8.2f} ms ({t * 1e3 / args.layers:6.3f} per layer), "
              f"{flop / t / 1e9:6.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
