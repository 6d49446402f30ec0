"""`ds4tui bench swa --model tiny-dsv4 [--json]`: what each SWA storage policy costs on disk and on a hit.

Owns the measurement of docs/swa_policies.md's table. For each prefix length T:
a cold session (periodic snapshots on) prefills T tokens, the time is the cold
baseline; it is saved as a real `.kv` file under each policy (full,
periodic:K, zero; one cache directory each, through the chat's own
`Checkpoints`), and each file is restored into a fresh session by the store's
prompt lookup (read, validate, replay), then a short new turn (`--suffix`
tokens) is prefilled: that is the time to first token of a hit. Cold TTFT is
the cold prefill of T plus the same suffix. Every number is a median over
--repeats, the policies taking turns within each round so that load from
other processes spreads evenly over them.
Every restored session's logits after the suffix are compared with the cold
one's (max |difference|: 0 means bit-exact).

`--model tiny-dsv4` measures a bench-only variant built seeded like tiny-dsv4
(same recipe and seed, tokenizer, hidden size 128) but with Flash's window
(128) and 12 layers on Flash's ratio schedule, so the window is a visible part
of a file and a zero replay (L*(W-1)+1 = 1525 tokens) is long enough to matter;
`--window`/`--layers` change it. Any other spec is loaded as is (a DSV4 model).
Torch runs one thread by default: on a shared 2-core machine extra threads
mostly measure contention.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field

DEFAULT_LENGTHS = "1000,4000,16000"  # off the 2048 grid, like evict/shutdown/session saves


@dataclass
class SwaBenchRow:
    tokens: int  # prefix length T
    policy: str  # "cold" for the baseline
    file_bytes: int  # the .kv file (header, text, payload)
    payload_bytes: int
    restore_ms: float  # store lookup + read + validate + replay
    recomputed: int  # tokens re-run: the replay (cold: the whole prefix)
    ttft_ms: float  # restore (or cold prefill) + the suffix prefill
    vs_cold: float  # ttft / cold ttft
    max_logit_diff: float  # after the suffix, against the cold session


@dataclass
class SwaBenchResult:
    model: str
    layers: int
    window: int
    ratios: list[int]
    chunk: int
    period: int
    suffix: int
    threads: int
    repeats: int
    rows: list[SwaBenchRow] = field(default_factory=list)


def bench_model(spec: str, window: int, layers: int, ctx: int):
    """The model to measure: tiny-dsv4's bench variant (see the module doc), or `spec` as is."""
    from ds4tui.engine.loader import load_model

    if spec != "tiny-dsv4":
        return load_model(spec)
    from ds4tui.engine.dsv4 import tiny as tiny_dsv4
    from ds4tui.engine.dsv4.model import load_tokenizer, model_from_tensors
    from ds4tui.engine.dsv4.config import Dsv4Config, flash_compress_ratios

    cfg = Dsv4Config.from_hf(dict(
        tiny_dsv4.CONFIG, sliding_window=window, num_hidden_layers=layers,
        compress_ratios=flash_compress_ratios(layers), max_position_embeddings=max(ctx, 16384),
    ))
    tok = load_tokenizer(tiny_dsv4.ensure_tiny_dsv4(), cfg)
    return model_from_tensors(f"tiny-dsv4-swa-bench-{layers}x{window}", cfg, tiny_dsv4.random_tensors(cfg), tok)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def measure_swa(
    spec: str = "tiny-dsv4", lengths: tuple[int, ...] = (1000, 4000, 16000), period: int = 2048,
    suffix: int = 32, repeats: int = 3, window: int = 128, layers: int = 12, chunk: int | None = None,
) -> SwaBenchResult:
    """Long because it is one measurement read top to bottom: the setup, the timed runs, the figures, in the
    order they happen."""
    import torch

    from ds4tui.bench.engine_bench import bench_tokens
    from ds4tui.cache.policy import CachePolicy
    from ds4tui.chat.checkpoints import Checkpoints

    ctx = max(lengths) + suffix
    model = bench_model(spec, window, layers, ctx)
    policies = (f"periodic:{period}", "zero", "full")  # periodic first: the others drop the snapshot
    probe = model.new_session(ctx, chunk)
    if not probe.set_storage_policy("full"):
        raise ValueError(f"{model.info.name} is not a DSV4-family model: SWA policies do not apply")
    cfg = model.cfg
    result = SwaBenchResult(
        model=model.info.name, layers=cfg.num_hidden_layers, window=cfg.sliding_window,
        ratios=list(cfg.compress_ratios), chunk=probe.chunk_size, period=period, suffix=suffix,
        threads=torch.get_num_threads(), repeats=repeats,
    )
    del probe
    all_tokens = bench_tokens(model, ctx)
    tb = model.tokenizer.token_bytes
    ignore = lambda _event: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="ds4tui-swa-bench-") as tmp:
        for t in lengths:
            prefix, more = all_tokens[:t], all_tokens[t : t + suffix]
            text = b"".join(tb(x) for x in prefix)
            prompt = text + b"".join(tb(x) for x in more)
            cold_runs = []
            for _ in range(repeats):  # the first one is saved below
                s = model.new_session(ctx, chunk)
                s.set_storage_policy(f"periodic:{period}")
                t0 = time.perf_counter()
                s.prefill(prefix)
                cold_runs.append((_ms(t0), s))
            cold = cold_runs[0][1]
            files = {}
            for policy in policies:
                cold.set_storage_policy(policy)
                store = Checkpoints(model, f"{tmp}/{t}-{policy.replace(':', '-')}", CachePolicy(), ctx_size=ctx)
                sha = store.save(cold, text, "cold", ignore)
                if sha is None:
                    raise RuntimeError(f"saving the {policy} checkpoint of {t} tokens failed")
                files[policy] = (store, store.store.path_for(sha))
            ttfts = []
            for prefill_ms, s in cold_runs:
                t0 = time.perf_counter()
                s.prefill(more)
                ttfts.append(prefill_ms + _ms(t0))
            cold_ttft, want = statistics.median(ttfts), cold.logits
            del cold_runs, s
            result.rows.append(SwaBenchRow(t, "cold", 0, 0, 0.0, t, round(cold_ttft, 1), 1.0, 0.0))
            order = ("full", f"periodic:{period}", "zero")
            runs: dict[str, list] = {policy: [] for policy in order}
            for _ in range(repeats):
                for policy in order:
                    store, _path = files[policy]
                    s = model.new_session(ctx, chunk)
                    t0 = time.perf_counter()
                    covered = store.restore_longest(prompt, s, ignore)
                    restore_ms = _ms(t0)
                    if covered != len(text):
                        raise RuntimeError(f"the {policy} checkpoint of {t} tokens was not restored")
                    t1 = time.perf_counter()
                    s.prefill(more)
                    runs[policy].append((restore_ms, restore_ms + _ms(t1), s.swa.last_restore.replayed,
                                         float((s.logits - want).abs().max())))
            for policy in order:
                store, path = files[policy]
                got = runs[policy]
                restore_ms = statistics.median(r[0] for r in got)
                ttft = statistics.median(r[1] for r in got)
                result.rows.append(SwaBenchRow(
                    t, policy, path.stat().st_size, store.store.scan()[0].header.payload_bytes,
                    round(restore_ms, 1), got[0][2], round(ttft, 1), round(ttft / cold_ttft, 4),
                    max(r[3] for r in got),
                ))
    return result


def format_table(r: SwaBenchResult) -> str:
    lines = [
        f"model {r.model}: {r.layers} layers, window {r.window}, ratios {r.ratios}",
        f"chunk {r.chunk}, periodic K = {r.period}, suffix {r.suffix} tokens, {r.threads} thread(s), "
        f"medians of {r.repeats} runs",
        f"{'prefix':>7}  {'policy':<14} {'file bytes':>11} {'restore ms':>10} {'recomputed':>10} "
        f"{'TTFT ms':>9} {'vs cold':>8} {'max |dlogit|':>12}",
    ]
    for row in r.rows:
        size = f"{row.file_bytes:,}" if row.file_bytes else "-"
        restore = f"{row.restore_ms:.1f}" if row.policy != "cold" else "-"
        lines.append(f"{row.tokens:>7}  {row.policy:<14} {size:>11} {restore:>10} {row.recomputed:>10} "
                     f"{row.ttft_ms:>9.1f} {row.vs_cold:>8.3f} {row.max_logit_diff:>12.3g}")
    return "\n".join(lines)


def add_bench_command(subparsers) -> None:
    p = subparsers.add_parser(
        "swa", help="SWA storage policies of DSV4 checkpoints: file bytes, restore, recompute, TTFT",
        description="Save one cold prefix under each SWA policy (full, periodic:K, zero), restore it "
        "through the disk cache and prefill a short turn; compare with a cold prefill.",
    )
    p.add_argument("--model", default="tiny-dsv4", metavar="SPEC",
                   help="tiny-dsv4 (its bench variant, see --window/--layers) or a DSV4 model")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--lengths", default=DEFAULT_LENGTHS, metavar="N,N,..",
                   help=f"prefix lengths in tokens (default {DEFAULT_LENGTHS})")
    p.add_argument("--period", type=int, default=2048, metavar="K", help="K of periodic:K (default 2048)")
    p.add_argument("--suffix", type=int, default=32, metavar="N", help="tokens of the new turn (default 32)")
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="runs of each cold prefill and restore (default 3)")
    p.add_argument("--window", type=int, default=128, metavar="W", help="tiny-dsv4 variant window (default 128)")
    p.add_argument("--layers", type=int, default=12, metavar="L", help="tiny-dsv4 variant layers (default 12)")
    p.add_argument("--chunk", type=int, metavar="N", help="prefill chunk (default: the engine's, 2048)")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch intra-op threads (default 1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ds4tui.cli.errors import CliError
    from ds4tui.engine.errors import EngineError

    try:
        lengths = tuple(int(x) for x in args.lengths.split(",") if x.strip())
    except ValueError:
        raise CliError(f"--lengths {args.lengths!r}: comma-separated token counts") from None
    if not lengths or min(lengths) < 1 or args.period < 1 or args.suffix < 1 or args.repeats < 1:
        raise CliError("--lengths, --period, --suffix and --repeats must be >= 1")
    if args.window < 1 or args.layers < 1:
        raise CliError("--window and --layers must be >= 1")
    import torch

    torch.set_num_threads(args.threads)  # a CLI run owns its process
    try:
        r = measure_swa(args.model, lengths, args.period, args.suffix, args.repeats, args.window,
                        args.layers, args.chunk)
    except (EngineError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(asdict(r)))
    else:
        print(format_table(r))
    return 0
