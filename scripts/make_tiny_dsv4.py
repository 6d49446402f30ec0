"""Write the tiny DeepSeek V4 checkpoint (seeded random weights; see ds4tui/engine/dsv4/tiny.py).

    python scripts/make_tiny_dsv4.py                 # build models/tiny-dsv4 once, print its path
    python scripts/make_tiny_dsv4.py --out DIR [--names hf] [--fp8] [--seed N]

With --out, writes a copy into DIR: official tensor names with FP4 experts (the
default), HF module names (--names hf), or FP8 block-scaled attention matrices (--fp8).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ds4tui.engine.dsv4.tiny import SEED, ensure_tiny_dsv4, random_tensors, tiny_config, write_checkpoint


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="write a copy here instead of the models directory")
    p.add_argument("--names", choices=("official", "hf"), default="official")
    p.add_argument("--fp8", action="store_true", help="store attention/shared-expert matrices as FP8")
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args()
    if args.out is None:
        print(ensure_tiny_dsv4())
        return 0
    print(write_checkpoint(args.out, random_tensors(tiny_config(), args.seed), names=args.names, fp8=args.fp8))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
