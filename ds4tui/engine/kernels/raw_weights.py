"""GGUF tensors -> the raw weight blocks the kernels read (see qgemv.py, llama_step.py).

Owns: picking, per internal matrix of the llama layout (engine/llama/config.py) (layers.{i}.wqkv/wo/w13/w2, and the
head: "embed" when tied, else "lm_head"), the file's own blocks for every type the kernels
read (quants.BLOCK_TYPES: F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q4_K, Q5_K, Q6_K, IQ2_XXS),
applying the same row operations the fp32 conversion applies (q/k un-permutation, fusing
by stacking rows: a block never spans two rows), and how they travel in the converted
safetensors copy ("raw.<name>.<k>" uint8 tensors, one per row part, types in meta.json).
A fused matrix whose parts differ in type (Q4_K_M files keep V and down in Q6_K) is kept
as several parts; consecutive parts of one type are merged. A matrix with a part the
kernels cannot read (another type, rows that are not whole blocks) is left out whole: the
kernels then read its fp32 copy, which gguf's dequantize made. Leaves to the GGUF loader:
reading the GGUF and writing/reading the copy.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch

from ds4tui.engine.kernels.huge_pages import MoveInBackground
from ds4tui.engine.kernels.qgemv import MAX_PARTS, Part
from ds4tui.engine.kernels.quants import BLOCK_TYPES, QuantMix, from_gguf, quant_mix, row_bytes

PREFIX = "raw."

Unpermute = Callable[[np.ndarray, int], np.ndarray]


def matrix_parts(cfg) -> dict[str, list[tuple[str, int | None]]]:
    """Internal matrix name -> its GGUF tensors in row order, each with the head count its
    rows are un-permuted over (None: kept as is)."""
    out: dict[str, list[tuple[str, int | None]]] = {}
    for i in range(cfg.num_layers):
        b = f"blk.{i}."
        out[f"layers.{i}.wqkv"] = [(b + "attn_q.weight", cfg.num_heads), (b + "attn_k.weight", cfg.num_kv_heads),
                                   (b + "attn_v.weight", None)]
        out[f"layers.{i}.wo"] = [(b + "attn_output.weight", None)]
        out[f"layers.{i}.w13"] = [(b + "ffn_gate.weight", None), (b + "ffn_up.weight", None)]
        out[f"layers.{i}.w2"] = [(b + "ffn_down.weight", None)]
    if cfg.tie_word_embeddings:
        out["embed"] = [("token_embd.weight", None)]
    else:
        out["lm_head"] = [("output.weight", None)]
    return out


def gguf_raw_blocks(cfg, by_name: Mapping, unpermute: Unpermute) -> tuple[dict[str, torch.Tensor], dict[str, list[str]]]:
    """({"raw.<name>.<k>": uint8 [rows, row_bytes]}, {"<name>": [type of part k, ...]}).

    by_name: GGUF tensor name -> gguf ReaderTensor; unpermute(rows, n_heads) is the
    loader's q/k row un-permutation (it works on any [rows, ...] array)."""
    tensors: dict[str, torch.Tensor] = {}
    types: dict[str, list[str]] = {}

    def blocks(name: str) -> tuple[str, np.ndarray] | None:
        t = by_name.get(name)
        kind = from_gguf(t.tensor_type.name) if t is not None else None
        if kind not in BLOCK_TYPES:
            return None
        cols = int(t.shape[0])  # GGUF lists dimensions innermost first
        try:
            rb = row_bytes(kind, cols)
        except ValueError:  # not whole blocks: leave it to the fp32 copy
            return None
        return kind, np.asarray(t.data).view(np.uint8).reshape(-1, rb)  # F16 arrives as float16 [rows, cols]

    for ours, parts in matrix_parts(cfg).items():
        got = [blocks(name) for name, _ in parts]
        if any(g is None for g in got):
            continue
        merged: list[tuple[str, list[np.ndarray]]] = []
        for (kind, raw), (_, heads) in zip(got, parts):
            rows = raw if heads is None else unpermute(raw, heads)
            if merged and merged[-1][0] == kind:
                merged[-1][1].append(rows)
            else:
                merged.append((kind, [rows]))
        for k, (kind, arrays) in enumerate(merged):
            tensors[f"{PREFIX}{ours}.{k}"] = torch.from_numpy(np.ascontiguousarray(np.concatenate(arrays)))
        types[ours] = [kind for kind, _ in merged]
    return tensors, types


def gguf_quant_mix(tensors) -> QuantMix:
    """Which of a GGUF's 2-D tensors the kernels read as blocks, and which through the fp32
    fallback (tensors: gguf ReaderTensors)."""
    return quant_mix((t.tensor_type.name, int(t.shape[0])) for t in tensors if len(t.shape) >= 2)


def split_raw(tensors: dict[str, torch.Tensor], types: Mapping[str, list[str]]) -> dict[str, list[Part]]:
    """Remove the "raw.*" entries from a loaded copy's tensors; return {name: [(type, blocks)]}.

    A matrix whose parts do not all check out (a damaged or foreign meta.json) is dropped:
    the kernels then read its fp32 weights, which are always there."""
    raw_keys = [k for k in tensors if k.startswith(PREFIX)]
    found = {k: tensors.pop(k) for k in raw_keys}
    raw: dict[str, list[Part]] = {}
    for name, kinds in types.items():
        if not isinstance(kinds, list) or not 1 <= len(kinds) <= MAX_PARTS:
            continue
        parts = [(kind, found.get(f"{PREFIX}{name}.{k}")) for k, kind in enumerate(kinds)]
        if all(kind in BLOCK_TYPES and t is not None and t.dtype == torch.uint8 and t.dim() == 2 for kind, t in parts):
            raw[name] = parts
    return raw


def move_raw_into_huge_pages(raw: dict[str, list[Part]], path) -> MoveInBackground:
    """The move of split_raw's blocks, views of the converted copy at `path`, into huge pages
    where they lie (huge_pages.py: decode streams them every token; addresses do not change,
    so nothing that points at them needs to know), ready to start."""
    return MoveInBackground(path, {f"{PREFIX}{name}.{k}": blocks
                                   for name, parts in raw.items() for k, (_, blocks) in enumerate(parts)},
                            start=False)
