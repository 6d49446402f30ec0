"""GGUF (llama architecture) -> LlamaModel, through a converted fp32 cache for fast starts.

Owns: reading a GGUF with the `gguf` package (metadata, tokenizer, tensors
dequantized by `gguf.quants.dequantize`), undoing llama.cpp's q/k row permutation,
building the byte-level BPE tokenizer from the GGUF vocab, and the converted cache.

Why a converted cache: `GGUFReader` spends seconds parsing the 49k tokenizer strings
and dequantizing takes seconds more, on every start (docs/perf.md, "GGUF start-up and
the converted copy"). The first load therefore writes
`data_dir()/converted/<sha256[:16]>-v<version>/` = model.safetensors (fp32, the internal fused
layout of engine/llama/config.py) + tokenizer.json + meta.json (written last, in a temp dir renamed
into place); later loads memory-map that copy. The key is the GGUF's SHA-256, which
`file_sha256` memoizes by (path, size, mtime) so a start does not hash 98 MB.
Files of a converted copy are never modified in place, only replaced (rename) or
unlinked: a loaded model memory-maps them, and truncating a mapped file kills the
process with SIGBUS on its next weight read.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ds4tui import paths
from ds4tui.engine.text.hf_tokenizer import ChatMLTemplate, HFTokenizer
from ds4tui.engine.kernels.quants import BLOCK_TYPES, QuantMix, gguf_name
from ds4tui.engine.kernels.raw_weights import gguf_quant_mix, gguf_raw_blocks, split_raw
from ds4tui.engine.llama.config import LlamaConfig, expected_shapes
from ds4tui.engine.llama.model import LlamaModel
from ds4tui.engine.llama.weights import chat_for, eos_ids_for, file_sha256, make_info
from ds4tui.engine.errors import WeightsError

# Bump when the converted layout or the conversion changes: old copies are then rebuilt.
# 3: the copy also holds the file's raw weight blocks for the fused decode step.
# 4: blocks of every kernel type, as row parts ("raw.<name>.<k>"); the quant mix in meta.json.
CONVERT_VERSION = 4
_CONVERT_LOCK = threading.Lock()

# GGUF token_type values (llama.cpp's llama_token_type).
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4


def converted_dir(sha256: str) -> Path:
    """Named by the GGUF's hash and the conversion version, so copies of two versions (two
    checkouts sharing the data dir) coexist instead of replacing each other on every load."""
    return paths.data_dir() / "converted" / f"{sha256[:16]}-v{CONVERT_VERSION}"


# progress(what, fraction): the one-time conversion's progress, `what` naming the model
# (the GGUF's file name up to its first dot, e.g. "SmolLM2-135M-Instruct"), fraction 0..1.
ConvertProgress = Callable[[str, float], None]


def load_llama_gguf(path: str | Path, name: str, progress: ConvertProgress | None = None) -> LlamaModel:
    """A llama-family GGUF (converted once to a cached fp32 copy, memory-mapped after).
    `progress` hears about the conversion only: a converted copy loads without a word."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such GGUF file")
    sha = file_sha256(path)
    out = converted_dir(sha)
    with _CONVERT_LOCK:
        meta = _read_meta(out, sha)
        if meta is not None:
            try:
                return load_converted(out, meta, name)
            except WeightsError:
                shutil.rmtree(out, ignore_errors=True)  # a damaged copy: rebuild it once below
        convert_gguf(path, sha, out, progress)
        meta = _read_meta(out, sha)
        if meta is None:
            raise WeightsError(f"{out}: conversion of {path.name} left no readable meta.json")
    return load_converted(out, meta, name)


def _read_meta(out: Path, sha: str) -> dict | None:
    try:
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("convert_version") != CONVERT_VERSION or meta.get("gguf_sha256") != sha:
        return None
    return meta


def load_converted(out: Path, meta: dict, name: str) -> LlamaModel:
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    try:
        cfg = LlamaConfig(**meta["config"])
        # load_file memory-maps the file: pages come from the page cache on demand.
        tensors = load_file(str(out / "model.safetensors"))
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    except WeightsError:
        raise
    except Exception as exc:  # a damaged cache: load_llama_gguf rebuilds it once
        raise WeightsError(f"{out}: converted copy is damaged ({exc})") from None
    info = make_info(name, cfg, "gguf:" + meta["gguf_sha256"], int(meta["quant_bits"]))
    chat = ChatMLTemplate(meta.get("default_system_prompt"))
    raw = split_raw(tensors, meta.get("raw_types") or {})  # decode kernels read the file's blocks
    model = LlamaModel(cfg, tensors, info, HFTokenizer(tok, meta["eos_ids"]), chat, str(out), raw=raw)
    model.quant_mix = QuantMix.from_dict(meta.get("quant_mix"))  # for the info line and `bench engine`
    return model


def convert_gguf(path: Path, sha: str, out: Path, progress: ConvertProgress | None = None) -> None:
    """Read the GGUF once and write the converted cache directory (temp dir + rename).
    `progress` gets the share done after each step (most of the time goes to the layers'
    dequantization and to writing the copy)."""
    import gguf
    from safetensors.torch import save_file

    def step(fraction: float) -> None:
        if progress is not None:
            progress(path.name.split(".")[0], fraction)

    step(0.0)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises ValueError/struct errors on bad files
        raise WeightsError(f"{path}: not a readable GGUF ({exc})") from None
    fields = {k: f for k, f in reader.fields.items()}

    def meta(key: str, default=None):
        f = fields.get(key)
        return default if f is None else f.contents()

    arch = meta("general.architecture")
    if arch != "llama":
        raise WeightsError(f"{path}: architecture {arch!r} is not supported (llama only)")
    if str(meta("llama.rope.scaling.type", "none")) not in ("none", ""):
        raise WeightsError(f"{path}: RoPE scaling {meta('llama.rope.scaling.type')!r} is not supported")
    tensors_by_name = {t.name: t for t in reader.tensors}
    tokens = meta("tokenizer.ggml.tokens")
    if not tokens:
        raise WeightsError(f"{path}: no tokenizer.ggml.tokens")
    heads = int(meta("llama.attention.head_count"))
    hidden = int(meta("llama.embedding_length"))
    cfg = LlamaConfig(
        vocab_size=int(meta("llama.vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(meta("llama.feed_forward_length")),
        num_layers=int(meta("llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(meta("llama.attention.head_count_kv", heads)),
        head_dim=int(meta("llama.attention.key_length", hidden // heads)),
        rope_theta=_f32(meta("llama.rope.freq_base", 10000.0)),
        rms_norm_eps=_f32(meta("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(meta("llama.context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensors_by_name,
    )
    step(0.05)
    tensors = gguf_tensors_to_internal(cfg, tensors_by_name, str(path),
                                       on_layer=lambda i: step(0.05 + 0.6 * (i + 1) / cfg.num_layers))
    raw, raw_types = gguf_raw_blocks(cfg, tensors_by_name, unpermute_rope_rows)
    step(0.7)
    tensors.update(raw)
    tok = build_tokenizer(tokens, meta("tokenizer.ggml.merges") or [], meta("tokenizer.ggml.token_type") or [],
                          meta("tokenizer.ggml.pre", "default"), str(path))
    wrapped = HFTokenizer(tok, [])
    eos = sorted(eos_ids_for(wrapped, [meta("tokenizer.ggml.eos_token_id")]))
    template = meta("tokenizer.chat_template")
    chat = chat_for(template, str(path))
    bits = quant_bits(reader.tensors)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    step(0.75)
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"source": path.name})
        step(0.95)
        tok.save(str(tmp / "tokenizer.json"))
        info = {
            "convert_version": CONVERT_VERSION,
            "gguf_sha256": sha,
            "source": str(path),
            "config": cfg.as_dict(),
            "eos_ids": eos,
            "quant_bits": bits,
            "default_system_prompt": chat.default_system_prompt,
            "chat_template": template,
            "raw_types": raw_types,
            "quant_mix": gguf_quant_mix(reader.tensors).as_dict(),
        }
        (tmp / "meta.json").write_text(json.dumps(info, indent=1))
        if _read_meta(out, sha) is None:  # else another process finished first: keep its copy
            if out.exists():
                shutil.rmtree(out, ignore_errors=True)  # an outdated or damaged copy
            try:
                os.rename(tmp, out)
            except OSError:
                if _read_meta(out, sha) is None:
                    raise
        step(1.0)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _f32(value) -> float:
    """GGUF stores these as float32 (1e-5 reads back as 9.99999974e-06): take the shortest decimal
    that rounds to the same float32, i.e. the value the model's config was written with."""
    return float(str(np.float32(value)))


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of q/k rows, per head.

    The converter reorders each head's rows from HF's [first half | second half]
    to interleaved pairs (so ggml rotates adjacent pairs): reshape(heads, 2, D/2, in)
    .swapaxes(1, 2). We invert it to rotate halves like HF. For k, `n_heads` is the
    number of KV heads: w [heads * D, in] -> [heads, D/2, 2, in] -> [heads, 2, D/2, in]."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gguf_tensors_to_internal(cfg: LlamaConfig, by_name: dict, source: str,
                             on_layer: Callable[[int], None] | None = None) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    def get(name: str) -> np.ndarray:
        t = by_name.get(name)
        if t is None:
            raise WeightsError(f"{source}: tensor {name} is missing")
        try:
            arr = dequantize(t.data, t.tensor_type)  # float32, (out, in) order: F.linear's layout
        except NotImplementedError:
            raise WeightsError(f"{source}: tensor {name} has type {t.tensor_type.name}, which gguf cannot "
                               f"dequantize (the C kernels read {', '.join(map(gguf_name, BLOCK_TYPES))})") from None
        # A copy: F32/F16 tensors come back as read-only views of the memory-mapped file.
        return np.array(arr, dtype=np.float32, order="C", copy=True)

    def t(arr: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(arr))

    out = {"embed": t(get("token_embd.weight")), "norm": t(get("output_norm.weight"))}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = t(get("output.weight"))
    for i in range(cfg.num_layers):
        b = f"blk.{i}."
        q = unpermute_rope_rows(get(b + "attn_q.weight"), cfg.num_heads)
        k = unpermute_rope_rows(get(b + "attn_k.weight"), cfg.num_kv_heads)
        out[f"layers.{i}.wqkv"] = t(np.concatenate([q, k, get(b + "attn_v.weight")]))
        out[f"layers.{i}.wo"] = t(get(b + "attn_output.weight"))
        out[f"layers.{i}.attn_norm"] = t(get(b + "attn_norm.weight"))
        out[f"layers.{i}.ffn_norm"] = t(get(b + "ffn_norm.weight"))
        out[f"layers.{i}.w13"] = t(np.concatenate([get(b + "ffn_gate.weight"), get(b + "ffn_up.weight")]))
        out[f"layers.{i}.w2"] = t(get(b + "ffn_down.weight"))
        if on_layer is not None:
            on_layer(i)
    for name, shape in expected_shapes(cfg).items():
        if tuple(out[name].shape) != shape:
            raise WeightsError(f"{source}: {name} came out {tuple(out[name].shape)}, config needs {shape}")
    return out


def quant_bits(tensors) -> int:
    """Bits of the dominant 2-D weight type (Q4_1 -> 4, Q8_0 -> 8, F16 -> 16, F32 -> 32)."""
    counts = Counter(t.tensor_type.name for t in tensors if len(t.shape) >= 2)
    if not counts:
        return 32
    kind = counts.most_common(1)[0][0]
    if kind.startswith(("F", "BF")):
        return int("".join(c for c in kind if c.isdigit()))
    digits = "".join(c for c in kind.split("_")[0] if c.isdigit())  # "Q4_1" -> 4, "IQ4_XS" -> 4
    return int(digits) if digits else 0


def build_tokenizer(tokens: list[str], merges: list[str], token_types: list[int], pre: str, source: str):
    """Byte-level BPE from the GGUF vocab and merges (tokenizer.ggml.model "gpt2").

    No BOS/EOS is added (SmolLM2 adds none). Control tokens are registered as special
    so that `<|im_start|>` in a rendered prompt becomes one id instead of being split."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise WeightsError(f"{source}: the GGUF vocab has duplicate tokens")
    pairs = []
    for m in merges:
        parts = m.split(" ")
        if len(parts) != 2:
            raise WeightsError(f"{source}: bad merge {m!r}")
        pairs.append((parts[0], parts[1]))
    tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":
        # llama.cpp's "smollm" pre-tokenizer splits every digit on its own before the GPT-2 regex.
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("default", "gpt2", "", None):
        tok.pre_tokenizer = byte_level
    else:
        raise WeightsError(f"{source}: pre-tokenizer {pre!r} is not supported (smollm, gpt2/default)")
    tok.decoder = decoders.ByteLevel()
    added = []
    for i, kind in enumerate(token_types):
        if kind == TOKEN_CONTROL:
            added.append(AddedToken(tokens[i], special=True, normalized=False))
        elif kind == TOKEN_USER_DEFINED:
            added.append(AddedToken(tokens[i], special=False, normalized=False))
    if added:
        tok.add_tokens(added)
    return tok
