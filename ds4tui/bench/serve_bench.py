"""`ds4tui bench serve [--model SPEC] [--clients 1,4,8] [--turns N] [--json]`: the server's cost.
(`--shared-prefix`: clients sharing a long system prompt instead, shared_prefix_bench.py.)

Throughput and time to first token (TTFT) of `ds4tui serve` with 1, 4 and 8
concurrent clients, each holding a multi-turn conversation (every request
resends the whole history, as OpenAI clients do), with the disk cache on and
off; and the same requests sent to the embedded engine directly, in this
process, through the same `StatelessChats` the server uses, one at a time in
the order the server's clients interleave them. The ratio server / embedded is
what HTTP, JSON, SSE and the queue add.

The server runs in a subprocess on a free loopback port with few live sessions
(`--live-sessions`, default 2), so with more clients than that, sessions park
to disk and come back: that is where the disk cache shows. TTFT is measured by
the client, from sending the request to the first text chunk, queueing
included; the embedded TTFT has no queue (one request at a time), so compare
throughputs for the overhead and TTFT only between server rows.

Memory: after each row the server's resident set (VmRSS) and its peak so far (VmHWM) are
read from /proc/PID/status of the server process; the rows run in order on one server
per disk setting, so the last row's peak is the peak of the whole workload.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time

from ds4tui.bench.server_process import ask, process_memory, start_server, stop_server


def add_bench_command(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="ds4tui serve: throughput and TTFT at 1/4/8 clients vs the embedded engine",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--model", default="tiny-llama", help="model spec (default tiny-llama)")
    p.add_argument("--clients", default="1,4,8", help="comma-separated client counts (default 1,4,8)")
    p.add_argument("--turns", type=int, default=4, help="requests per client (default 4)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per reply (default 32)")
    p.add_argument("--live-sessions", type=int, default=2, help="the server's live sessions (default 2)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--shared-prefix", action="store_true",
                   help="instead: clients sharing a long system prompt (the largest --clients count of them;"
                        " bench/shared_prefix_bench.py)")
    p.add_argument("--prefix-tokens", type=int, default=2000,
                   help="with --shared-prefix: the system prompt's tokens (default 2000)")
    p.set_defaults(func=run_bench_serve)


def _question(client: int, turn: int) -> str:
    return (f"Client {client}, question {turn}: describe a small town by the sea, its harbour, its market "
            f"and the people who live there, in a few sentences. ") * 3


def _client(root: str, c: int, args, ttfts: list, tokens: list, order: list, lock: threading.Lock) -> None:
    import httpx

    messages: list[dict] = []
    with httpx.Client(timeout=600) as http:
        for t in range(args.turns):
            messages.append({"role": "user", "content": _question(c, t)})
            got = ask(http, root, messages, args.max_tokens)
            with lock:
                ttfts.append(got["ttft_ms"])
                tokens.append(got["completion_tokens"])
                order.append((c, [dict(m) for m in messages]))
            messages.append({"role": "assistant", "content": got["text"]})


def _server_run(root: str, clients: int, args) -> dict:
    ttfts: list = []
    tokens: list = []
    order: list = []
    lock = threading.Lock()
    threads = [threading.Thread(target=_client, args=(root, c, args, ttfts, tokens, order, lock))
               for c in range(clients)]
    started = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - started
    return {"wall_s": wall, "tokens": sum(tokens), "tok_s": sum(tokens) / wall,
            "ttft_ms": statistics.median(ttfts), "ttft_p90_ms": _p90(ttfts), "order": order}


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def _embedded_run(chats, order: list, args) -> dict:
    """The server's requests, in the order it answered them, straight into StatelessChats."""
    from ds4tui.chat.events import TokenText
    from ds4tui.chat.turn import TurnOptions
    from ds4tui.engine.sampling import SamplingParams

    options = TurnOptions(sampling=SamplingParams(temperature=0.0), max_tokens=args.max_tokens)
    ttfts, tokens = [], 0
    started = time.perf_counter()
    for _client, messages in order:
        sent = time.perf_counter()
        first: list[float] = []

        def on_event(e, first=first):
            if isinstance(e, TokenText) and e.text and not first:
                first.append(time.perf_counter())

        c = chats.complete(messages, on_event, options)
        tokens += c.done.tokens if c is not None else 0
        ttfts.append(((first[0] if first else time.perf_counter()) - sent) * 1000.0)
    wall = time.perf_counter() - started
    return {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall, "ttft_ms": statistics.median(ttfts),
            "ttft_p90_ms": _p90(ttfts)}


def run_bench_serve(args: argparse.Namespace) -> int:
    from ds4tui.chat.controller import ChatController
    from ds4tui.chat.stateless import StatelessChats
    from ds4tui.config import Config
    from ds4tui.engine.loader import load_model

    if args.shared_prefix:
        from ds4tui.bench.shared_prefix_bench import run_shared_prefix

        return run_shared_prefix(args)
    counts = [int(x) for x in args.clients.split(",") if x.strip()]
    model = load_model(args.model)
    rows = []
    for disk in (True, False):
        with tempfile.TemporaryDirectory(prefix="ds4tui-bench-serve-") as tmp:
            proc, root = start_server(args, os.path.join(tmp, "server"), disk)
            try:
                for n in counts:
                    server = _server_run(root, n, args)
                    server["memory"] = process_memory(proc.pid)
                    ctl = ChatController(model, Config(model=args.model, cache_dir=os.path.join(tmp, f"emb{n}"),
                                                       no_disk_cache=not disk, live_sessions=args.live_sessions))
                    ctl.warm_up()
                    embedded = _embedded_run(StatelessChats(ctl), server.pop("order"), args)
                    ctl.shutdown()
                    rows.append({"disk_cache": disk, "clients": n, "server": server, "embedded": embedded,
                                 "overhead": embedded["tok_s"] / server["tok_s"] if server["tok_s"] else None})
            finally:
                stop_server(proc)
    if args.json:
        print(json.dumps({"model": args.model, "turns": args.turns, "max_tokens": args.max_tokens,
                          "live_sessions": args.live_sessions, "rows": rows}, indent=2))
        return 0
    print(f"ds4tui bench serve: {args.model}, {args.turns} turns per client, {args.max_tokens} tokens per reply,"
          f" {args.live_sessions} live sessions")
    print(f"{'disk':>5} {'clients':>7} {'server tok/s':>12} {'TTFT p50':>9} {'TTFT p90':>9}"
          f" {'embedded tok/s':>14} {'emb TTFT':>9} {'server/emb time':>15} {'RSS MB':>7} {'peak MB':>7}")
    for r in rows:
        s, e = r["server"], r["embedded"]
        print(f"{'on' if r['disk_cache'] else 'off':>5} {r['clients']:>7} {s['tok_s']:>12.1f} {s['ttft_ms']:>7.0f}ms"
              f" {s['ttft_p90_ms']:>7.0f}ms {e['tok_s']:>14.1f} {e['ttft_ms']:>7.0f}ms {s['wall_s'] / e['wall_s']:>14.2f}x"
              f" {s['memory']['VmRSS'] / 1e6:>7.0f} {s['memory']['VmHWM'] / 1e6:>7.0f}")
    return 0
