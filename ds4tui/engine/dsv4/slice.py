"""True-shape DeepSeek V4 Flash slices: ds4's GGUF with the real shapes and N layers, seeded.

Owns the slice's plan (`slice_plan`: every tensor ds4's loader binds for N layers, in ds4's
order, with V4 Flash's shapes and the types of ds4's Q2 file
DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8: routed gate/up IQ2_XXS, down Q2_K,
attention projections, shared experts and the output head Q8_0, HC / compressor /
indexer / router matrices and the embedding F16, vectors F32, tid2eid I32) and
`write_slice`, which streams it to disk: the header and vocabulary first (gguf's writer),
then each tensor's bytes drawn chunk by chunk (slice_blocks.py), so memory stays at a few
chunks whatever the file's size (~2 GB per layer plus 1.6 GB of embedding and head). The
file is written beside its target and renamed into place when complete.

Seeds are per tensor (the seed and the tensor's name), so layer 0 of a 1-layer and a
4-layer slice hold the same bytes. The metadata is V4 Flash's except `block_count` (and
the per-layer arrays' length): ds4 runs a slice when built with DS4_N_LAYER set to N.

CLI: python -m ds4tui.engine.dsv4.slice --layers 2 --out /tmp/v4slice.gguf
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np

from ds4tui.engine.dsv4 import gguf_layout as L
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.dsv4.slice_blocks import random_rows
from ds4tui.engine.dsv4.slice_vocab import V4_VOCAB, slice_vocab
from ds4tui.engine.dsv4.weights import expected_shapes
from ds4tui.engine.kernels import quants

SEED = 4_2026
CHUNK_VALUES = 4 << 20  # weights drawn per chunk: ~16 MB of float32 scratch
GROUP_VALUES = 1 << 16  # weights per seeded group of rows
DROP_EVERY = 256 << 20  # bytes written between flushing the file out of the page cache


@dataclass(frozen=True)
class SliceTensor:
    name: str  # GGUF name
    shape: tuple[int, ...]  # PyTorch order: (..., rows, cols)
    kind: str  # GGML type name
    init: tuple  # ("normal", mean, std), ("rms", std) or ("tid2eid", n_experts)

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        if self.kind in ("F32", "I32"):
            return 4 * self.cols
        return quants.row_bytes(self.kind.lower(), self.cols)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


def slice_config(layers: int) -> Dsv4Config:
    """V4 Flash's config with `layers` layers (ds4's compress-ratio schedule, hash layers first)."""
    if layers < 1:
        raise ValueError("a slice has at least one layer")
    return Dsv4Config(num_hidden_layers=layers)


def _init(g: str, shape: tuple[int, ...], kind: str, n_experts: int) -> tuple:
    """Weight scales that keep activations O(1), as the tiny model's (tiny.random_tensors)."""
    suffix = g.split(".", 2)[2] if g.startswith("blk.") else g
    if kind == "I32":
        return ("tid2eid", n_experts)
    if g == "token_embd.weight":
        return ("normal", 0.0, 1.0)
    if len(shape) == 1:
        if suffix.endswith("norm.weight") or suffix.endswith("_scale.weight"):
            return ("normal", 1.0, 0.1)
        if suffix == "attn_sinks.weight":
            return ("normal", 0.0, 0.5)
        return ("normal", 0.0, 0.1)  # HC bases, the router bias
    if suffix.endswith("_ape.weight"):
        return ("normal", 0.0, 0.5)
    std = float(shape[-1]) ** -0.5  # projections [out, in]: unit-variance outputs
    return ("rms", std) if kind in ("IQ2_XXS", "Q2_K") else ("normal", 0.0, std)


def slice_plan(cfg: Dsv4Config, recipe: Mapping[str, str] = L.Q2_RECIPE) -> list[SliceTensor]:
    """Every tensor of the file in write order: the embedding, each layer, the output head."""
    shapes, optional = expected_shapes(cfg)
    seen: dict[str, SliceTensor] = {}
    for canon in sorted(shapes, key=_order_key):
        if canon in optional:
            continue  # the router bias of hash layers: ds4 reads it only to select, hash layers do not
        g = L.gguf_name(canon)
        if g is None or g in seen:
            continue
        m = L.EXPERT_RE.match(canon)
        if m:
            shape, kind = (cfg.n_routed_experts, *shapes[canon]), recipe[m.group(3)]
        else:
            shape, kind = shapes[canon], L.tensor_types(g)[0]
        seen[g] = SliceTensor(g, tuple(int(d) for d in shape), kind, _init(g, shape, kind, cfg.n_routed_experts))
    return list(seen.values())


def _order_key(canon: str) -> tuple:
    if canon == "embed.weight":
        return (0, 0, canon)
    if canon.startswith("layers."):
        return (1, int(canon.split(".")[1]), canon)
    return (2, 0, canon)


def _group_rows(t: SliceTensor) -> int:
    return max(1, GROUP_VALUES // t.cols)


def _draw(t: SliceTensor, seed: int, group: int, rows: int) -> np.ndarray:
    # one generator per group of rows: the bytes depend on the seed and the name only, not
    # on how many groups a chunk holds
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode()), group])
    if t.init[0] == "tid2eid":
        # distinct experts per token: the first k of a random permutation
        return np.argsort(rng.random((rows, t.init[1])), axis=1)[:, :t.cols].astype(np.int32)
    return random_rows(rng, t.kind, rows, t.cols, t.init)


def tensor_chunks(t: SliceTensor, seed: int, chunk_values: int = CHUNK_VALUES) -> Iterator[np.ndarray]:
    """The tensor's bytes, a few MB at a time (contiguous arrays, in row order)."""
    g_rows = _group_rows(t)
    per_chunk = max(1, chunk_values // (g_rows * t.cols))
    n_groups = -(-t.rows // g_rows)
    for first in range(0, n_groups, per_chunk):
        parts = [_draw(t, seed, g, min(g_rows, t.rows - g * g_rows)) for g in range(first, min(first + per_chunk, n_groups))]
        yield parts[0] if len(parts) == 1 else np.concatenate(parts)


def _tensor_info(writer, t: SliceTensor) -> None:
    from gguf import GGMLQuantizationType

    if t.kind in ("F32", "F16", "I32"):
        dtype = {"F32": np.float32, "F16": np.float16, "I32": np.int32}[t.kind]
        writer.add_tensor_info(t.name, t.shape, np.dtype(dtype), t.nbytes)
    else:
        writer.add_tensor_info(t.name, (*t.shape[:-1], t.row_bytes), np.dtype(np.uint8), t.nbytes,
                               raw_dtype=GGMLQuantizationType[t.kind])


def _pad(f, align: int) -> None:
    gap = -f.tell() % align
    if gap:
        f.write(b"\0" * gap)


def write_slice(path: str | Path, cfg: Dsv4Config, *, seed: int = SEED, recipe: Mapping[str, str] = L.Q2_RECIPE,
                vocab_size: int = V4_VOCAB, progress: Callable[[int, int, str], None] | None = None,
                chunk_values: int = CHUNK_VALUES, drop_cache: bool = True) -> int:
    """Write the slice GGUF of `cfg` to `path`; returns its size in bytes. `progress(done,
    total, tensor)` is called after each chunk. drop_cache flushes written data out of the
    page cache every DROP_EVERY bytes, so writing 5 GB does not evict everyone else's pages."""
    import gguf

    from ds4tui.engine.dsv4.gguf_write import add_metadata, add_vocab

    path = Path(path)
    plan = slice_plan(cfg, recipe)
    total = sum(t.nbytes for t in plan)
    free = shutil.disk_usage(path.parent).free
    if free < total + (256 << 20):
        raise OSError(f"{path.parent}: {free / 2**30:.1f} GiB free, the slice needs {total / 2**30:.1f} GiB")
    tokens, types, merges = slice_vocab(vocab_size, seed)
    tmp = path.with_name(path.name + ".part")
    try:
        writer = gguf.GGUFWriter(str(tmp), L.ARCH)
        writer.add_name(f"DeepSeek V4 Flash true-shape slice, {cfg.num_hidden_layers} layers, seed {seed} (ds4tui)")
        add_metadata(writer, cfg)
        add_vocab(writer, tokens, types, merges, cfg)
        for t in plan:
            _tensor_info(writer, t)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        align = writer.data_alignment
        writer.close()
        done = since_drop = 0
        with open(tmp, "r+b") as f:
            f.seek(0, os.SEEK_END)
            for t in plan:
                _pad(f, align)
                written = 0
                for chunk in tensor_chunks(t, seed, chunk_values):
                    f.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
                    written += chunk.nbytes
                    done += chunk.nbytes
                    since_drop += chunk.nbytes
                    if drop_cache and since_drop >= DROP_EVERY:
                        f.flush()
                        os.fdatasync(f.fileno())
                        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                        since_drop = 0
                    if progress is not None:
                        progress(done, total, t.name)
                if written != t.nbytes:
                    raise AssertionError(f"{t.name}: wrote {written} bytes, planned {t.nbytes}")
            _pad(f, align)
            f.flush()
            os.fsync(f.fileno())
            if drop_cache:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def plan_table(plan: list[SliceTensor]) -> str:
    """Bytes by type (and by role: routed experts, the rest of a layer, embedding + head)."""
    by_kind: dict[str, int] = {}
    for t in plan:
        by_kind[t.kind] = by_kind.get(t.kind, 0) + t.nbytes
    lines = [f"  {k:8s} {v / 2**30:8.2f} GiB" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ds4tui.engine.dsv4.slice",
                                 description="Write a DeepSeek V4 Flash GGUF in ds4's Q2 layout with the real shapes, "
                                             "N layers and seeded random weights.")
    ap.add_argument("--layers", type=int, default=2, help="layers (ds4 runs it when built with DS4_N_LAYER=N; default 2)")
    ap.add_argument("--out", type=Path, help="the GGUF to write (keep it out of the repository, e.g. /tmp/v4slice.gguf)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--force", action="store_true", help="replace an existing file")
    ap.add_argument("--plan", action="store_true", help="print the tensors' sizes and write nothing")
    args = ap.parse_args(argv)
    try:
        cfg = slice_config(args.layers)
    except ValueError as exc:
        print(f"slice: {exc}", file=sys.stderr)
        return 2
    plan = slice_plan(cfg)
    total = sum(t.nbytes for t in plan)
    print(f"{args.layers} layers, {len(plan)} tensors, {total / 2**30:.2f} GiB ({total:,} bytes)")
    print(plan_table(plan))
    if args.plan:
        return 0
    if args.out is None:
        print("slice: --out is required (or --plan)", file=sys.stderr)
        return 2
    if args.out.exists() and not args.force:
        print(f"slice: {args.out} exists (--force replaces it)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    last = [0.0]

    def report(done: int, all_: int, name: str) -> None:
        now = time.monotonic()
        if now - last[0] >= 2.0 or done == all_:
            last[0] = now
            rate = done / max(now - t0, 1e-9) / 2**20
            print(f"\r{done / 2**30:6.2f} / {all_ / 2**30:.2f} GiB  {rate:6.0f} MiB/s  {name:40s}", end="", flush=True)

    try:
        size = write_slice(args.out, cfg, seed=args.seed, progress=report)
    except (OSError, ValueError) as exc:
        print(f"\nslice: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nslice: interrupted, nothing written", file=sys.stderr)
        return 130
    print(f"\nwrote {args.out} ({size:,} bytes) in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
