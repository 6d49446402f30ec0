"""GGUF tensors -> the raw weight blocks the fused decode step reads (see llama_step.py).

Owns: picking, per internal matrix of engine/llama/config.py (layers.{i}.wqkv/wo/w13/w2, and the head:
"embed" when tied, else "lm_head"), the file's own blocks when every part has one type the
kernels read (Q4_1, Q8_0, F16), applying the same row operations the fp32 conversion
applies (q/k un-permutation, fusing by stacking rows: a block never spans two rows), and
how they travel in the converted safetensors copy ("raw.<name>" uint8 tensors, types in
meta.json). Leaves to gguf_loader.py: reading the GGUF and writing/reading the copy.
A matrix whose parts differ in type, or use another type, is left out: the step then
reads the fp32 copy of it.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch

from ds4tui.engine.kernels.qgemv import row_bytes

PREFIX = "raw."
# GGML type names (GGMLQuantizationType.name) -> our type names.
GGUF_TYPES = {"Q4_1": "q4_1", "Q8_0": "q8_0", "F16": "f16"}

Unpermute = Callable[[np.ndarray, int], np.ndarray]


def gguf_raw_blocks(cfg, by_name: Mapping, unpermute: Unpermute) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """({"raw.<name>": uint8 [rows, row_bytes]}, {"<name>": type}) for a llama GGUF.

    by_name: GGUF tensor name -> gguf ReaderTensor; unpermute(rows, n_heads) is the
    loader's q/k row un-permutation (it works on any [rows, ...] array)."""
    tensors: dict[str, torch.Tensor] = {}
    types: dict[str, str] = {}

    def blocks(name: str) -> tuple[str, np.ndarray] | None:
        t = by_name.get(name)
        kind = GGUF_TYPES.get(t.tensor_type.name) if t is not None else None
        if kind is None:
            return None
        data = np.asarray(t.data)
        cols = int(t.shape[0])  # GGUF lists dimensions innermost first
        try:
            rb = row_bytes(kind, cols)
        except ValueError:  # not whole blocks: leave it to the fp32 copy
            return None
        raw = data.view(np.uint8).reshape(-1, rb)  # F16 arrives as float16 [rows, cols]
        return kind, raw

    def put(ours: str, parts: list[tuple[str, int | None]]) -> None:
        got = [blocks(name) for name, _ in parts]
        if any(g is None for g in got) or len({g[0] for g in got}) != 1:
            return
        arrays = [g[1] if heads is None else unpermute(g[1], heads) for g, (_, heads) in zip(got, parts)]
        tensors[PREFIX + ours] = torch.from_numpy(np.ascontiguousarray(np.concatenate(arrays)))
        types[ours] = got[0][0]

    for i in range(cfg.num_layers):
        b = f"blk.{i}."
        put(f"layers.{i}.wqkv", [(b + "attn_q.weight", cfg.num_heads), (b + "attn_k.weight", cfg.num_kv_heads),
                                 (b + "attn_v.weight", None)])
        put(f"layers.{i}.wo", [(b + "attn_output.weight", None)])
        put(f"layers.{i}.w13", [(b + "ffn_gate.weight", None), (b + "ffn_up.weight", None)])
        put(f"layers.{i}.w2", [(b + "ffn_down.weight", None)])
    if cfg.tie_word_embeddings:
        put("embed", [("token_embd.weight", None)])
    else:
        put("lm_head", [("output.weight", None)])
    return tensors, types


def split_raw(tensors: dict[str, torch.Tensor], types: Mapping[str, str]) -> dict[str, tuple[str, torch.Tensor]]:
    """Remove the "raw.*" entries from a loaded copy's tensors; return {name: (type, blocks)}.

    Entries without a known type (a damaged or foreign meta.json) are dropped: the step
    then reads the fp32 weights, which are always there."""
    raw: dict[str, tuple[str, torch.Tensor]] = {}
    for key in [k for k in tensors if k.startswith(PREFIX)]:
        t = tensors.pop(key)
        kind = types.get(key[len(PREFIX):])
        if kind in GGUF_TYPES.values() and t.dtype == torch.uint8 and t.dim() == 2:
            raw[key[len(PREFIX):]] = (kind, t)
    return raw
