"""A/B of two builds of the C kernels on one loaded model, forwards alternating in one process.

Usage (from the repo root):

    .venv/bin/python bench/kernel_ab.py --other ../main [--tokens 512] [--threads 2] [--rounds 15]
        [--cpu] [--quiet 0.15]

Compiles the kernel sources of another checkout (`--other`, its ds4tui/engine/kernels) next
to this one's, loads both libraries and times a forward of --tokens tokens at position 0
with each in turn (A = the other checkout, B = this one; the order flips every round), on
the same model, session and Python code: only the C kernels differ. Whatever load other
processes put on a shared machine falls on both sides alike, which separate runs minutes
apart cannot promise. `--quiet F` waits before each pair until the machine's busy share
over one second is below F. Reports the median and best of each side, in tok/s and in
GFLOP/s by docs/perf-archive.md's count for SmolLM2 (114.5 GFLOP per 512-token chunk at position
0; other models and lengths print times only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI sets it (docs/perf-archive.md)

SMOLLM2_512_GFLOP = 114.5  # docs/perf-archive.md, "One forward, by part": the work the forward does


def busy_share(seconds: float) -> float:
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", required=True, help="the other checkout's root (side A)")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cpu", action="store_true", help="process CPU time instead of wall time")
    p.add_argument("--quiet", type=float, default=0.0, help="wait for a busy share below this before each pair")
    args = p.parse_args()

    import torch

    from ds4tui.engine.kernels import build, qgemv
    from ds4tui.engine.loader import load_model

    if qgemv.library() is None:
        print(f"no C kernels: {qgemv.backend_reason()}")
        return 1
    cc = build.find_compiler()
    if cc is None:
        print("no C compiler: the other checkout's kernels cannot be built")
        return 1
    other_lib = Path(tempfile.mkdtemp(prefix="ds4tui-kernel-ab-")) / build.LIB_NAME
    build.compile_library(cc, other_lib, Path(args.other).resolve() / "ds4tui" / "engine" / "kernels")
    other = qgemv._load(other_lib)
    # Both sides get this thread's configuration word on every call (qgemv.config()): the same
    # variant and bf16 choice (DS4TUI_KERNELS and DS4TUI_BF16 apply to both). The other
    # checkout must have this one's ABI (qgemv._load checks it).
    libs = {"A": other, "B": qgemv.library()}

    torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu else time.perf_counter
    model = load_model(args.model)
    session = model.new_session(max(4096, args.tokens + 1))
    tokens = torch.randint(0, model.cfg.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    times: dict[str, list[float]] = {"A": [], "B": []}
    try:
        with torch.inference_mode():
            for r in range(args.rounds + 1):  # round 0 warms both up
                while args.quiet and busy_share(1.0) >= args.quiet:
                    pass
                for side in ("AB" if r % 2 else "BA"):
                    qgemv._lib = libs[side]
                    t0 = clock()
                    model.forward(session.kv, tokens, 0, True)
                    if r:
                        times[side].append(clock() - t0)
    finally:
        qgemv._lib = libs["B"]
    gflop = SMOLLM2_512_GFLOP if args.model == "smollm2-135m-instruct" and args.tokens == 512 else None
    what = "CPU time, 1 thread" if args.cpu else f"wall time, {args.threads} threads"
    print(f"{args.model}: {args.tokens} tokens at position 0, {qgemv.backend()}, {what}, {args.rounds} rounds")
    for side, name in (("A", args.other), ("B", "this checkout")):
        v = times[side]
        med = statistics.median(v)
        rate = f", {gflop / med:.0f} GFLOP/s" if gflop else ""
        print(f"  {side} ({name}): median {med * 1e3:.1f} ms ({args.tokens / med:.0f} tok/s{rate}), "
              f"best {min(v) * 1e3:.1f} ms; all: {' '.join(f'{t * 1e3:.0f}' for t in v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
