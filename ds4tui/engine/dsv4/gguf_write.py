"""Write a DeepSeek V4 GGUF in ds4's layout (gguf_layout.py) from canonical float tensors.

Owns `write_dsv4_gguf`: the `deepseek4.*` metadata of a Dsv4Config, the tokenizer
(`tokenizer.ggml.*`: byte-level BPE vocabulary, merges, token types, pre-tokenizer
"joyai-llm" as ds4's files declare), and every tensor in the type ds4's layout gives it,
routed experts in a recipe's types (Q2_RECIPE: gate/up IQ2_XXS, down Q2_K), quantized by
kernels/quants.py (gguf's Q8_0, simple_quants' Q2_K and IQ2_XXS). It returns the values the
file now holds (the blocks dequantized), so a test can build the same model from
safetensors and compare. For tests and for sliced true-shape files; ds4's own quantizer
writes the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from ds4tui.engine.dsv4 import gguf_layout as L
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.kernels import quants

TOKEN_NORMAL, TOKEN_CONTROL = 1, 3


def add_metadata(writer, cfg: Dsv4Config) -> None:
    """The `deepseek4.*` keys of `cfg` (and the values ds4 fixes)."""
    from gguf import GGUFValueType as V

    values = {
        "attention.head_count_kv": 1, "attention.value_length": cfg.head_dim, "expert_weights_norm": True,
        "swiglu_clamp_exp": [float(cfg.swiglu_limit)] * cfg.num_hidden_layers,
    }
    for key, kind, name in L.METADATA:
        value = values[key] if name is None or key == "swiglu_clamp_exp" else getattr(cfg, name)
        full = L.P + key
        if kind == "u32":
            writer.add_uint32(full, int(value))
        elif kind == "u64":
            writer.add_uint64(full, int(value))
        elif kind == "f32":
            writer.add_float32(full, float(value))
        elif kind == "bool":
            writer.add_bool(full, bool(value))
        elif kind == "u32[]":
            writer.add_key_value(full, [int(v) for v in value], V.ARRAY, sub_type=V.UINT32)
        elif kind == "f32[]":
            writer.add_key_value(full, [float(v) for v in value], V.ARRAY, sub_type=V.FLOAT32)


def add_vocab(writer, tokens: list[str], types: list[int], merges: list[str], cfg: Dsv4Config) -> None:
    """`tokenizer.ggml.*` of a byte-level BPE (ds4's files: model gpt2, pre-tokenizer joyai-llm)."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("joyai-llm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if cfg.bos_token_id is not None:
        writer.add_bos_token_id(int(cfg.bos_token_id))
    if cfg.eos_ids:
        writer.add_eos_token_id(int(cfg.eos_ids[0]))


def _tokenizer(writer, tok, cfg: Dsv4Config) -> None:
    """tok: a `tokenizers.Tokenizer` (byte-level BPE) whose added special tokens are control tokens."""
    model = json.loads(tok.to_str())["model"]
    if model.get("type") != "BPE":
        raise ValueError("the GGUF writer takes a byte-level BPE tokenizer")
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    add_vocab(writer, tokens, [TOKEN_CONTROL if t in special else TOKEN_NORMAL for t in tokens], merges, cfg)


def _encode(w: torch.Tensor, kind: str) -> tuple[np.ndarray, object, torch.Tensor]:
    """(array to write, raw GGML type or None, the values it holds as float32 [or int64])."""
    from gguf import GGMLQuantizationType

    if kind == "F32":
        return w.float().numpy(), None, w.float()
    if kind == "F16":
        h = w.half()
        return h.numpy(), None, h.float()
    if kind == "I32":
        return w.to(torch.int32).numpy(), None, w.to(torch.int64)
    qtype = kind.lower()
    flat = w.float().reshape(-1, w.shape[-1])
    blocks = quants.quantize(flat, qtype)
    held = quants.dequantize(blocks, qtype, flat.shape[1]).reshape(w.shape)
    return blocks.numpy().reshape(*w.shape[:-1], -1), GGMLQuantizationType[kind], held


def write_dsv4_gguf(path: str | Path, cfg: Dsv4Config, tensors: Mapping[str, torch.Tensor], tokenizer,
                    recipe: Mapping[str, str] = L.Q2_RECIPE, name: str = "ds4tui test model") -> dict[str, torch.Tensor]:
    """Write `tensors` (canonical names, as tiny.random_tensors makes them) to `path`; returns
    canonical name -> the values stored (float32; tid2eid int64)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), L.ARCH)
    writer.add_name(name)
    add_metadata(writer, cfg)
    _tokenizer(writer, tokenizer, cfg)
    held: dict[str, torch.Tensor] = {}
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for canon in sorted(tensors):
        m = L.EXPERT_RE.match(canon)
        if m:
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = tensors[canon]
            continue
        g = L.gguf_name(canon)
        if g is None:
            raise ValueError(f"{canon}: no place in ds4's layout")
        arr, raw, value = _encode(tensors[canon], L.tensor_types(g)[0])
        writer.add_tensor(g, arr, raw_dtype=raw)
        held[canon] = value
    for (li, w), by_id in sorted(experts.items()):
        stack = torch.stack([by_id[e] for e in range(len(by_id))])  # [E, rows, cols]
        arr, raw, value = _encode(stack, recipe[w])
        writer.add_tensor(f"blk.{li}.{L.EXPERTS[w]}", arr, raw_dtype=raw)
        for e in range(stack.shape[0]):
            held[f"layers.{li}.ffn.experts.{e}.{w}.weight"] = value[e]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held
