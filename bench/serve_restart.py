"""Turn 7 of an old conversation after `ds4tui serve` restarts: graceful (SIGTERM) vs kill -9.

    PYTHONPATH=. python bench/serve_restart.py [--model smollm2-135m-instruct] [--turns 6]
        [--interval 10000,2048] [--align 2048] [--json]

For each case a fresh cache directory and server: one client holds a conversation of
`--turns` turns (a ~300-token message each, 32-token greedy replies, the whole history
resent each time as OpenAI clients do), the server is stopped (SIGTERM: it saves every live
session with reason `shutdown`; SIGKILL: nothing more is written), started again on the same
directory, and the client sends its next turn. Printed: that request's TTFT (client side,
first text chunk), its prompt and cached tokens, and so what the stop lost. With kill -9 the
restart finds only the checkpoints written as the conversation grew: the first prompt's
`cold` one and a `continued` one at every `--interval` tokens (config
`continued_interval_tokens`, rounded up to `checkpoint_align_tokens`, 2048; ds4's
default 10,000 -> 10,240), so it loses at most one interval; each interval given is a case.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ds4tui.bench.server_process import start_server  # noqa: E402
from ds4tui.bench.shared_prefix_bench import _ask  # noqa: E402

MESSAGE = ("Turn {n}: here is the next part of the harbour log. The tide came in at dawn, the boats went "
           "out past the old stone quay, the keeper counted the lanterns and wrote down the wind. ") * 6


def _conversation(http, root: str, turns: int, max_tokens: int) -> list[dict]:
    messages: list[dict] = []
    for n in range(turns):
        messages.append({"role": "user", "content": MESSAGE.format(n=n + 1)})
        r = _ask(http, root, messages, max_tokens)
        messages.append({"role": "assistant", "content": r["text"]})
    return messages


def run_case(model: str, interval: int, stop: str, turns: int, max_tokens: int, align: int = 2048) -> dict:
    import httpx

    with tempfile.TemporaryDirectory(prefix="ds4tui-bench-restart-") as tmp:
        config = os.path.join(tmp, "config.toml")
        with open(config, "w") as fp:
            fp.write(f"continued_interval_tokens = {interval}\ncheckpoint_align_tokens = {align}\n")
        os.environ["DS4TUI_CONFIG"] = config
        args = SimpleNamespace(model=model, live_sessions=4)
        cache = os.path.join(tmp, "kv")
        proc, root = start_server(args, cache, disk=True)
        try:
            with httpx.Client(timeout=1800) as http:
                messages = _conversation(http, root, turns, max_tokens)
        finally:
            proc.send_signal(signal.SIGTERM if stop == "graceful" else signal.SIGKILL)
            proc.wait(timeout=120)
        files = sorted(n for n in os.listdir(cache) if n.endswith(".kv")) if os.path.isdir(cache) else []
        started = time.perf_counter()
        proc, root = start_server(args, cache, disk=True)
        start_s = time.perf_counter() - started
        try:
            with httpx.Client(timeout=1800) as http:
                messages.append({"role": "user", "content": MESSAGE.format(n=turns + 1)})
                r = _ask(http, root, messages, max_tokens)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    return {"stop": stop, "interval": interval, "turn": turns + 1, "files_before_restart": len(files),
            "server_start_s": start_s, **{k: v for k, v in r.items() if k != "text"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--turns", type=int, default=6, help="turns before the restart (default 6: turn 7 is timed)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--interval", default="10000,2048", help="continued_interval_tokens values (default 10000,2048)")
    ap.add_argument("--align", type=int, default=2048, help="checkpoint_align_tokens (default 2048, ds4's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for interval in [int(x) for x in args.interval.split(",")]:
        for stop in ("graceful", "kill -9"):
            rows.append(run_case(args.model, interval, stop, args.turns, args.max_tokens, args.align))
            if not args.json:
                r = rows[-1]
                print(f"interval {r['interval']:>6}  {r['stop']:<9} turn {r['turn']}: TTFT {r['ttft_ms']:>8.0f} ms,"
                      f" cached {r['cached_tokens']:>5} of {r['prompt_tokens']:>5}"
                      f" (prefilled {r['prompt_tokens'] - r['cached_tokens']}), {r['files_before_restart']} .kv files,"
                      f" server start {r['server_start_s']:.1f} s", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
