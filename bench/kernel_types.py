"""GEMV speed of the C kernels per weight type and per ISA variant, in one process.

Usage (from the repo root):

    .venv/bin/python bench/kernel_types.py [--threads 1] [--rounds 15] [--json]
        [--types q2_k,iq2_xxs] [--shapes ffn,head,v4-gate,v4-down]

For every type of `ds4tui.engine.kernels.quants` and every variant this CPU runs, it times
y = W x on two shapes: a SmolLM2 FFN matrix ([3072, 576], 2 MB or less: cache-resident,
so it shows the compute cost per weight) and a head-sized one ([49152, 576]: streams from
DRAM, so it shows bandwidth). The variants alternate inside each round and each figure is
the best round (other processes only ever slow a round down, so on a shared machine the
best is the closer estimate of an idle one). Reports ns per 1000 weights and GB/s of blocks
read. K-quants need rows of whole 256-blocks, so their shapes use 512 columns.
`--shapes v4-gate,v4-down` times one routed expert of DeepSeek V4 Flash instead (gate or up
[2048, 4096], down [4096, 2048]: what MoE decode reads per selected expert), `--types`
restricts the types (e.g. ds4's expert types q2_k,iq2_xxs,q4_k).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", action="store_true")
    p.add_argument("--types", default="", help="comma-separated types (default: f32 and every block type)")
    p.add_argument("--shapes", default="ffn,head", help="comma-separated: ffn, head, v4-gate, v4-down")
    args = p.parse_args()

    import torch

    from ds4tui.engine.kernels import qgemv, quants
    from tests.engine.kernels.test_kernels import random_blocks

    torch.set_num_threads(args.threads)
    variants = qgemv.variants()
    if not variants:
        print(f"no C kernels here: {qgemv.backend_reason()}", file=sys.stderr)
        return 1
    known = {"ffn": ("ffn [3072, 576]", (3072, 576)), "head": ("head [49152, 576]", (49152, 576)),
             "v4-gate": ("V4 Flash expert gate/up [2048, 4096]", (2048, 4096)),
             "v4-down": ("V4 Flash expert down [4096, 2048]", (4096, 2048))}
    try:
        shapes = dict(known[k.strip()] for k in args.shapes.split(",") if k.strip())
    except KeyError as exc:
        p.error(f"unknown shape {exc} (have {', '.join(known)})")
    types = [t.strip() for t in args.types.split(",") if t.strip()] or ["f32", *quants.BLOCK_TYPES]
    if any(t not in quants.TYPES for t in types):
        p.error(f"--types: one of {', '.join(quants.TYPES)}")
    results = []
    for shape_name, (rows, cols) in shapes.items():
        for qtype in types:
            c = cols if cols % quants.TYPES[qtype][1] == 0 else 512
            m = qgemv.QuantMatrix(random_blocks(qtype, rows, c, seed=1), qtype, c)
            x = torch.randn(c)
            reps = max(1, int(4e7 // (rows * c)))
            best = {v: float("inf") for v in variants}
            for _ in range(args.rounds):
                for v in variants:
                    with qgemv.use_variant(v):
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            m.matvec(x)
                        best[v] = min(best[v], (time.perf_counter() - t0) / reps)
            for v, t in best.items():
                results.append({"shape": shape_name, "type": qtype, "variant": v, "cols": c,
                                "ns_per_kweight": round(t * 1e12 / (rows * c), 1),
                                "gb_s": round(m.nbytes / t / 1e9, 1)})
    if args.json:
        print(json.dumps({"threads": args.threads, "rounds": args.rounds, "cpu": platform.processor(),
                          "cpus": os.cpu_count(), "results": results}))
        return 0
    print(f"{args.threads} thread(s), best of {args.rounds} alternating rounds; ns per 1000 weights (GB/s of blocks)")
    for shape_name in shapes:
        print(f"\n{shape_name}\n| type | " + " | ".join(variants) + " |")
        print("|---|" + "---:|" * len(variants))
        for qtype in types:
            row = [r for r in results if r["shape"] == shape_name and r["type"] == qtype]
            cells = [f"{r['ns_per_kweight']} ({r['gb_s']})" for r in row]
            print(f"| {qtype} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
