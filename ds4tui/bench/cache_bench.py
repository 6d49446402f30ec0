"""`ds4tui bench cache --model SPEC --tokens N [--json]`: what the disk cache buys a chat.

Owns the measurement of time to first token (TTFT) for the same conversation,
cold and from disk, each in a fresh process, exactly as a user meets them:

1. setup (this process): a chat whose first message is ~N tokens of the repo's
   corpus gets a greedy reply, then the controller shuts down, which writes
   the `shutdown` checkpoint of the whole conversation;
2. cold (fresh process, disk cache off): the next message of that
   conversation, from an empty session: the whole transcript is prefilled;
3. hit (fresh process, same cache dir): the same next message; the controller
   restores the checkpoint and prefills only the new message. This process
   then reads the same .kv file raw (page cache warm, as the restore had it).

Each side loads the model and calls `ChatController.warm_up()` before the
message, as the app's model-loading worker does (timed and reported: both pay it).
TTFT runs from `send` to the first sampled token. Goals on SmolLM2 at 4096
tokens: hit TTFT <= cold / 50 and restore <= 2 x raw read.

Restore vs raw read, like for like: the restore in the TTFT writes into the
session buffer that warm_up already touched, so it is compared with a read
into an already-touched buffer ("warm"). Both are also measured into freshly
allocated, untouched memory ("fresh": a new session, np.empty), where page
faults on first write add their cost (docs/perf.md, "First-use costs and warm_up").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ds4tui.format.display import human_bytes

GOAL_SPEEDUP = 50.0
GOAL_RESTORE_OVER_READ = 2.0
FOLLOW_UP = "Thanks. In one sentence, what was that text about?"
RAW_READ_REPEATS = 3


def add_bench_command(subparsers) -> None:
    p = subparsers.add_parser(
        "cache", help="cold vs disk-hit time to first token of one conversation",
        description=__doc__.split("\n\n")[0] + " Cold and hit run in fresh processes.",
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="model spec (default smollm2-135m-instruct)")
    p.add_argument("--tokens", type=int, default=4096, help="length of the conversation before the next message")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--cache-dir", help="cache directory to use (default: a temporary one, removed afterwards)")
    p.add_argument("--side", choices=["cold", "hit"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.set_defaults(func=run_bench_cache)


def run_bench_cache(args: argparse.Namespace) -> int:
    if args.side:
        spec = json.loads(Path(args.spec).read_text())
        print(json.dumps(_measure_side(args.side, spec)))
        return 0
    from ds4tui.cli.errors import CliError

    if args.tokens < 64:
        raise CliError("--tokens must be at least 64")
    with tempfile.TemporaryDirectory(prefix="ds4tui-bench-cache-") as tmp:
        cache_dir = args.cache_dir or str(Path(tmp) / "kv")
        result = _bench(args.model, args.tokens, cache_dir, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_table(result))
    return 0


def _bench(model_spec: str, tokens: int, cache_dir: str, tmp: Path) -> dict:
    from ds4tui.cli.errors import CliError
    from ds4tui.config import Config
    from ds4tui.chat.controller import ChatController
    from ds4tui.engine.loader import load_model
    from ds4tui.engine.errors import EngineError

    try:
        model = load_model(model_spec)
    except EngineError as exc:
        raise CliError(str(exc)) from None
    ctx = tokens + 512  # room for the reply and the next message
    if ctx > model.info.n_ctx:
        raise CliError(f"--tokens {tokens}: needs ctx {ctx}, {model_spec} has {model.info.n_ctx}")
    config = Config(model=model_spec, cache_dir=cache_dir, ctx=ctx, temperature=0.0, max_tokens=32,
                    budget_mb=1 << 20)
    ctl = ChatController(model, config)
    conv = ctl.new_conversation()
    first = ctl.send(conv.key, _first_message(model, tokens), lambda e: None)
    if first is None:
        raise CliError("the setup turn failed")
    ctl.shutdown()  # writes the shutdown checkpoint of the whole conversation
    spec = {"model": model_spec, "cache_dir": cache_dir, "ctx": ctx, "messages": conv.messages,
            "follow_up": FOLLOW_UP, "budget_mb": config.budget_mb}
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    cold = _run_side("cold", spec_path)
    hit = _run_side("hit", spec_path)
    if hit["source"] != "disk":
        raise CliError(f"the hit side did not restore from disk ({hit['source']}): {hit.get('miss')}")
    return {
        "model": model_spec,
        "context_tokens": first.context_tokens,
        "prompt_tokens": cold["prompt_tokens"],
        "cached_tokens": hit["cached_tokens"],
        "suffix_tokens": hit["prompt_tokens"],
        "cold_ttft_ms": cold["ttft_ms"],
        "hit_ttft_ms": hit["ttft_ms"],
        "speedup": cold["ttft_ms"] / hit["ttft_ms"] if hit["ttft_ms"] > 0 else None,
        "kv_bytes": hit["kv_bytes"],
        "restore_ms": hit["restore_ms"],
        # The rest of the hit TTFT: lookup, prefilling the suffix, sampling the first token.
        "hit_rest_ms": hit["ttft_ms"] - hit["restore_ms"],
        "raw_read_ms": hit["raw_read_ms"],
        "restore_over_read": hit["restore_ms"] / hit["raw_read_ms"] if hit["raw_read_ms"] > 0 else None,
        "restore_fresh_ms": hit["restore_fresh_ms"],
        "raw_read_fresh_ms": hit["raw_read_fresh_ms"],
        "warm_up_ms": {"cold": cold["warm_up_ms"], "hit": hit["warm_up_ms"]},
        "same_first_token": cold["first_text"] == hit["first_text"],
        "goal_speedup": GOAL_SPEEDUP,
        "goal_restore_over_read": GOAL_RESTORE_OVER_READ,
        "moves": _moves(model, model_spec, tokens, ctx),
    }


def _moves(model, model_spec: str, tokens: int, ctx: int) -> dict:
    """TTFT of each conversation move on a chat of ~`tokens` tokens (two user messages of half
    each, so an edit of the second sits at the middle), against a cold prefill of the same
    text in a fresh chat. In this process, disk cache off on both sides: what is measured is
    the live session's reuse (rewind, fork), not the disk."""
    from ds4tui.config import Config
    from ds4tui.chat.controller import ChatController

    def controller() -> ChatController:
        return ChatController(model, Config(model=model_spec, ctx=ctx, temperature=0.0, max_tokens=16,
                                            no_disk_cache=True))

    def cold(messages: list[dict], text: str) -> float:
        c = controller()
        conv = c.import_messages(messages)
        return c.send(conv.key, text, lambda e: None).ttft_ms

    ctl = controller()
    ctl.warm_up()
    conv = ctl.new_conversation()
    half = _first_message(model, tokens // 2)
    ctl.send(conv.key, half, lambda e: None)
    second = "And this:\n\n" + half
    ctl.send(conv.key, second, lambda e: None)
    index = len(conv.messages) - 2  # the second user message
    before = [dict(m) for m in conv.messages[:index]]
    regen = ctl.regenerate(conv.key, lambda e: None)
    out = {"regenerate": {"ttft_ms": regen.ttft_ms, "prefilled": regen.cache.prefilled,
                          "cold_ttft_ms": cold(before, second)}}
    edited = second + " (edited)"
    done, _ = ctl.edit(conv.key, index, edited, lambda e: None)
    out["edit_middle"] = {"ttft_ms": done.ttft_ms, "prefilled": done.cache.prefilled, "reused": done.cache.reused,
                          "cold_ttft_ms": cold(before, edited)}
    fork = ctl.fork(conv.key, len(conv.messages), lambda e: None)
    done = ctl.send(fork.key, FOLLOW_UP, lambda e: None)
    out["fork"] = {"ttft_ms": done.ttft_ms, "prefilled": done.cache.prefilled, "reused": done.cache.reused,
                   "cold_ttft_ms": cold([dict(m) for m in fork.messages[:-2]], FOLLOW_UP)}
    return out


def _first_message(model, tokens: int) -> str:
    """About `tokens` tokens of the repo corpus (through this model's tokenizer), cut on a token."""
    from ds4tui.engine.text.tiny_tokenizer import corpus_text

    ids = model.tokenizer.encode(corpus_text())
    ids = (ids * (tokens // max(len(ids), 1) + 1))[:tokens]
    text = model.tokenizer.decode(ids)
    return "Read this text:\n\n" + text


def _run_side(side: str, spec_path: Path) -> dict:
    from ds4tui.cli.errors import CliError

    cmd = [sys.executable, "-m", "ds4tui", "bench", "cache", "--side", side, "--spec", str(spec_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if out.returncode != 0:
        raise CliError(f"{side} side failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _measure_side(side: str, spec: dict) -> dict:
    """One fresh process: restore the transcript, send the follow-up, report TTFT (and, on a hit, I/O)."""
    from ds4tui.chat import events as ev
    from ds4tui.config import Config
    from ds4tui.chat.controller import ChatController
    from ds4tui.engine.loader import load_model

    model = load_model(spec["model"])
    config = Config(model=spec["model"], cache_dir=spec["cache_dir"], ctx=spec["ctx"], temperature=0.0,
                    max_tokens=1, no_disk_cache=(side == "cold"), budget_mb=spec["budget_mb"])
    ctl = ChatController(model, config)
    t0 = time.perf_counter()
    ctl.warm_up()  # what the app's model-loading worker does before the first message
    warm_up_ms = (time.perf_counter() - t0) * 1000.0
    conv = ctl.new_conversation()
    conv.messages = list(spec["messages"])
    events: list = []
    done = ctl.send(conv.key, spec["follow_up"], events.append)
    if done is None:
        errors = [str(e) for e in events if isinstance(e, (ev.ChatError, ev.SaveFailed))]
        raise SystemExit(f"{side}: turn failed: {errors}")
    started = next(e for e in events if isinstance(e, ev.PrefillStarted))
    result = {
        "ttft_ms": done.ttft_ms,
        "prompt_tokens": done.prompt_tokens,
        "cached_tokens": started.cached,
        "source": started.source,
        "first_text": "".join(e.text for e in events if isinstance(e, ev.TokenText)),
        "miss": next((e.reason for e in events if isinstance(e, ev.Miss)), None),
        "warm_up_ms": warm_up_ms,
    }
    hit = next((e for e in events if isinstance(e, ev.Hit)), None)
    if hit is not None:
        import numpy as np

        # Both fresh buffers exist, untouched, before either is timed: neither can reuse
        # pages the other just freed (that made the second one measured look cheaper).
        raw_buf = np.empty(os.path.getsize(hit.path), dtype=np.uint8)  # malloc'd, never written
        session = model.new_session(spec["ctx"])  # the warmed spare is taken: a new buffer
        restore_fresh = _restore_fresh_ms(ctl, model, session, conv, hit.sha)
        fresh_read, warm_read = _raw_read_ms(hit.path, raw_buf)
        result.update(kv_bytes=hit.bytes, restore_ms=hit.ms, raw_read_ms=warm_read,
                      raw_read_fresh_ms=fresh_read, restore_fresh_ms=restore_fresh)
    return result


def _restore_fresh_ms(ctl, model, session, conv, sha: str) -> float:
    """The same restore again, into a new session whose buffer nothing has touched yet."""
    from ds4tui.chat import events as ev

    prompt = model.chat.render(conv.messages[:-1], add_generation_prompt=True).encode("utf-8")
    assert ctl.checkpoints is not None
    events: list = []
    ctl.checkpoints.restore_longest(prompt, session, events.append)
    hit = next((e for e in events if isinstance(e, ev.Hit)), None)
    if hit is None or hit.sha != sha:
        raise SystemExit(f"hit: the second restore did not load the same file: {events}")
    return hit.ms


def _raw_read_ms(path: str, buf) -> tuple[float, float]:
    """Time to open the file and read all of it into `buf`: first while buf is untouched
    (fresh memory), then the median of further reads into it, now touched."""
    size = os.path.getsize(path)
    times = []
    for _ in range(1 + RAW_READ_REPEATS):
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as fp:
            view, got = memoryview(buf), 0
            while got < size:
                n = fp.readinto(view[got:])
                if not n:
                    break
                got += n
        times.append((time.perf_counter() - t0) * 1000.0)
    return times[0], statistics.median(times[1:])


def _table(r: dict) -> str:
    def ok(flag: bool) -> str:
        return "ok" if flag else "MISSED"

    speedup, ratio = r["speedup"] or 0.0, r["restore_over_read"] or 0.0
    rows = [
        ("model", r["model"]),
        ("next prompt", f"{r['prompt_tokens']:,} tokens cold; from disk {r['cached_tokens']:,} cached + {r['suffix_tokens']:,} prefilled"),
        ("cold TTFT", f"{r['cold_ttft_ms']:,.0f} ms"),
        ("hit TTFT", f"{r['hit_ttft_ms']:,.1f} ms  ({speedup:,.0f}x faster; goal >= {GOAL_SPEEDUP:.0f}x: {ok(speedup >= GOAL_SPEEDUP)})"),
        (".kv file", human_bytes(r["kv_bytes"])),
        ("  restore", f"{r['restore_ms']:,.1f} ms"),
        ("  suffix + rest", f"{r['hit_rest_ms']:,.1f} ms"),
        ("raw read", f"{r['raw_read_ms']:,.1f} ms  (restore/read {ratio:.2f}x; goal <= {GOAL_RESTORE_OVER_READ:.0f}x: {ok(ratio <= GOAL_RESTORE_OVER_READ)})"),
        ("into fresh memory", f"restore {r['restore_fresh_ms']:,.1f} ms, raw read {r['raw_read_fresh_ms']:,.1f} ms"),
        ("warm_up (both)", f"cold side {r['warm_up_ms']['cold']:,.0f} ms, hit side {r['warm_up_ms']['hit']:,.0f} ms (before the message)"),
        ("same first token", "yes" if r["same_first_token"] else "NO"),
    ]
    for name, key in (("regenerate", "regenerate"), ("edit at the middle", "edit_middle"), ("fork + message", "fork")):
        m = r["moves"][key]
        rows.append((f"{name} TTFT", f"{m['ttft_ms']:,.1f} ms, prefilled {m['prefilled']:,}  "
                                     f"(cold prefill of the same text {m['cold_ttft_ms']:,.0f} ms)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
