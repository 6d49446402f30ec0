"""`ds4tui bench reliability --mutants N`: seeded fault injection against the disk cache.

Real `.kv` files of the seeded tiny-llama model (an untitled checkpoint and a
titled session, each saved by the chat's `Checkpoints`) are mutated, one
mutant at a time, in a fresh directory under the original name. Each mutant
then goes through what ds4tui does with a file: `kv ls --verify` (the store's
verified listing), the titled-session list, and a restore into a fresh
session the way the chat does (prefix lookup for the untitled file, resume for
the titled one). Every step runs under an alarm.

Counted per mutant:
- crash: an exception escaped (anything but the chat's own refusal, EngineError);
- hang: a step outlived the alarm;
- silent wrong load: a restore succeeded but the session's tokens, KV rows,
  logits or the transcript differ from the original;
- write outside: a file outside the mutant's directory changed (a sentinel copy,
  and the target of the symlink mutants);
- leftover temp: a `*.tmp.*` file in the directory afterwards.

Mutation kinds cover the envelope (header fields, lengths, truncation,
extension), the text, the payload (token ids, logits, KV rows), NaN injected
with and without a recomputed checksum, the trailers, a ds4 hit's header
rewrite, and hostile entries (a FIFO and a symlink out of the directory).
The fast suite (`tests/reliability/test_fuzz.py`) runs every kind a few times.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import struct
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ALARM_S = 10
CTX = 256
OUTCOMES = ("crashes", "hangs", "silent wrong loads", "writes outside the dir", "leftover temp files")


@dataclass
class Original:
    """One saved file and the exact state it was saved from."""

    name: str
    data: bytes
    titled: bool
    text: bytes
    tokens: list[int]
    kv: object  # torch.Tensor [layers, 2, Hkv, T, D]
    logits: object  # torch.Tensor or None
    title: str | None = None


@dataclass
class Report:
    mutants: int = 0
    kinds: Counter = field(default_factory=Counter)
    results: Counter = field(default_factory=Counter)  # "rejected", "loaded intact", "listed only"
    bad: Counter = field(default_factory=Counter)  # OUTCOMES -> count
    examples: dict = field(default_factory=dict)  # outcome -> first (kind, seed, detail)
    seconds: float = 0.0

    def note(self, outcome: str, kind: str, seed: int, detail: str) -> None:
        self.bad[outcome] += 1
        self.examples.setdefault(outcome, (kind, seed, detail))

    def table(self) -> str:
        rows = [("mutants", self.mutants)] + [(o, self.bad[o]) for o in OUTCOMES]
        rows += [(f"  {k}", v) for k, v in sorted(self.results.items())]
        rows += [("seconds", f"{self.seconds:.1f}")]
        width = max(len(str(k)) for k, _ in rows)
        lines = [f"{k:<{width}}  {v:>8}" for k, v in rows]
        lines.append("kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(self.kinds.items())))
        for outcome, example in self.examples.items():
            lines.append(f"first {outcome}: kind {example[0]}, seed {example[1]}: {example[2]}")
        return "\n".join(lines)


class _Hang(Exception):
    pass


@contextmanager
def _alarm(seconds: int):
    def fire(*_):
        raise _Hang()
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- the corpus -------------------------------------------------------------------------------


def build_corpus(model, workdir: Path) -> list[Original]:
    """An untitled checkpoint and a titled session of `model`, saved as the chat saves them."""
    from ds4tui.cache.policy import CachePolicy
    from ds4tui.chat.checkpoints import Checkpoints

    cp = Checkpoints(model, workdir, CachePolicy(budget_mb=1024), ctx_size=CTX)
    out = []
    for titled, prompt in ((False, "The quick brown fox jumps over the lazy dog. " * 3),
                           (True, "Tell me something about the sea and its tides, please.")):
        session = model.new_session(CTX)
        tokens = model.tokenizer.encode(prompt)
        session.prefill(tokens)
        text = b"".join(model.tokenizer.token_bytes(t) for t in session.tokens)
        if titled:
            saved = cp.save_titled(session, text, lambda ev: None, title="the sea", created_at=1_700_000_000,
                                   owned_sha=None)
            sha = saved.sha
        else:
            sha = cp.save(session, text, "cold", lambda ev: None)
        t = len(session.tokens)
        out.append(Original(
            name=f"{sha}.kv", data=(workdir / f"{sha}.kv").read_bytes(), titled=titled, text=text,
            tokens=list(session.tokens), kv=session.kv[:, :, :, :t].clone(),
            logits=None if session.logits is None else session.logits.clone(),
            title="the sea" if titled else None,
        ))
    return out


# -- mutations ----------------------------------------------------------------------------------


def _layout(data: bytes) -> dict:
    from ds4tui.format.kvc import PREFIX_BYTES, parse_kvc

    kf = parse_kvc(data)
    t = kf.header.tokens
    p0 = PREFIX_BYTES + kf.header.text_bytes
    vocab = kf.payload_header.vocab_size
    layers = kf.payload_header.layer_count
    tokens_at = p0 + 52 + 32
    logits_at = tokens_at + 4 * t
    kv_at = logits_at + 4 * vocab + 8 * layers
    return {"text": (PREFIX_BYTES, p0), "tokens": (tokens_at, logits_at), "logits": (logits_at, logits_at + 4 * vocab),
            "kv": (kv_at, kf.header.body_bytes), "payload": (p0, kf.header.body_bytes),
            "trailers": (kf.header.body_bytes, len(data)), "header": (0, PREFIX_BYTES),
            "checksum_at": kf.checksum_offset}


def _flip(rng: random.Random, data: bytes, lo: int, hi: int, bits: int = 1) -> bytes:
    out = bytearray(data)
    for _ in range(bits):
        i = rng.randrange(lo, hi)
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _rechecksum(data: bytes) -> bytes:
    """The checksum recomputed over the (mutated) bytes: what a careful attacker would do."""
    import xxhash

    from ds4tui.format.kvc import encode_checksum

    at = _layout(data)["checksum_at"]
    return data[:at] + encode_checksum(xxhash.xxh3_64_intdigest(data[52:at])) + data[at + 12:]


def _nan(rng: random.Random, data: bytes, region: tuple[int, int]) -> bytes:
    lo, hi = region
    i = lo + 4 * rng.randrange((hi - lo) // 4)
    return data[:i] + struct.pack("<f", rng.choice([float("nan"), float("inf"), float("-inf")])) + data[i + 4:]


def _field(rng: random.Random, data: bytes) -> bytes:
    offset, fmt = rng.choice([(8, "<I"), (12, "<I"), (16, "<I"), (24, "<Q"), (32, "<Q"), (40, "<Q"), (48, "<I")])
    size = struct.calcsize(fmt)
    value = rng.choice([0, 1, 2**(8 * size) - 1, 2**31, rng.randrange(2**(8 * size)),
                        struct.unpack_from(fmt, data, offset)[0] + rng.choice([-1, 1])])
    value %= 2**(8 * size)
    return data[:offset] + struct.pack(fmt, value) + data[offset + size:]


def _byte(rng: random.Random, data: bytes) -> bytes:
    i = rng.choice([3, 4, 5, 6, 7, 20, 21])
    return data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]


def _ds4_hit(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    out[7] = 0
    out[20:24] = b"\0\0\0\0"
    struct.pack_into("<I", out, 12, struct.unpack_from("<I", out, 12)[0] + 1)
    return bytes(out)


def _strip_checksum(rng: random.Random, data: bytes) -> bytes:
    at = _layout(data)["checksum_at"]
    out = bytearray(data[:at] + data[at + 12:])
    out[6] &= ~0x40 & 0xFF
    return bytes(out)


def _region_flip(region: str, bits: int = 1):
    def mutate(rng, data):
        lo, hi = _layout(data)[region]
        return _flip(rng, data, lo, hi, bits) if hi > lo else data
    return mutate


MUTATIONS = {
    "flip-anywhere": lambda rng, d: _flip(rng, d, 0, len(d), rng.randint(1, 4)),
    "flip-header": _region_flip("header"),
    "flip-text": _region_flip("text"),
    "flip-token-ids": _region_flip("tokens"),
    "flip-logits": _region_flip("logits"),
    "flip-kv-rows": _region_flip("kv"),
    "flip-payload-many": _region_flip("payload", 16),
    "flip-trailers": _region_flip("trailers"),
    "nan-kv": lambda rng, d: _nan(rng, d, _layout(d)["kv"]),
    "nan-logits": lambda rng, d: _nan(rng, d, _layout(d)["logits"]),
    "nan-kv-rechecksummed": lambda rng, d: _rechecksum(_nan(rng, d, _layout(d)["kv"])),
    "header-field": _field,
    "header-byte": _byte,
    "truncate": lambda rng, d: d[:rng.randrange(len(d))],
    "extend": lambda rng, d: d + rng.randbytes(rng.choice([1, 7, 100, 5000])),
    "zero-range": lambda rng, d: (lambda i, n: d[:i] + bytes(n) + d[i + n:])(rng.randrange(len(d)),
                                                                           rng.choice([4, 64, 4096])),
    "text-bytes-4gib": lambda rng, d: d[:48] + struct.pack("<I", 2**32 - 1) + d[52:],
    "ds4-hit": _ds4_hit,
    "strip-checksum": _strip_checksum,
    "fifo": None,  # hostile entries: handled by _place
    "symlink-out": None,
}


# -- one mutant ---------------------------------------------------------------------------------


def _place(kind: str, data: bytes, directory: Path, name: str, outside: Path) -> None:
    path = directory / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink-out":
        os.symlink(outside, path)
    else:
        path.write_bytes(data)


def _same_state(session, orig: Original) -> str | None:
    import torch

    t = len(orig.tokens)
    if session.tokens != orig.tokens:
        return "tokens differ"
    if not torch.equal(session.kv[:, :, :, :t], orig.kv):
        return "KV rows differ"
    if (session.logits is None) != (orig.logits is None):
        return "logits presence differs"
    if orig.logits is not None and not torch.equal(session.logits, orig.logits):
        return "logits differ"
    return None


def run_mutant(model, orig: Original, kind: str, seed: int, root: Path, report: Report) -> None:
    """Long because one mutant's trial is one sequence: mutate, load, compare with the oracle, classify."""
    from ds4tui.cache.policy import CachePolicy
    from ds4tui.cache.store import KvStore
    from ds4tui.chat.checkpoints import Checkpoints
    from ds4tui.engine.errors import EngineError

    rng = random.Random(seed)
    mutate = MUTATIONS[kind]
    data = orig.data if mutate is None else mutate(rng, orig.data)
    work = root / f"m{seed}"
    directory, outside = work / "kv", work / "outside"
    directory.mkdir(parents=True)
    outside.mkdir()
    sentinel = outside / orig.name  # a real file outside: the symlink mutants point at it
    sentinel.write_bytes(orig.data)
    _place(kind, data, directory, orig.name, sentinel)
    report.mutants += 1
    report.kinds[kind] += 1
    result = "listed only"
    try:
        with _alarm(ALARM_S):
            KvStore(directory).entries(verify=True)
            cp = Checkpoints(model, directory, CachePolicy(budget_mb=1024), ctx_size=CTX)
            session = model.new_session(CTX)
            if orig.titled:
                listed = cp.titled_sessions(with_problems=True)
                match = [s for s in listed if s.sha == orig.name[:40] and s.problem is None]
                text = None
                if match:
                    try:
                        text = cp.load_saved(match[0], session, lambda ev: None)
                    except EngineError:
                        text = None
                if text is None:
                    result = "rejected"
                else:
                    wrong = _same_state(session, orig) or (None if text == orig.text else "transcript differs")
                    if wrong:
                        report.note("silent wrong loads", kind, seed, wrong)
                    result = "loaded intact" if not wrong else "loaded WRONG"
            else:
                covered = cp.restore_longest(orig.text + b" and then", session, lambda ev: None)
                if covered == 0:
                    result = "rejected"
                else:
                    wrong = _same_state(session, orig) or (None if covered == len(orig.text) else "coverage differs")
                    if wrong:
                        report.note("silent wrong loads", kind, seed, wrong)
                    result = "loaded intact" if not wrong else "loaded WRONG"
    except _Hang:
        report.note("hangs", kind, seed, f"a step blocked for {ALARM_S} s")
        result = "hang"
    except Exception as exc:  # noqa: BLE001 - counting them is the point
        report.note("crashes", kind, seed, f"{type(exc).__name__}: {exc}")
        result = "crash"
    report.results[result] += 1
    if sentinel.read_bytes() != orig.data or sorted(os.listdir(outside)) != [orig.name]:
        report.note("writes outside the dir", kind, seed, "the file outside the directory changed")
    left = [n for n in os.listdir(directory) if ".tmp." in n]
    if left:
        report.note("leftover temp files", kind, seed, ", ".join(left))
    shutil.rmtree(work)


def run(mutants: int, seed: int = 0, model=None, progress=None) -> Report:
    """`mutants` mutants, kinds and originals taken in turn, each seeded from `seed`."""
    from ds4tui.engine.loader import load_model

    model = model or load_model("tiny-llama")
    report = Report()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = build_corpus(model, root / "corpus")
        kinds = list(MUTATIONS)
        for i in range(mutants):
            kind = kinds[i % len(kinds)]
            orig = corpus[(i // len(kinds)) % len(corpus)]
            run_mutant(model, orig, kind, seed * 1_000_003 + i, root, report)
            if progress and (i + 1) % 500 == 0:
                progress(i + 1, report)
    report.seconds = time.perf_counter() - t0
    return report


def add_bench_command(subparsers) -> None:
    p = subparsers.add_parser("reliability", help="fault injection against the disk cache (mutated .kv files)",
                              description="Mutate real .kv files of the tiny-llama model and count crashes, hangs, "
                                          "silent wrong loads, writes outside the directory and leftover temp files.")
    p.add_argument("--mutants", type=int, default=1000, help="number of mutants (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the run (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    import sys

    def progress(done: int, report: Report) -> None:
        print(f"{done} mutants, {sum(report.bad.values())} bad", file=sys.stderr, flush=True)

    report = run(args.mutants, args.seed, progress=progress)
    if args.json:
        print(json.dumps({"mutants": report.mutants, **{o: report.bad[o] for o in OUTCOMES},
                          "results": dict(report.results), "kinds": dict(report.kinds),
                          "examples": report.examples, "seconds": round(report.seconds, 1)}, indent=2))
    else:
        print(report.table())
    return 1 if sum(report.bad.values()) else 0
