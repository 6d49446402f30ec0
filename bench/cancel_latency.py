"""How long a prefill takes to stop once it is cancelled (the chat's Escape / ctrl+c).

Usage (from the repo root): .venv/bin/python bench/cancel_latency.py [--model M] [--tokens 2048] [--runs 8]

A worker thread prefills `--tokens` tokens into a fresh session; the main thread sets the
cancel flag at a random moment inside the prefill and times how long `prefill` takes to
return after that. Two ways of seeing the flag:
- "chunks": checked between prefill chunks only (`should_stop`, what the chat had: a cancel
  waited for the rest of the 512-token chunk);
- "layers": also between the layers of a chunk (`interrupt`, what the chat does now).
Prints, per way, the median and the worst wait, and the time of one whole chunk, so that the
numbers can be read on a busy machine too (the worst "layers" wait is about one layer's share
of a chunk). Shows `grep avx /proc/cpuinfo`'s flags for the record.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_flags() -> str:
    try:
        words = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "?"
    return " ".join(sorted({w for w in words if w.startswith("avx")}))


def one_run(model, tokens: list[int], ctx: int, layers: bool, delay: float) -> tuple[float, int]:
    """(seconds from the cancel to prefill's return, tokens kept)."""
    session = model.new_session(ctx)
    flag = threading.Event()
    ended = {}

    def work() -> None:
        if layers:
            session.prefill(tokens, should_stop=flag.is_set, interrupt=flag.is_set)
        else:
            session.prefill(tokens, should_stop=flag.is_set)
        ended["at"] = time.perf_counter()

    worker = threading.Thread(target=work)
    worker.start()
    time.sleep(delay)
    cancelled_at = time.perf_counter()
    flag.set()
    worker.join()
    return ended["at"] - cancelled_at, len(session.tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    import torch

    from ds4tui.engine.loader import load_model

    model = load_model(args.model)
    model.warm_up(args.tokens + 64)
    rng = random.Random(args.seed)
    vocab = model.info.vocab_size if hasattr(model.info, "vocab_size") else 1000
    tokens = [rng.randrange(10, min(vocab, 30000)) for _ in range(args.tokens)]
    probe = model.new_session(args.tokens + 64)
    chunk = probe.chunk_size
    t0 = time.perf_counter()
    probe.prefill(tokens[:chunk])
    chunk_s = time.perf_counter() - t0
    print(f"{args.model}: {args.tokens} tokens, chunk {chunk} tokens takes {chunk_s:.2f} s here, "
          f"{torch.get_num_threads()} threads, CPU: {cpu_flags()}")
    for layers in (False, True):
        waits = []
        for _ in range(args.runs):
            # Somewhere in the first three quarters of the prefill (in a chunk, not at its end).
            delay = rng.uniform(0.1, 0.75) * chunk_s * max(1, args.tokens // chunk)
            wait, kept = one_run(model, tokens, args.tokens + 64, layers, delay)
            waits.append(wait)
        name = "layers" if layers else "chunks"
        print(f"  cancel checked between {name:6}: median {statistics.median(waits) * 1e3:7.1f} ms,"
              f" worst {max(waits) * 1e3:7.1f} ms over {args.runs} cancels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
