"""`ds4tui bench engine --model SPEC [--json]`: speed and payload size of any loaded model.

Owns the measurement, written against the engine contract only (Model,
Session), so it serves every family. One run: a fresh session prefills a
prompt (tokens of the repo's tiny corpus, repeated), decodes greedily, saves
its payload to a temp file and loads it into a second fresh session, which
must then hold the same logits. Reported numbers are medians over --repeats
runs after one untimed warm-up (first-call allocations and lazy imports are
not the engine's steady state). Save/load go through the page cache (no
fsync): they measure the engine's serialization, not the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass

MB = 1024 * 1024


@dataclass
class EngineBenchResult:
    model: str
    family: str
    threads: int
    ctx: int
    prompt_tokens: int
    decode_tokens: int
    repeats: int
    load_s: float  # loading the model (weights, tokenizer), once
    prefill_tok_s: float
    decode_tok_s: float
    payload_bytes: int  # after prompt + decode tokens
    payload_bytes_per_token: float
    save_mb_s: float
    load_mb_s: float
    restore_exact: bool  # the loaded session's logits equal the saved one's, bit for bit


def bench_tokens(model, n: int) -> list[int]:
    """n prompt tokens: the tiny corpus through the model's own tokenizer, repeated."""
    from ds4tui.engine.text.tiny_tokenizer import corpus_text

    ids = model.tokenizer.encode(corpus_text())
    if not ids:
        raise ValueError("the tokenizer produced no tokens for the corpus")
    return (ids * (n // len(ids) + 1))[:n]


def _one_run(model, prompt: list[int], decode_tokens: int, ctx: int, tmpdir: str) -> dict:
    import torch

    s = model.new_session(ctx)
    t0 = time.perf_counter()
    s.prefill(prompt)
    t1 = time.perf_counter()
    for _ in range(decode_tokens):
        s.decode(int(torch.argmax(s.logits)))
    t2 = time.perf_counter()
    size = s.payload_bytes()
    path = os.path.join(tmpdir, "payload.bin")
    with open(path, "wb") as f:
        t3 = time.perf_counter()
        s.save_payload(f)
        f.flush()
        t4 = time.perf_counter()
    if os.path.getsize(path) != size:
        raise RuntimeError(f"payload_bytes() said {size}, save wrote {os.path.getsize(path)}")
    restored = model.new_session(ctx)
    with open(path, "rb") as f:
        t5 = time.perf_counter()
        restored.load_payload(f, size)
        t6 = time.perf_counter()
    exact = restored.logits is not None and bool(torch.equal(restored.logits, s.logits))
    return {
        "prefill_s": t1 - t0, "decode_s": t2 - t1, "save_s": t4 - t3, "load_s": t6 - t5,
        "bytes": size, "tokens": len(s.tokens), "exact": exact,
    }


def measure_engine(
    spec: str, prompt_tokens: int = 512, decode_tokens: int = 32, repeats: int = 3, ctx: int | None = None
) -> EngineBenchResult:
    import torch

    from ds4tui.engine.loader import load_model

    t0 = time.perf_counter()
    model = load_model(spec)
    load_s = time.perf_counter() - t0
    prompt = bench_tokens(model, prompt_tokens)
    ctx = ctx or prompt_tokens + decode_tokens
    runs = []
    with tempfile.TemporaryDirectory(prefix="ds4tui-bench-") as tmpdir:
        _one_run(model, prompt[: min(64, prompt_tokens)], min(2, decode_tokens), ctx, tmpdir)  # warm-up
        for _ in range(repeats):
            runs.append(_one_run(model, prompt, decode_tokens, ctx, tmpdir))

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    size = runs[-1]["bytes"]
    return EngineBenchResult(
        model=model.info.name,
        family=model.info.family,
        threads=torch.get_num_threads(),
        ctx=ctx,
        prompt_tokens=prompt_tokens,
        decode_tokens=decode_tokens,
        repeats=repeats,
        load_s=round(load_s, 3),
        prefill_tok_s=round(prompt_tokens / med("prefill_s"), 1),
        decode_tok_s=round(decode_tokens / med("decode_s"), 1) if decode_tokens else 0.0,
        payload_bytes=size,
        payload_bytes_per_token=round(size / runs[-1]["tokens"], 1),
        save_mb_s=round(size / MB / med("save_s"), 1),
        load_mb_s=round(size / MB / med("load_s"), 1),
        restore_exact=all(r["exact"] for r in runs),
    )


def add_bench_command(subparsers) -> None:
    p = subparsers.add_parser(
        "engine", help="prefill/decode tok/s, payload bytes per token, save/load MB/s",
        description="Prefill a prompt, decode greedily, save the session payload and load it back; "
        "medians over --repeats runs.",
    )
    p.add_argument("--model", required=True, metavar="SPEC", help="a model name, GGUF file or checkpoint directory")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--prompt-tokens", type=int, default=512, metavar="N", help="prompt length (default 512)")
    p.add_argument("--decode-tokens", type=int, default=32, metavar="N", help="tokens decoded after it (default 32)")
    p.add_argument("--repeats", type=int, default=3, metavar="N", help="timed runs (default 3)")
    p.add_argument("--ctx", type=int, metavar="N", help="session context (default: prompt + decode tokens)")
    p.add_argument("--threads", type=int, metavar="N", help="torch intra-op threads (default: torch's choice)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ds4tui.cli.errors import CliError
    from ds4tui.engine.errors import EngineError

    if args.prompt_tokens < 1 or args.decode_tokens < 0 or args.repeats < 1:
        raise CliError("--prompt-tokens and --repeats must be >= 1, --decode-tokens >= 0")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # a CLI run owns its process
    try:
        r = measure_engine(args.model, args.prompt_tokens, args.decode_tokens, args.repeats, args.ctx)
    except (EngineError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(asdict(r)))
        return 0
    rows = [
        ("model", f"{r.model} ({r.family}), {r.threads} threads, ctx {r.ctx}, load {r.load_s:.2f} s"),
        ("prefill", f"{r.prefill_tok_s:.1f} tok/s ({r.prompt_tokens} tokens)"),
        ("decode", f"{r.decode_tok_s:.1f} tok/s ({r.decode_tokens} tokens)"),
        ("payload", f"{r.payload_bytes} bytes, {r.payload_bytes_per_token:.1f} bytes/token"),
        ("save", f"{r.save_mb_s:.1f} MB/s"),
        ("load", f"{r.load_mb_s:.1f} MB/s, restored logits {'exact' if r.restore_exact else 'DIFFER'}"),
    ]
    for k, v in rows:
        print(f"{k:<8} {v}")
    return 0
