"""Project DeepSeek V4 Flash decode speed from a true-shape slice to 43 layers and to machines.

Usage:
  python -m ds4tui.engine.dsv4.slice --layers 2 --out /tmp/v4slice.gguf
  ds4tui bench engine --model /tmp/v4slice.gguf --prompt-tokens 16 --decode-tokens 8 --repeats 1 --json > /tmp/b.json
  python bench/dsv4_projection.py /tmp/b.json [--cores 2]

Method (docs/perf.md, "DeepSeek V4 Flash, projected"):
- bytes a decode token reads, per layer kind, from the 43-layer plan of ds4's Q2 file
  (engine/dsv4/slice.py: the same tensors and types): every dense tensor of the layer (a
  hash layer's tid2eid only its token's row), 6 routed experts (gate, up, down rows), the
  output head and one embedding row;
- our kernels' cost per byte, from the slice's per-layer decode CPU time (all threads: a busy
  machine stretches wall time, not CPU time) and the bytes the same layers read (bench
  engine's DSV4 section); the head's from its wall time scaled by the layers' CPU/wall ratio;
- projected time per token on a machine = max(bytes / its memory bandwidth [the roofline],
  CPU seconds per byte x bytes / its cores [compute, assuming the work spreads over the
  cores as the GEMV row chunks do], 43 x the forward's serial time per layer [Python]);
  this machine's row is the wall time measured.
This machine's bandwidth is measured here (a 1 GiB float32 sum, torch, all threads).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds4tui.engine.dsv4 import gguf_layout as L  # noqa: E402
from ds4tui.engine.dsv4.slice import slice_config, slice_plan  # noqa: E402

# (name, memory bandwidth GB/s peak, cores) of the machines in the table
MACHINES = (
    ("12-channel DDR5-4800 server (EPYC 9004, 1 socket, 64 cores)", 460.8, 64),
    ("128 GB laptop, dual-channel DDR5-5600 (16 cores)", 89.6, 16),
)
STREAM_SHARE = 0.75  # of peak a read stream reaches in practice (STREAM on such machines: 70-80%)
# The forward's serial part per layer (Python and small torch ops around the kernels): tiny-dsv4
# decodes 90.9 tok/s with 6 layers on a quiet 2-core box (docs/perf.md), 1.8 ms a layer, and
# more cores do not shrink it.
SERIAL_S_PER_LAYER = 1.8e-3


def layer_kinds(n_layers: int = 43) -> dict[int, int]:
    """Per layer, the bytes one decode token reads (dense + 6 experts), from the plan."""
    cfg = slice_config(n_layers)
    by_layer: dict[int, int] = {}
    unit = 0
    for t in slice_plan(cfg):
        if not t.name.startswith("blk."):
            continue
        li = int(t.name.split(".")[1])
        if t.name.endswith(tuple(L.EXPERTS.values())):
            part = t.nbytes // cfg.n_routed_experts
            if li == 0:
                unit += part
            continue
        size = t.row_bytes if t.name.endswith("tid2eid.weight") else t.nbytes  # one token's row
        by_layer[li] = by_layer.get(li, 0) + size
    return {li: b + cfg.num_experts_per_tok * unit for li, b in by_layer.items()}


def head_bytes() -> int:
    plan = {t.name: t for t in slice_plan(slice_config(1))}
    return (plan["output.weight"].nbytes + plan["output_hc_fn.weight"].nbytes + plan["output_hc_base.weight"].nbytes
            + plan["output_hc_scale.weight"].nbytes + plan["output_norm.weight"].nbytes + plan["token_embd.weight"].row_bytes)


def measure_bandwidth() -> float:
    import torch

    x = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB
    x.sum()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json", type=Path, help="ds4tui bench engine --json output on a slice")
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="cores the bench ran on (default: this machine's)")
    args = ap.parse_args(argv)
    b = json.loads(args.bench_json.read_text())["dsv4"]
    per_layer = layer_kinds()
    total = sum(per_layer.values()) + head_bytes()
    # this machine's cost per byte: the slice's layers, measured (compute + memory as they ran)
    layer_bytes = [d + e * b["expert_unit_bytes"] for d, e in zip(b["dense_bytes"], b["experts_per_token"])]
    wall, cpu = sum(b["decode_ms"]) / 1e3, sum(b["decode_cpu_ms"]) / 1e3
    cpu_per_byte = cpu / sum(layer_bytes)
    head_cpu_per_byte = b["head_ms"] / 1e3 * (cpu / wall) / b["head_bytes"]
    bw_here = measure_bandwidth()
    print(f"43-layer decode token reads {total / 1e9:.2f} GB ({sum(per_layer.values()) / 1e9:.2f} GB in layers, "
          f"{head_bytes() / 1e9:.2f} GB head). Slice: {sum(layer_bytes) / 1e9:.3f} GB in its layers, "
          f"{wall * 1e3:.0f} ms wall, {cpu * 1e3:.0f} ms CPU = {sum(layer_bytes) / 1e9 / cpu:.2f} GB per CPU-second; "
          f"head {b['head_bytes'] / 1e9:.3f} GB in {b['head_ms']:.0f} ms wall")
    print()
    print("| machine | memory bandwidth | roofline (bytes / bandwidth) | projected ds4tui | bound by |")
    print("|---|---:|---:|---:|---|")
    here_s = (sum(per_layer.values()) * wall / sum(layer_bytes) + head_bytes() * b["head_ms"] / 1e3 / b["head_bytes"])
    rows = [(f"this machine ({args.cores} cores, measured wall time)", bw_here, None, here_s)]
    rows += [(name, peak * STREAM_SHARE, cores, None) for name, peak, cores in MACHINES]
    for name, bw, cores, measured_s in rows:
        roof = total / (bw * 1e9)
        if measured_s is not None:
            t, kind = measured_s, "compute (our kernels), busy machine" if measured_s > roof else "memory"
        else:
            compute = (sum(per_layer.values()) * cpu_per_byte + head_bytes() * head_cpu_per_byte) / cores
            serial = SERIAL_S_PER_LAYER * len(per_layer)
            t = max(roof, compute, serial)
            kind = ("memory" if t == roof else "compute (our kernels)" if t == compute
                    else "the forward's serial Python part")
        bw_txt = f"{bw:.1f} GB/s" + (" measured" if cores is None else f" ({STREAM_SHARE:.0%} of peak)")
        print(f"| {name} | {bw_txt} | {1 / roof:.2f} tok/s ({roof * 1e3:.0f} ms) | {1 / t:.2f} tok/s ({t * 1e3:.0f} ms) | {kind} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
