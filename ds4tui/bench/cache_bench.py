"""`ds4tui bench cache --model SPEC --tokens N [--json]`: what the disk cache buys a chat.

Owns the measurement of time to first token (TTFT) for the same conversation,
cold and from disk, each in a fresh process, exactly as a user meets them:

1. setup (this process): a chat whose first message is ~N tokens of the repo's
   corpus gets a greedy reply, then the controller shuts down, which writes
   the `shutdown` checkpoint of the whole conversation;
2. cold (fresh process, disk cache off): the next message of that
   conversation, from an empty session: the whole transcript is prefilled;
3. hit (fresh process, same cache dir): the same next message; the controller
   restores the checkpoint and prefills only the new message. Measured twice:
   with the cache's files in the page cache ("hot": read once just before, as
   after a recent save or hit) and evicted from it ("cold": fsync, then
   posix_fadvise(POSIX_FADV_DONTNEED), no root needed; mincore(2) then says
   what share of the files is still resident, and a timed raw read of the
   file, evicted again, against one from the page cache backs that up). The
   hot side then reads the same .kv file raw (page cache warm, as the restore had it).

`--runs N` repeats the three sides in alternation and reports medians (the
machine may be shared).

Each side loads the model and calls `ChatController.warm_up()` before the
message, as the app's model-loading worker does (timed and reported: both pay it).
TTFT is the reply's own figure (the stats line's: from the turn's start to the
first sampled token); `send TTFT` runs from the `send` call to the first reply
text event, everything the user waits for. The hit side splits the latter
into phases by timing the controller's calls from outside (no hooks in the
code measured): the fit check, the lookup, the restore, tokenization, the
forward of the new message, and the rest (sampling, events). The restore runs
the new message's first prefill chunk while it reads the rows (session.py,
load_payload_ahead), so its figure (the Hit's) holds that forward and the
message's tokenization; both are also reported on their own ("inside the
restore", wall time: the forward's waits for rows still on their way
included), and after the send the same file is restored once more without a
forward alongside ("restore alone", the page cache as the send found it), which
shows what the overlap hid. The "fixed part" is send TTFT minus the restore
(with its forward). Goals on SmolLM2 at 4096 tokens: hit TTFT <= cold / 100
with a hot page cache and <= cold / 50 with a cold one, the fixed part <= 60
ms, and restore (alone) <= 2 x raw read.

Restore vs raw read, like for like: the restore alone writes into the session
buffer that warm_up and the send already touched, so it is compared with a read
into an already-touched buffer ("warm"). The restore is also measured into the
buffer the engine prepared for the next chat after the reply ("next chat":
Model.prepare_session, what a second chat opened or resumed gets), and both into
freshly allocated, untouched memory ("fresh": a new session, np.empty), where page
faults on first write add their cost (docs/perf-archive.md, "First-use costs and warm_up",
"Recycled and prepared KV buffers").
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ds4tui.format.display import human_bytes

GOAL_SPEEDUP = 50.0  # page cache cold
GOAL_SPEEDUP_HOT = 100.0
GOAL_FIXED_MS = 60.0
GOAL_RESTORE_OVER_READ = 2.0
# mincore's resident share under which an eviction counts as taken.
EVICTED_BELOW = 0.01
FOLLOW_UP = "Thanks. In one sentence, what was that text about?"
RAW_READ_REPEATS = 3


def add_bench_command(subparsers) -> None:
    p = subparsers.add_parser(
        "cache", help="cold vs disk-hit time to first token of one conversation",
        description=__doc__.split("\n\n")[0] + " Cold and hit run in fresh processes; the hit with the"
                    " file in the page cache and evicted from it.",
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="model spec (default smollm2-135m-instruct)")
    p.add_argument("--tokens", type=int, default=4096, help="length of the conversation before the next message")
    p.add_argument("--runs", type=int, default=1, help="rounds of cold / hot hit / cold-page-cache hit (medians)")
    p.add_argument("--no-moves", action="store_true", help="skip the regenerate / edit / fork timings")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--cache-dir", help="cache directory to use (default: a temporary one, removed afterwards)")
    p.add_argument("--files", type=int, help="instead: time kv ls, the lookup, eviction planning and the browser's"
                   " first screen over a generated directory of this many files (goal: <= 1 s each)")
    p.add_argument("--payload-kib", type=int, default=16, help="with --files: payload size of each file (default 16)")
    p.add_argument("--side", choices=["cold", "hit"], help=argparse.SUPPRESS)
    p.add_argument("--page-cache", choices=["hot", "cold"], default="hot", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.set_defaults(func=run_bench_cache)


def run_bench_cache(args: argparse.Namespace) -> int:
    if args.side:
        spec = json.loads(Path(args.spec).read_text())
        print(json.dumps(_measure_side(args.side, spec, args.page_cache)))
        return 0
    from ds4tui.cli.errors import CliError

    if args.files is not None:
        return _run_scale(args)
    if args.tokens < 64:
        raise CliError("--tokens must be at least 64")
    if args.runs < 1:
        raise CliError("--runs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="ds4tui-bench-cache-") as tmp:
        cache_dir = args.cache_dir or str(Path(tmp) / "kv")
        result = _bench(args.model, args.tokens, cache_dir, Path(tmp), runs=args.runs, moves=not args.no_moves)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_table(result))
    return 0


def _run_scale(args: argparse.Namespace) -> int:
    from ds4tui.bench.cache_scale import run_scale, scale_table
    from ds4tui.cli.errors import CliError

    if args.files < 1:
        raise CliError("--files must be at least 1")
    with tempfile.TemporaryDirectory(prefix="ds4tui-bench-scale-") as tmp:
        result = run_scale(args.files, args.payload_kib << 10, Path(tmp))
    print(json.dumps(result, indent=2) if args.json else scale_table(result))
    return 0


def _bench(model_spec: str, tokens: int, cache_dir: str, tmp: Path, *, runs: int = 1, moves: bool = True) -> dict:
    """Long because it is one measurement read top to bottom: the setup, the timed runs, the figures, in the
    order they happen."""
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
    sides: dict[str, list[dict]] = {"cold": [], "hot": [], "evicted": []}
    for _ in range(runs):  # alternating, so a busy spell of the machine hits every side alike
        sides["cold"].append(_run_side("cold", spec_path))
        sides["hot"].append(_run_side("hit", spec_path, "hot"))
        sides["evicted"].append(_run_side("hit", spec_path, "cold"))
    for name in ("hot", "evicted"):
        for run in sides[name]:
            if run["source"] != "disk":
                raise CliError(f"the hit side did not restore from disk ({run['source']}): {run.get('miss')}")
    cold_ttft = _median(sides["cold"], "ttft_ms")
    hot, evicted = _page_cache_row(sides["hot"], cold_ttft), _page_cache_row(sides["evicted"], cold_ttft)
    h = sides["hot"]
    return {
        "model": model_spec,
        "runs": runs,
        "context_tokens": first.context_tokens,
        "prompt_tokens": sides["cold"][0]["prompt_tokens"],
        "cached_tokens": h[0]["cached_tokens"],
        "suffix_tokens": h[0]["prompt_tokens"],
        "cold_ttft_ms": cold_ttft,
        "cold_ttft_runs_ms": [r["ttft_ms"] for r in sides["cold"]],
        # The hot page cache's figures under their earlier names.
        "hit_ttft_ms": hot["ttft_ms"],
        "speedup": hot["speedup"],
        "kv_bytes": h[0]["kv_bytes"],
        "restore_ms": hot["restore_ms"],  # with the suffix's forward run alongside (if it was)
        "restore_alone_ms": hot["restore_alone_ms"],
        # The rest of the hit TTFT: lookup, what of the suffix's prefill did not run inside the
        # restore, sampling the first token.
        "hit_rest_ms": hot["ttft_ms"] - hot["restore_ms"],
        "raw_read_ms": _median(h, "raw_read_ms"),
        # The restore alone (the Hit's ms also holds the message's forward, run alongside).
        "restore_over_read": (hot["restore_alone_ms"] / _median(h, "raw_read_ms")
                              if _median(h, "raw_read_ms") > 0 else None),
        "restore_prepared_ms": _median(h, "restore_prepared_ms"),
        "restore_fresh_ms": _median(h, "restore_fresh_ms"),
        "raw_read_fresh_ms": _median(h, "raw_read_fresh_ms"),
        "page_cache": {"hot": hot, "cold": evicted},
        "eviction": {
            # Share of the cache's .kv bytes still resident right after the eviction (None: no mincore).
            "resident_after": _max_or_none(r["resident"] for r in sides["evicted"]),
            "took": _eviction_took(sides["evicted"]),
            "raw_read_evicted_ms": _median(sides["evicted"], "raw_read_evicted_ms"),
            "raw_read_cached_ms": _median(sides["evicted"], "raw_read_cached_ms"),
        },
        "warm_up_ms": {"cold": _median(sides["cold"], "warm_up_ms"), "hit": _median(h, "warm_up_ms")},
        "same_first_token": all(r["first_text"] == sides["cold"][0]["first_text"]
                                for r in sides["cold"] + sides["hot"] + sides["evicted"]),
        "goal_speedup": GOAL_SPEEDUP,
        "goal_speedup_hot": GOAL_SPEEDUP_HOT,
        "goal_fixed_ms": GOAL_FIXED_MS,
        "goal_restore_over_read": GOAL_RESTORE_OVER_READ,
        "moves": _moves(model, model_spec, tokens, ctx) if moves else None,
    }


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _max_or_none(values) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else max(values)


def _eviction_took(runs: list[dict]) -> bool | None:
    """Whether every evicted run started with the files out of the page cache: by mincore where it
    answers, else by the timing check (the evicted raw read clearly slower than the cached one);
    None when neither can tell."""
    verdicts = []
    for r in runs:
        if r["resident"] is not None:
            verdicts.append(r["resident"] < EVICTED_BELOW)
        elif r["raw_read_evicted_ms"] and r["raw_read_cached_ms"]:
            verdicts.append(r["raw_read_evicted_ms"] > 1.5 * r["raw_read_cached_ms"])
        else:
            return None
    return all(verdicts)


def _page_cache_row(runs: list[dict], cold_ttft: float) -> dict:
    """Medians of one page-cache state's hit runs, the phases of the send TTFT included."""
    ttft = _median(runs, "ttft_ms")
    phases = {k: statistics.median(r["phases"][k] for r in runs) for k in runs[0]["phases"]}
    return {
        "ttft_ms": ttft,
        "send_ttft_ms": _median(runs, "send_ttft_ms"),
        "restore_ms": _median(runs, "restore_ms"),
        "restore_alone_ms": _median(runs, "restore_alone_ms"),
        "fixed_ms": _median(runs, "fixed_ms"),
        "speedup": cold_ttft / ttft if ttft > 0 else None,
        "ttft_runs_ms": [r["ttft_ms"] for r in runs],
        "resident": _max_or_none(r["resident"] for r in runs),
        "phases_ms": phases,
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


def _run_side(side: str, spec_path: Path, page_cache: str = "hot") -> dict:
    from ds4tui.cli.errors import CliError

    cmd = [sys.executable, "-m", "ds4tui", "bench", "cache", "--side", side, "--page-cache", page_cache,
           "--spec", str(spec_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if out.returncode != 0:
        raise CliError(f"{side} side failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _measure_side(side: str, spec: dict, page_cache: str = "hot") -> dict:
    """One fresh process: restore the transcript, send the follow-up, report TTFT (and, on a hit,
    its phases and I/O). `page_cache`: the cache's files read just before the message, or evicted.

    Long because it is one measurement read top to bottom: the setup, the timed runs, the figures, in the
    order they happen."""
    from ds4tui.bench import page_cache as pc
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
    gc.freeze()  # and what the app does at model-ready (screens/app.py): no full collection mid-hit
    conv = ctl.new_conversation()
    conv.messages = list(spec["messages"])
    resident = None
    if side == "hit":
        kv_files = sorted(Path(spec["cache_dir"]).glob("*.kv"))
        for f in kv_files:
            pc.warm(f) if page_cache == "hot" else pc.evict(f)
        resident = _resident_share(kv_files)
    events: list = []
    first_at: list[float] = []

    def on_event(event) -> None:
        if isinstance(event, ev.TokenText) and not first_at:
            first_at.append(time.perf_counter())
        events.append(event)

    timers = _PhaseTimers(ctl, model) if side == "hit" else None
    t_send = time.perf_counter()
    done = ctl.send(conv.key, spec["follow_up"], on_event)
    if timers is not None:
        timers.remove()
    if done is None:
        errors = [str(e) for e in events if isinstance(e, (ev.ChatError, ev.SaveFailed))]
        raise SystemExit(f"{side}: turn failed: {errors}")
    started = next(e for e in events if isinstance(e, ev.PrefillStarted))
    send_ttft = ((first_at[0] if first_at else time.perf_counter()) - t_send) * 1000.0
    result = {
        "ttft_ms": done.ttft_ms,
        "send_ttft_ms": send_ttft,
        "prompt_tokens": done.prompt_tokens,
        "cached_tokens": started.cached,
        "source": started.source,
        "first_text": "".join(e.text for e in events if isinstance(e, ev.TokenText)),
        "miss": next((e.reason for e in events if isinstance(e, ev.Miss)), None),
        "warm_up_ms": warm_up_ms,
        "resident": resident,
    }
    hit = next((e for e in events if isinstance(e, ev.Hit)), None)
    if hit is not None:
        assert timers is not None
        result.update(kv_bytes=hit.bytes, restore_ms=hit.ms, fixed_ms=send_ttft - hit.ms,
                      phases=timers.phases(send_ttft, hit.ms, first_at[0] if first_at else None))
        # The restore alone (no forward alongside), into the same touched buffers, the file
        # again as the send found it (evicted, or read just before).
        pc.evict(hit.path) if page_cache == "cold" else pc.warm(hit.path)
        result["restore_alone_ms"] = _restore_fresh_ms(ctl, model, conv.session, conv, hit.sha)
        if page_cache == "cold":
            # The timing check of the eviction: the same file read raw, evicted again, then cached.
            buf = bytearray(os.path.getsize(hit.path))
            pc.evict(hit.path)
            result["raw_read_evicted_ms"] = _read_once_ms(hit.path, buf)
            result["raw_read_cached_ms"] = _read_once_ms(hit.path, buf)
            return result
        import numpy as np

        # The next chat's session: the buffer the turn's end had the engine prepare
        # (ChatController: pool.prepare_next), waited for here as a reader of the reply would.
        model.prepare_session(spec["ctx"], wait=True)
        prepared = model.new_session(spec["ctx"])
        result["restore_prepared_ms"] = _restore_fresh_ms(ctl, model, prepared, conv, hit.sha)
        # Both fresh buffers exist, untouched, before either is timed: neither can reuse
        # pages the other just freed (that made the second one measured look cheaper).
        raw_buf = np.empty(os.path.getsize(hit.path), dtype=np.uint8)  # malloc'd, never written
        session = model.new_session(spec["ctx"])  # no spare left: a new buffer
        restore_fresh = _restore_fresh_ms(ctl, model, session, conv, hit.sha)
        fresh_read, warm_read = _raw_read_ms(hit.path, raw_buf)
        result.update(raw_read_ms=warm_read, raw_read_fresh_ms=fresh_read, restore_fresh_ms=restore_fresh)
    return result


def _resident_share(paths: list[Path]) -> float | None:
    """Share of these files' bytes in the page cache (mincore), None where it cannot be told."""
    from ds4tui.bench import page_cache as pc

    total = resident = 0.0
    for f in paths:
        share = pc.resident_fraction(f)
        if share is None:
            return None
        size = f.stat().st_size
        total, resident = total + size, resident + share * size
    return resident / total if total else 0.0


class _PhaseTimers:
    """Times, from outside, the calls a disk hit's send makes before its first token: wraps a
    few methods of this controller's objects (instance attributes, removed afterwards).

    Phases: `fit_check` (the context-fit check before the turn), `lookup` (finding the
    candidates in the directory), `restore` (the Hit's own figure: validation and payload
    load, and since the load runs the new message's first chunk while it reads the rows,
    that forward and the message's tokenization too), `tokenize` (the tokenizer's encode
    calls outside the fit check and the restore), `forward` (the model forwards before the
    first token outside the restore: the rest of the new message's prefill, if any),
    `other` (the rest: rendering, sampling the first token, events, bookkeeping). These
    add up to the send TTFT. Reported beside them, not added: `forward_in_restore` and
    `tokenize_in_restore`, the wall time of those calls inside the restore (the forward's
    includes its waits for rows still on their way)."""

    PHASES = ("fit_check", "lookup", "tokenize", "forward")
    INSIDE = ("forward_in_restore", "tokenize_in_restore")

    def __init__(self, ctl, model) -> None:
        self._undo: list = []
        self._calls: list[tuple[str, float, float]] = []  # (phase, started at, ms)
        self._depth = 0  # inside the fit check: its encodes count there
        self._restoring = 0  # inside a restore: its forward and encodes are part of the Hit's ms
        self._wrap(ctl.moves, "check_fit", "fit_check", nest=True)
        if ctl.checkpoints is not None:
            self._wrap(ctl.checkpoints.store, "lookup", "lookup")
            for name in ("restore_longest", "restore_titled"):
                self._wrap(ctl.checkpoints, name, "restore_call", restoring=True)
        self._wrap(model.tokenizer, "encode", "tokenize")
        self._wrap(model, "forward", "forward")

    def _wrap(self, obj, name: str, phase: str, nest: bool = False, restoring: bool = False) -> None:
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            if phase == "tokenize" and self._depth:
                return inner(*args, **kwargs)
            what = f"{phase}_in_restore" if self._restoring and phase in ("tokenize", "forward") else phase
            self._depth += nest
            self._restoring += restoring
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self._calls.append((what, t0, (time.perf_counter() - t0) * 1000.0))
                self._depth -= nest
                self._restoring -= restoring

        had = name in vars(obj)
        setattr(obj, name, timed)
        self._undo.append((obj, name, inner if had else None))

    def remove(self) -> None:
        for obj, name, inner in reversed(self._undo):
            if inner is None:
                delattr(obj, name)
            else:
                setattr(obj, name, inner)
        self._undo.clear()

    def phases(self, send_ttft_ms: float, restore_ms: float, first_at: float | None) -> dict[str, float]:
        """ms per phase of the calls that started before the first token (the decode step
        after it is not part of the TTFT)."""
        out = dict.fromkeys(self.PHASES, 0.0)
        inside = dict.fromkeys(self.INSIDE, 0.0)
        for phase, t0, ms in self._calls:
            if first_at is None or t0 < first_at:
                if phase in out:
                    out[phase] += ms
                elif phase in inside:
                    inside[phase] += ms
        out["restore"] = restore_ms
        out["other"] = send_ttft_ms - sum(out.values())
        return {**out, **inside}


def _read_once_ms(path: str, buf: bytearray) -> float:
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fp:
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = fp.readinto(view[got:])
            if not n:
                break
            got += n
    return (time.perf_counter() - t0) * 1000.0


def _restore_fresh_ms(ctl, model, session, conv, sha: str) -> float:
    """The same restore again, alone (no suffix to run alongside), into `session` (a new one:
    a buffer nothing has touched yet)."""
    from ds4tui.chat import events as ev

    prompt = model.chat.render(conv.messages[:-1], add_generation_prompt=True, now=conv.template_now).encode("utf-8")
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


def _inside(phases: dict) -> str:
    """What of the new message ran inside the restore (the load runs its first chunk while
    the rows are read)."""
    fwd, tok = phases.get("forward_in_restore", 0.0), phases.get("tokenize_in_restore", 0.0)
    if not fwd:
        return f"tokenize {tok:,.1f} ms; the message's forward ran after it (not alongside)"
    return (f"the message's first chunk ran alongside the read: forward {fwd:,.1f} ms wall (waits for rows"
            f" included), tokenize {tok:,.1f} ms")


def _table(r: dict) -> str:
    def ok(flag: bool) -> str:
        return "ok" if flag else "MISSED"

    hot, evicted, evc = r["page_cache"]["hot"], r["page_cache"]["cold"], r["eviction"]
    ratio = r["restore_over_read"] or 0.0
    took = {True: "took", False: "DID NOT TAKE", None: "unknown (no mincore, no timing difference)"}[evc["took"]]
    resident = "n/a" if evc["resident_after"] is None else f"{evc['resident_after']:.1%} resident"
    rows = [
        ("model", r["model"]),
        ("next prompt", f"{r['prompt_tokens']:,} tokens cold; from disk {r['cached_tokens']:,} cached + {r['suffix_tokens']:,} prefilled"),
        ("runs", f"{r['runs']} (medians)"),
        ("cold TTFT", f"{r['cold_ttft_ms']:,.0f} ms"),
        (".kv file", human_bytes(r["kv_bytes"])),
    ]
    for name, row, goal in (("page cache hot", hot, GOAL_SPEEDUP_HOT), ("page cache cold", evicted, GOAL_SPEEDUP)):
        speedup = row["speedup"] or 0.0
        rows += [
            (f"{name}: hit TTFT", f"{row['ttft_ms']:,.1f} ms  ({speedup:,.0f}x faster; goal >= {goal:.0f}x: {ok(speedup >= goal)})"),
            ("  send to first token", f"{row['send_ttft_ms']:,.1f} ms: "
                                      f"{'restore + forward' if row['phases_ms'].get('forward_in_restore') else 'restore'}"
                                      f" {row['restore_ms']:,.1f} ms + fixed part "
                                      f"{row['fixed_ms']:,.1f} ms (goal <= {GOAL_FIXED_MS:.0f}: {ok(row['fixed_ms'] <= GOAL_FIXED_MS)})"),
            ("  restore alone", f"{row['restore_alone_ms']:,.1f} ms (the same file again after the send, no forward"
                                f" alongside, page cache as before the send)"),
            ("  phases", ", ".join(f"{k} {v:,.1f}" for k, v in row["phases_ms"].items()
                                   if k not in _PhaseTimers.INSIDE) + " ms"),
            ("  inside the restore", _inside(row["phases_ms"])),
        ]
    rows += [
        ("eviction", f"{took}: {resident} after fsync + POSIX_FADV_DONTNEED; raw read evicted "
                     f"{evc['raw_read_evicted_ms']:,.1f} ms vs cached {evc['raw_read_cached_ms']:,.1f} ms"),
        ("raw read (hot)", f"{r['raw_read_ms']:,.1f} ms  (restore/read {ratio:.2f}x; goal <= {GOAL_RESTORE_OVER_READ:.0f}x: {ok(ratio <= GOAL_RESTORE_OVER_READ)})"),
        ("next chat", f"restore {r['restore_prepared_ms']:,.1f} ms (into the buffer the engine prepared after the reply)"),
        ("into fresh memory", f"restore {r['restore_fresh_ms']:,.1f} ms, raw read {r['raw_read_fresh_ms']:,.1f} ms"),
        ("warm_up (both)", f"cold side {r['warm_up_ms']['cold']:,.0f} ms, hit side {r['warm_up_ms']['hit']:,.0f} ms (before the message)"),
        ("same first token", "yes" if r["same_first_token"] else "NO"),
    ]
    for name, key in (("regenerate", "regenerate"), ("edit at the middle", "edit_middle"), ("fork + message", "fork")):
        if r["moves"] is None:
            break
        m = r["moves"][key]
        rows.append((f"{name} TTFT", f"{m['ttft_ms']:,.1f} ms, prefilled {m['prefilled']:,}  "
                                     f"(cold prefill of the same text {m['cold_ttft_ms']:,.0f} ms)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
