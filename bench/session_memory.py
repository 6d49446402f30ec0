"""Memory of one long session: resident set and KV bytes, ring layers against full ones.

Usage (from the repo root): .venv/bin/python bench/session_memory.py [--model gemma3-270m] [--tokens 4096]

Loads the model, prefills `--tokens` token ids (a fixed pseudo-random sequence: memory does
not depend on the text) into a session of that context, and prints the process's resident
set (/proc/self/statm) after the load and after the prefill, the session's KV bytes (sliding
layers keep a ring of their window) next to what the same session would hold with every
layer full, and the payload a save would write under each storage policy.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def resident_mb() -> float:
    with open("/proc/self/statm") as fp:
        pages = int(fp.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args()
    import torch

    from ds4tui.engine.loader import load_model

    model = load_model(args.model)
    cfg = model.cfg
    after_load = resident_mb()
    session = model.new_session(args.tokens + 1)
    rng = random.Random(0)
    ids = [rng.randrange(10, cfg.vocab_size) for _ in range(args.tokens)]
    t0 = time.perf_counter()
    with torch.inference_mode():
        session.prefill(ids)
    prefill_s = time.perf_counter() - t0
    after_prefill = resident_mb()
    ring_kv = session.kv_bytes
    row_bytes = 2 * cfg.num_kv_heads * cfg.head_dim * session.kv[0].element_size()
    full_kv = cfg.num_layers * (args.tokens + 1) * row_bytes
    print(f"{args.model}: {cfg.num_layers} layers ({len(cfg.sliding_layers)} sliding, window "
          f"{cfg.sliding_window}), {args.tokens} tokens prefilled in {prefill_s:.1f} s, KV {session.kv_dtype}")
    print(f"resident set   {after_load:,.0f} MB after load, {after_prefill:,.0f} MB after the prefill")
    print(f"KV bytes       {ring_kv / 1e6:,.1f} MB (sliding layers as rings) vs {full_kv / 1e6:,.1f} MB with every layer full")
    for policy in ("full", "periodic:1024", "zero"):
        if session.set_storage_policy(policy):
            print(f"payload        {session.payload_bytes() / 1e6:,.1f} MB under {policy}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
