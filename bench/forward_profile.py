"""Where one llama-family forward of S tokens at position POS spends its time.

Usage (from the repo root):

    .venv/bin/python bench/forward_profile.py --model smollm2-135m-instruct --tokens 512 --pos 0
    .venv/bin/python bench/forward_profile.py --model smollm2-135m-instruct --tokens 23 --pos 4164 --cpu

The session's KV rows before POS are random (a forward's cost does not depend on their
values). Each part is timed by wrapping the forward's own functions (weight products,
attention, RoPE, RMSNorm, the gated activation, in C or torch as the checkout has them;
"other" is the rest: embedding, residual adds, K/V writes, torch activations), summed over
the forward; the run with the best total is printed. `--cpu` times
process CPU time instead of wall time: with `--threads 1` that is the time the forward
keeps one core busy, which other processes on a shared machine do not inflate. Works on
older checkouts too (parts a checkout lacks are skipped; its SDPA calls show as "sdpa").
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI sets it (docs/perf-archive.md)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=512, help="S, the chunk's tokens")
    ap.add_argument("--pos", type=int, default=0, help="the chunk's first position")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="process CPU time instead of wall time")
    args = ap.parse_args()

    import torch

    import ds4tui.engine.llama.model as M
    from ds4tui.engine.loader import load_model

    torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu else time.perf_counter
    model = load_model(args.model)
    ctx = max(4096, args.pos + args.tokens + 1)
    session = model.new_session(ctx)
    g = torch.Generator().manual_seed(0)
    for t in session.kv if isinstance(session.kv, list) else [session.kv]:
        t.copy_((torch.randn(t.shape, generator=g) * 0.5).to(t.dtype))

    acc: dict[str, float] = collections.defaultdict(float)

    def timed(name, f):
        def wrapper(*a, **k):
            t0 = clock()
            try:
                return f(*a, **k)
            finally:
                acc[name] += clock() - t0
        return wrapper

    M.Linear.__call__ = timed("weight products", M.Linear.__call__)
    for attr, label in (("attend", "attention (C)"), ("_rope", "rope"), ("_ring_write", "ring write"),
                        ("_ring_keys", "ring gather"), ("rms_norm", "rms_norm (C)"), ("qk_rope", "q/k norm+rope (C)"),
                        ("glu", "act * up (C)")):
        if hasattr(M, attr):
            setattr(M, attr, timed(label, getattr(M, attr)))
    if hasattr(M, "_TorchAttention"):
        M._TorchAttention.__call__ = timed("attention (torch)", M._TorchAttention.__call__)
    M.F.scaled_dot_product_attention = timed("sdpa", M.F.scaled_dot_product_attention)
    M.F.rms_norm = timed("rms_norm", M.F.rms_norm)

    tokens = torch.randint(0, model.cfg.vocab_size, (args.tokens,), generator=g).tolist()
    totals, parts = [], []
    with torch.inference_mode():
        for r in range(args.runs + 1):  # the first is a warm-up
            acc.clear()
            t0 = clock()
            model.forward(session.kv, tokens, args.pos, True)
            if r:
                totals.append(clock() - t0)
                parts.append(dict(acc))
    best = min(range(args.runs), key=totals.__getitem__)
    what = "CPU" if args.cpu else "wall"
    print(f"{args.model}: {args.tokens} tokens at position {args.pos}, {args.threads} threads, {what} time: "
          f"best {totals[best] * 1e3:.1f} ms, median {statistics.median(totals) * 1e3:.1f} ms of {args.runs}")
    for name, v in sorted(parts[best].items(), key=lambda kv: -kv[1]):
        print(f"  {name:18s} {v * 1e3:8.1f} ms")
    print(f"  {'other':18s} {(totals[best] - sum(parts[best].values())) * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
