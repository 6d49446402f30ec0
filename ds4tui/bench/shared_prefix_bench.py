"""`ds4tui bench serve --shared-prefix`: clients sharing a long system prompt, against `ds4tui serve`.

One server (disk cache on, in a temporary directory). The first client asks alone, cold:
its prompt is a system prompt of `--prefix-tokens` (2,000) tokens and a question. Then the
other `--clients` - 1 clients ask at once, each its own question after the same system
prompt; then one of those prompts is sent again as it was; then the server restarts
(SIGTERM, as a graceful stop) and one more client asks a new question. The server's
`usage.prompt_tokens_details.cached_tokens` says what each reused; TTFT is the client's,
from sending to the first text chunk.

The goals (issue 31): every request after the first reports cached_tokens >= the shared
prefix (the system turn's tokens) and a TTFT <= 1/10 of the cold one; the repeated prompt
reports all but at most one token cached. Each is printed with its verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading

QUESTIONS = (
    "What is the capital of France?",
    "Name three colours of the sea.",
    "Who keeps the harbour log, and why?",
    "When does the fish market open on Sundays?",
    "How deep is the water at the old stone quay?",
    "Which boats may moor at the north pier?",
    "What did the keeper write about the storm?",
    "How many lanterns light the harbour at night?",
    "Why is the lighthouse painted red and white?",
)


def system_prompt(tokenizer, tokens: int) -> str:
    """A deterministic system prompt of at least `tokens` tokens."""
    rules: list[str] = []
    while True:
        i = len(rules)
        rules.append(f"Rule {i}: answer politely, in two sentences, and cite harbour log entry {i * 7 + 3}.")
        if i % 5 == 4 and len(tokenizer.encode(" ".join(rules))) >= tokens:
            return " ".join(rules)


def run_shared_prefix(args: argparse.Namespace) -> int:
    """Long because it is one measurement read top to bottom: the server started, the cold
    client, the others at once, the figures, in the order they happen."""
    import httpx

    from ds4tui.bench.server_process import ask, start_server, stop_server
    from ds4tui.engine.loader import load_model

    clients = max(int(x) for x in args.clients.split(",") if x.strip())
    if clients < 2:
        raise SystemExit("--shared-prefix needs --clients >= 2 (the first one asks alone)")
    model = load_model(args.model)
    system = system_prompt(model.tokenizer, args.prefix_tokens)
    shared = len(model.tokenizer.encode(model.chat.render([{"role": "system", "content": system}],
                                                          add_generation_prompt=False)))
    questions = [QUESTIONS[i % len(QUESTIONS)] + (f" (client {i})" if i >= len(QUESTIONS) else "")
                 for i in range(clients + 1)]

    def chat(q: str) -> list[dict]:
        return [{"role": "system", "content": system}, {"role": "user", "content": q}]

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ds4tui-bench-shared-") as tmp:
        cache = os.path.join(tmp, "kv")
        proc, root = start_server(args, cache, disk=True)
        try:
            with httpx.Client(timeout=1800) as http:
                rows.append({"what": "first (cold)", **ask(http, root, chat(questions[0]), args.max_tokens)})
                results: list[dict | None] = [None] * (clients - 1)

                def client(i: int) -> None:
                    with httpx.Client(timeout=1800) as own:
                        results[i] = ask(own, root, chat(questions[i + 1]), args.max_tokens)

                threads = [threading.Thread(target=client, args=(i,)) for i in range(clients - 1)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                rows += [{"what": f"client {i + 2} (at once)", **r} for i, r in enumerate(results) if r]
                rows.append({"what": "client 2's prompt again", **ask(http, root, chat(questions[1]), args.max_tokens)})
        finally:
            stop_server(proc)
        proc, root = start_server(args, cache, disk=True)
        try:
            with httpx.Client(timeout=1800) as http:
                rows.append({"what": "after a restart", **ask(http, root, chat(questions[clients]), args.max_tokens)})
        finally:
            stop_server(proc)

    cold = rows[0]["ttft_ms"]
    for r in rows[1:]:
        r["ok_cached"] = r["cached_tokens"] >= (r["prompt_tokens"] - 1 if r["what"].endswith("again") else shared)
        r["ok_ttft"] = r["ttft_ms"] <= cold / 10
    result = {"model": args.model, "clients": clients, "shared_prefix_tokens": shared,
              "max_tokens": args.max_tokens, "live_sessions": args.live_sessions, "cold_ttft_ms": cold,
              "rows": [{k: v for k, v in r.items() if k != "text"} for r in rows],
              "all_ok": all(r["ok_cached"] and r["ok_ttft"] for r in rows[1:])}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"ds4tui bench serve --shared-prefix: {args.model}, {clients} clients, a {shared}-token system turn,"
          f" {args.max_tokens} tokens per reply, {args.live_sessions} live sessions")
    print(f"{'request':<26} {'prompt':>7} {'cached':>7} {'TTFT':>9} {'x cold':>7}  goals")
    for r in rows:
        goals = ""
        if "ok_cached" in r:
            goals = ("cached ok" if r["ok_cached"] else "CACHED LOW") + (", ttft ok" if r["ok_ttft"] else ", TTFT HIGH")
        print(f"{r['what']:<26} {r['prompt_tokens']:>7} {r['cached_tokens']:>7} {r['ttft_ms']:>7.0f}ms"
              f" {r['ttft_ms'] / cold:>7.3f}  {goals}")
    print("all goals met" if result["all_ok"] else "goals NOT all met")
    return 0
