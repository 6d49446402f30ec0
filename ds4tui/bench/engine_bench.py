"""`ds4tui bench engine --model SPEC [--json]`: speed and payload size of any loaded model.

Owns the measurement, written against the engine contract only (Model,
Session), so it serves every family. One run: a fresh session prefills a
prompt (tokens of the repo's tiny corpus, repeated), decodes greedily, saves
its payload to a temp file and loads it into a second fresh session, which
must then hold the same logits. A third session, prefilled the same way,
decodes as many tokens through the chat's sampler at its default settings
(temperature 0.7, top-p 0.95, min-p 0.05), token by token in turn with the
greedy one, so a busy machine slows both alike. Reported numbers are medians over --repeats runs after one untimed
warm-up of the same prompt length (first-call allocations, a chunk's scratch and lazy
imports are not the engine's steady state; llama-bench warms up the same way). Save/load go through the page cache (no fsync): they measure the
engine's serialization, not the disk.

--chat-tokens N also times whole replies through the chat controller, the
number the chat's stats line shows (ds4tui/bench/chat_decode.py).
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
    decode_tok_s: float  # greedy: argmax per token
    sampled_decode_tok_s: float  # the chat's default sampling per token
    sampled_over_greedy: float  # median over runs of the two speeds' ratio within the run
    payload_bytes: int  # after prompt + decode tokens
    payload_bytes_per_token: float
    save_mb_s: float
    load_mb_s: float
    restore_exact: bool  # the loaded session's logits equal the saved one's, bit for bit
    kernels: str  # the C kernel variant (avx512, avx2, scalar), and whether decode is the fused step; or "torch"
    weights: str  # the quant mix: which tensor types the C kernels read, which fall back to fp32
    chat: dict | None = None  # --chat-tokens: greedy vs sampled replies through the controller
    kv_dtype: str = ""  # the sessions' K/V type (--kv-dtype; a family without the choice: "-")
    dsv4: dict | None = None  # a GGUF DeepSeek V4: per-layer times, bytes per token, RSS (dsv4_layers.py)


def bench_tokens(model, n: int) -> list[int]:
    """n prompt tokens: the tiny corpus through the model's own tokenizer, repeated."""
    from ds4tui.engine.text.tiny_tokenizer import corpus_text

    ids = model.tokenizer.encode(corpus_text())
    if not ids:
        raise ValueError("the tokenizer produced no tokens for the corpus")
    return (ids * (n // len(ids) + 1))[:n]


def _decode_side_by_side(sessions: list, choosers: list, n: int) -> list[float]:
    """Seconds each session spends picking and decoding n tokens, token by token in turn.

    Interleaving single tokens (the order flipping every token) exposes both sides to
    the same moments of a busy machine, which whole-run alternation does not.
    """
    spent = [0.0] * len(sessions)
    for i in range(n):
        for k in (range(len(sessions)) if i % 2 == 0 else reversed(range(len(sessions)))):
            session = sessions[k]
            t0 = time.perf_counter()
            session.decode(choosers[k](session.logits))
            spent[k] += time.perf_counter() - t0
    return spent


def _one_run(model, prompt: list[int], decode_tokens: int, ctx: int, tmpdir: str, kv_dtype: str | None = None) -> dict:
    import torch

    from ds4tui.engine.sampling import Sampler, SamplingParams

    # both through the chat's Sampler: greedy is its temperature-0 argmax
    greedy, sampler = Sampler(SamplingParams(temperature=0.0)), Sampler(SamplingParams(seed=0))
    s = model.new_session(ctx, kv_dtype=kv_dtype)
    t0 = time.perf_counter()
    s.prefill(prompt)
    t1 = time.perf_counter()
    greedy_s = sampled_s = 0.0
    if decode_tokens:
        # the sampled side decodes in a second session holding the same prompt (prefill untimed)
        other = model.new_session(ctx, kv_dtype=kv_dtype)
        other.prefill(prompt)
        greedy_s, sampled_s = _decode_side_by_side([s, other], [greedy, sampler], decode_tokens)
        del other
    size = s.payload_bytes()
    path = os.path.join(tmpdir, "payload.bin")
    with open(path, "wb") as f:
        t3 = time.perf_counter()
        s.save_payload(f)
        f.flush()
        t4 = time.perf_counter()
    if os.path.getsize(path) != size:
        raise RuntimeError(f"payload_bytes() said {size}, save wrote {os.path.getsize(path)}")
    restored = model.new_session(ctx, kv_dtype=kv_dtype)
    with open(path, "rb") as f:
        t5 = time.perf_counter()
        restored.load_payload(f, size)
        t6 = time.perf_counter()
    exact = restored.logits is not None and bool(torch.equal(restored.logits, s.logits))
    return {
        "prefill_s": t1 - t0, "decode_s": greedy_s, "sampled_s": sampled_s, "save_s": t4 - t3, "load_s": t6 - t5,
        "bytes": size, "tokens": len(s.tokens), "exact": exact, "kv_dtype": getattr(s, "kv_dtype", "-"),
    }


def measure_engine(
    spec: str, prompt_tokens: int = 512, decode_tokens: int = 32, repeats: int = 3, ctx: int | None = None,
    chat_tokens: int = 0, kv_dtype: str | None = None, expert_budget: int | None = None,
) -> EngineBenchResult:
    """Long because it is one measurement read top to bottom: the setup, the timed runs, the figures, in the
    order they happen."""
    import torch

    from ds4tui.engine.loader import load_model

    t0 = time.perf_counter()
    model = load_model(spec)
    load_s = time.perf_counter() - t0
    if getattr(model, "huge_pages", None) is not None:
        model.huge_pages.wait()  # measure the steady state: weights in huge pages where they go
    prompt = bench_tokens(model, prompt_tokens)
    ctx = ctx or prompt_tokens + decode_tokens
    dsv4 = None
    if model.info.family == "dsv4" and getattr(model, "reader", None) is not None:
        from ds4tui.bench.dsv4_layers import measure_dsv4_layers

        # first, from a cold page cache (what a fresh start reads), with the pager if asked
        dsv4 = asdict(measure_dsv4_layers(model, prompt, decode_tokens, expert_budget))
    elif expert_budget:
        raise ValueError("--expert-budget applies to a DeepSeek V4 GGUF only")
    runs = []
    with tempfile.TemporaryDirectory(prefix="ds4tui-bench-") as tmpdir:
        _one_run(model, prompt, min(2, decode_tokens), ctx, tmpdir, kv_dtype)  # warm-up
        for _ in range(repeats):
            runs.append(_one_run(model, prompt, decode_tokens, ctx, tmpdir, kv_dtype))
    chat = None
    if chat_tokens:
        from ds4tui.bench.chat_decode import measure_chat_decode

        chat = asdict(measure_chat_decode(model, spec, chat_tokens, repeats))

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    size = runs[-1]["bytes"]
    from ds4tui.engine.kernels import qgemv

    mix = getattr(model, "quant_mix", None)  # set by the GGUF loader
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
        sampled_decode_tok_s=round(decode_tokens / med("sampled_s"), 1) if decode_tokens else 0.0,
        sampled_over_greedy=round(statistics.median(r["decode_s"] / r["sampled_s"] for r in runs), 3)
        if decode_tokens else 0.0,
        payload_bytes=size,
        payload_bytes_per_token=round(size / runs[-1]["tokens"], 1),
        save_mb_s=round(size / MB / med("save_s"), 1),
        load_mb_s=round(size / MB / med("load_s"), 1),
        restore_exact=all(r["exact"] for r in runs),
        kernels=_kernels(model, qgemv.backend()),
        weights=mix.summary() if mix is not None else "fp32 (not a GGUF)",
        chat=chat,
        kv_dtype=runs[-1]["kv_dtype"],
        dsv4=dsv4,
    )


def add_bench_command(subparsers) -> None:
    p = subparsers.add_parser(
        "engine", help="prefill/decode tok/s, payload bytes per token, save/load MB/s",
        description="Prefill a prompt, decode greedily and with the chat's default sampling, save the "
        "session payload and load it back; medians over --repeats runs.",
    )
    p.add_argument("--model", required=True, metavar="SPEC", help="a model name, GGUF file or checkpoint directory")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--prompt-tokens", type=int, default=512, metavar="N", help="prompt length (default 512)")
    p.add_argument("--decode-tokens", type=int, default=32, metavar="N", help="tokens decoded after it (default 32)")
    p.add_argument("--repeats", type=int, default=3, metavar="N", help="timed runs (default 3)")
    p.add_argument("--ctx", type=int, metavar="N", help="session context (default: prompt + decode tokens)")
    p.add_argument("--chat-tokens", type=int, default=0, metavar="N",
                   help="also time N-token replies through the chat controller, greedy vs sampled (default: off)")
    p.add_argument("--threads", type=int, metavar="N", help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--kv-dtype", choices=("f16", "f32"), help="K/V type of llama-family sessions (default: f16)")
    p.add_argument("--expert-budget", type=float, metavar="GB",
                   help="DeepSeek V4 GGUF: keep at most GB of routed experts resident in the per-layer run "
                        "(paged from the file, read ahead a layer early; default: no bound)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ds4tui.cli.errors import CliError
    from ds4tui.engine.errors import EngineError

    if args.prompt_tokens < 1 or args.decode_tokens < 0 or args.repeats < 1 or args.chat_tokens < 0:
        raise CliError("--prompt-tokens and --repeats must be >= 1, --decode-tokens and --chat-tokens >= 0")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # a CLI run owns its process
    try:
        budget = None if args.expert_budget is None else int(args.expert_budget * 1e9)
        r = measure_engine(args.model, args.prompt_tokens, args.decode_tokens, args.repeats, args.ctx,
                           args.chat_tokens, args.kv_dtype, budget)
    except (EngineError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(asdict(r)))
        return 0
    rows = [
        ("model", f"{r.model} ({r.family}), {r.threads} threads, ctx {r.ctx}, KV {r.kv_dtype}, load {r.load_s:.2f} s"),
        ("weights", f"{r.weights}; kernels: {r.kernels}"),
        ("prefill", f"{r.prefill_tok_s:.1f} tok/s ({r.prompt_tokens} tokens)"),
        ("decode", f"{r.decode_tok_s:.1f} tok/s greedy, {r.sampled_decode_tok_s:.1f} tok/s sampled,"
                   f" sampled = {r.sampled_over_greedy:.0%} of greedy (median per run; {r.decode_tokens} tokens)"
                   if r.decode_tokens else "none (--decode-tokens 0)"),
        ("payload", f"{r.payload_bytes} bytes, {r.payload_bytes_per_token:.1f} bytes/token"),
        ("save", f"{r.save_mb_s:.1f} MB/s"),
        ("load", f"{r.load_mb_s:.1f} MB/s, restored logits {'exact' if r.restore_exact else 'DIFFER'}"),
    ]
    if r.chat is not None:
        c = r.chat
        rows.append(("chat", f"{c['greedy_tok_s']:.1f} tok/s greedy, {c['sampled_tok_s']:.1f} tok/s sampled,"
                             f" sampled = {c['sampled_over_greedy']:.0%} of greedy (median per round; replies of"
                             f" {c['greedy_tokens']:g} / {c['sampled_tokens']:g} tokens, through the controller)"))
    if r.dsv4 is not None:
        from ds4tui.bench.dsv4_layers import Dsv4LayerBench, format_rows

        rows += format_rows(Dsv4LayerBench(**r.dsv4))
    for k, v in rows:
        print(f"{k:<8} {v}")
    return 0


def _kernels(model, variant: str) -> str:
    """The C kernel variant and what runs on it: the fused decode step, or only the block
    products of the torch forward (shapes the step does not take); "torch" when neither."""
    from ds4tui.engine.kernels import qgemv

    if getattr(model, "use_blocks", False) and qgemv.bf16_products():
        variant += " (prefill products in bf16)"
    if getattr(model, "fast", None) is not None:
        return f"{variant}, fused C decode step"
    if getattr(model, "use_blocks", False):
        return f"{variant} block products (no fused decode step for these shapes)"
    return "torch"
