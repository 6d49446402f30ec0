"""Time to resume a second saved chat after the first one's reply: the cost of its KV buffers.

Usage (from the repo root):

    .venv/bin/python bench/second_chat.py --make DIR      # two titled 4K-token chats in DIR
    .venv/bin/python bench/second_chat.py DIR [--rounds 3]

Each round is a fresh process, as the app is: load the model, `ChatController.warm_up()`,
resume the first chat (it adopts warm_up's spare buffer), send one message, wait a second
(the user reading the reply), then resume the second chat, timed. Before recycled and
prepared buffers (docs/perf-archive.md, "Recycled and prepared KV buffers") the second chat's
session was fresh memory and its restore paid the page faults of the whole buffer.
To compare builds, run a checkout's copy of this script with that checkout first on
sys.path (PYTHONPATH=checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not os.environ.get("PYTHONPATH"):  # else the checkout it names comes first, as Python puts it
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI sets it (docs/perf-archive.md)

MODEL = "smollm2-135m-instruct"
CTX = 4608


def _controller(cache_dir: str):
    from ds4tui.chat.controller import ChatController
    from ds4tui.config import Config
    from ds4tui.engine.loader import load_model

    model = load_model(MODEL)
    config = Config(model=MODEL, cache_dir=cache_dir, ctx=CTX, temperature=0.0, max_tokens=8, budget_mb=1 << 20)
    return ChatController(model, config)


def make(cache_dir: str) -> None:
    from ds4tui.bench.cache_bench import _first_message

    ctl = _controller(cache_dir)
    for topic in ("first", "second"):
        conv = ctl.new_conversation()
        ctl.send(conv.key, f"The {topic} chat. " + _first_message(ctl.model, 4000), lambda e: None)
    ctl.shutdown()


def one_round(cache_dir: str) -> dict:
    ctl = _controller(cache_dir)
    ctl.warm_up()
    first, second = sorted(ctl.saved_sessions(), key=lambda s: s.title)[:2]
    t0 = time.perf_counter()
    conv = ctl.resume(first.sha)
    first_ms = (time.perf_counter() - t0) * 1000.0
    ctl.send(conv.key, "Thanks. In one word?", lambda e: None)
    time.sleep(1.0)
    t0 = time.perf_counter()
    ctl.resume(second.sha)
    return {"first_resume_ms": first_ms, "second_resume_ms": (time.perf_counter() - t0) * 1000.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="cache directory holding the two chats")
    ap.add_argument("--make", action="store_true", help="write the two chats into DIR and stop")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a round, in this process
    args = ap.parse_args()
    if args.make:
        make(args.dir)
        return 0
    if args.one:
        print(json.dumps(one_round(args.dir)))
        return 0
    rows = []
    for _ in range(args.rounds):
        out = subprocess.run([sys.executable, __file__, args.dir, "--one"], capture_output=True, text=True,
                             env=os.environ.copy(), check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for key in ("first_resume_ms", "second_resume_ms"):
        values = [r[key] for r in rows]
        print(f"{key:17} median {statistics.median(values):7.1f} ms   " + " ".join(f"{v:.0f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
