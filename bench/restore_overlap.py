"""Time a disk hit's restore and the new message's forward, one after the other and overlapped.

Usage (from the repo root):

    .venv/bin/python bench/restore_overlap.py --rounds 15
    .venv/bin/python bench/restore_overlap.py --tokens 4096 --rounds 21 --page-cache hot

One process: a session of `--tokens` tokens of the repo's corpus is saved once to a payload
file (in a temporary directory), then each round times, alternating:
- sequential: `load_payload`, then `prefill` of the message (what a hit did before the
  overlap);
- overlapped: `load_payload_ahead` (the message's first chunk runs while the rows are read,
  docs/llama-engine.md "Hot path"), then `prefill` (which takes that chunk as done);
- the forward alone: `prefill` of the message after a restore, timed by itself.
With `--page-cache cold` (the default) the file is evicted from the page cache before every
restore (fsync + POSIX_FADV_DONTNEED, as `ds4tui bench cache` does). Prints the medians and
every round's figure (a shared machine shows its busy spells there). The message is the one
`ds4tui bench cache` sends, in the model's chat template.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens restored")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--page-cache", choices=("cold", "hot"), default="cold",
                    help="evict the file before each restore (cold) or leave it cached (hot)")
    ap.add_argument("--kv", choices=("f16", "f32"), default="f16")
    args = ap.parse_args()

    from ds4tui.bench import page_cache as pc
    from ds4tui.bench.cache_bench import FOLLOW_UP, _first_message
    from ds4tui.chat.next_turn import opening
    from ds4tui.engine.loader import load_model

    model = load_model(args.model)
    ctx = args.tokens + 512
    ids = model.tokenizer.encode(_first_message(model, args.tokens))[:args.tokens]
    before = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    head = opening(model.chat, before)  # the session holds the next turn's opening (chat/next_turn.py)
    whole = model.chat.render(before + [{"role": "user", "content": FOLLOW_UP}], add_generation_prompt=True)
    message = model.tokenizer.encode(whole[len(head):])  # as the follow-up's turn tokenizes it
    model.warm_up(ctx, kv_dtype=args.kv)
    session = model.new_session(ctx, kv_dtype=args.kv)
    with tempfile.TemporaryDirectory(prefix="ds4tui-restore-overlap-") as tmp:
        path = Path(tmp) / "payload.bin"
        session.prefill(ids)
        with open(path, "wb") as fp:
            session.save_payload(fp)
        size = path.stat().st_size

        def restore(ahead: bool) -> float:
            if args.page_cache == "cold":
                pc.evict(path)
            else:
                pc.warm(path)
            with open(path, "rb") as fp:
                t0 = time.perf_counter()
                if ahead:
                    session.load_payload_ahead(fp, size, message)
                else:
                    session.load_payload(fp, size)
                session.prefill(message)
                return (time.perf_counter() - t0) * 1000.0

        def forward_alone() -> float:
            with open(path, "rb") as fp:
                session.load_payload(fp, size)
            t0 = time.perf_counter()
            session.prefill(message)
            return (time.perf_counter() - t0) * 1000.0

        rows: dict[str, list[float]] = {"sequential": [], "overlapped": [], "forward alone": []}
        for _ in range(args.rounds):
            rows["sequential"].append(restore(False))
            rows["overlapped"].append(restore(True))
            rows["forward alone"].append(forward_alone())
    print(f"{args.model}: {args.tokens} tokens restored ({size / 1e6:.1f} MB, {args.kv} K/V), "
          f"a {len(message)}-token message; page cache {args.page_cache}; {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f}")
    for name, values in rows.items():
        print(f"{name:14} median {statistics.median(values):7.1f} ms   " + " ".join(f"{v:.0f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
