"""`ds4tui bench checksum`: what the .kv checksum costs a restore.

One session of the chosen llama-family model is filled with N tokens of random
KV state (restore time depends on sizes, not on values) and saved twice: once
as ds4tui writes it (checksum trailer) and once with the trailer stripped
(what a file written before checksums looks like). Each run restores both
through the store (`KvStore.load_file`, the chat's resume path) into the same
session, alternating which goes first; the table gives medians. For scale it
also times a separate whole-file verification pass (what checking before
streaming would cost).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def add_bench_command(subparsers) -> None:
    p = subparsers.add_parser("checksum", help="restore time with and without the .kv checksum",
                              description="Restore time of one N-token session with and without the checksum trailer.")
    p.add_argument("--model", default="smollm2-135m-instruct", help="a llama-family model (default smollm2-135m-instruct)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens in the session (default 4096)")
    p.add_argument("--runs", type=int, default=9, help="restores of each file (default 9)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _strip_checksum(src: Path, dst_dir: Path) -> Path:
    from ds4tui.format.kvc import CHECKSUM_TRAILER_BYTES, EXT_CHECKSUM, OFFSET_EXT_FLAGS

    raw = bytearray(src.read_bytes()[:-CHECKSUM_TRAILER_BYTES])
    raw[OFFSET_EXT_FLAGS] &= ~EXT_CHECKSUM & 0xFF
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / src.name
    dst.write_bytes(bytes(raw))
    return dst


def run(args: argparse.Namespace) -> int:
    """Long because it is one measurement read top to bottom: the setup, the timed runs, the figures, in the
    order they happen."""
    import torch

    from ds4tui.cache.integrity import verify_file
    from ds4tui.format.kvc import read_kvc
    from ds4tui.cache.safe_open import open_regular
    from ds4tui.cache.store import KvStore
    from ds4tui.chat.checkpoints import Checkpoints
    from ds4tui.cache.policy import CachePolicy
    from ds4tui.engine.loader import load_model

    model = load_model(args.model)
    ctx = args.tokens + 64
    session = model.new_session(ctx)
    if not hasattr(session, "kv"):
        raise SystemExit("bench checksum needs a llama-family model")
    gen = torch.Generator().manual_seed(0)
    t = args.tokens
    session.tokens = torch.randint(0, session.model.cfg.vocab_size, (t,), generator=gen).tolist()
    session.logits = torch.randn(session.model.cfg.vocab_size, generator=gen)
    session.kv[:, :, :, :t].normal_(generator=gen)
    with tempfile.TemporaryDirectory() as tmp:
        with_dir, without_dir = Path(tmp) / "with", Path(tmp) / "without"
        cp = Checkpoints(model, with_dir, CachePolicy(budget_mb=1 << 20), ctx_size=ctx)
        sha = cp.save(session, b"x" * t, "shutdown", lambda ev: None, title="bench", created_at=1)
        path = with_dir / f"{sha}.kv"
        _strip_checksum(path, without_dir)
        acceptor = cp.acceptor(session)

        def restore(directory: Path) -> tuple[float, float]:
            store = KvStore(directory, budget_mb=1 << 20)
            t0, c0 = time.perf_counter(), time.thread_time()
            res = store.load_file(sha, acceptor, lambda fp, n: (session.load_payload(fp, n), len(session.tokens))[1])
            ms, cpu_ms = (time.perf_counter() - t0) * 1000, (time.thread_time() - c0) * 1000
            if res.hit is None:
                raise SystemExit(f"restore failed: {res.event}")
            return ms, cpu_ms

        def verify_pass() -> float:
            t0 = time.perf_counter()
            with open_regular(path) as fp:
                kf = read_kvc(fp)
                assert verify_file(fp, kf) == "ok"
            return (time.perf_counter() - t0) * 1000

        for d in (with_dir, without_dir):
            restore(d)  # warm: page cache, first-use costs
        on, off, passes = [], [], []
        for i in range(args.runs):
            order = (with_dir, without_dir) if i % 2 == 0 else (without_dir, with_dir)
            for d in order:
                (on if d == with_dir else off).append(restore(d))
            passes.append(verify_pass())
        file_bytes = os.path.getsize(path)
    med_on, med_off = (statistics.median(r[0] for r in x) for x in (on, off))
    cpu_on, cpu_off = (statistics.median(r[1] for r in x) for x in (on, off))
    med_pass = statistics.median(passes)
    row = {
        "model": args.model, "tokens": t, "file_mib": round(file_bytes / 2**20, 1), "runs": args.runs,
        "restore_ms_with_checksum": round(med_on, 1), "restore_ms_without": round(med_off, 1),
        "checksum_cost_ms": round(med_on - med_off, 1),
        "checksum_cost_percent": round(100 * (med_on - med_off) / med_off, 1),
        # CPU time of the restoring thread: what the checksum adds when the host is busy
        # (wall time then mostly measures waiting for a core).
        "restore_cpu_ms_with_checksum": round(cpu_on, 1), "restore_cpu_ms_without": round(cpu_off, 1),
        "checksum_cpu_percent": round(100 * (cpu_on - cpu_off) / cpu_off, 1),
        "separate_verify_pass_ms": round(med_pass, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    width = max(len(k) for k in row)
    for k, v in row.items():
        print(f"{k:<{width}}  {v}")
    return 0
