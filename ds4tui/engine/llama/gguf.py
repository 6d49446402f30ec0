"""GGUF (llama, qwen2, qwen3, gemma3) -> LlamaModel, through a converted fp32 cache for fast starts.

Owns: reading a GGUF with the `gguf` package (metadata, tokenizer, tensors
dequantized by `gguf.quants.dequantize`), undoing llama.cpp's q/k row permutation
(llama architecture only; arch.py reads each architecture's metadata), building
the tokenizer (text/gguf_vocab.py) and chat template (text/chat_templates.py) from the
GGUF, and the converted cache.

Why a converted cache: `GGUFReader` spends seconds parsing the 49k tokenizer strings
and dequantizing takes seconds more, on every start (docs/perf-archive.md, "GGUF start-up and
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
import mmap
import os
import shutil
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ds4tui import paths
from ds4tui.engine.text.chat_templates import chat_template_for
from ds4tui.engine.text.gguf_vocab import build_gguf_tokenizer
from ds4tui.engine.text.hf_tokenizer import HFTokenizer
from ds4tui.engine.kernels.quants import BLOCK_TYPES, QuantMix, gguf_name
from ds4tui.engine.kernels.raw_weights import gguf_quant_mix, gguf_raw_blocks, move_raw_into_huge_pages, split_raw
from ds4tui.engine.llama.arch import GGUF_LAYER_NORMS, gguf_expected_shapes, gguf_permutes_qk, parse_gguf_metadata
from ds4tui.engine.llama.config import LlamaConfig, expected_shapes
from ds4tui.engine.llama.gguf_meta import GgufMeta, check_extents, check_layout
from ds4tui.engine.llama.rope import RopeScaling, combined_divisors
from ds4tui.engine.llama.model import LlamaModel
from ds4tui.engine.llama.weights import eos_ids_for, file_sha256, make_info
from ds4tui.engine.errors import WeightsError

# Bump when the converted layout or the conversion changes: old copies are then rebuilt.
# 3: the copy also holds the file's raw weight blocks for the fused decode step.
# 4: blocks of every kernel type, as row parts ("raw.<name>.<k>"); the quant mix in meta.json.
# 5: qwen2/qwen3/gemma3 configs, SentencePiece vocabularies, chat formats.
# 6: RoPE scaling from every rope.scaling key as llama.cpp reads them (linear, yarn); its name in meta.json.
CONVERT_VERSION = 6
_CONVERT_LOCK = threading.Lock()
# progress(what, fraction): the one-time conversion's progress, `what` naming the model
# (the GGUF's file name up to its first dot, e.g. "SmolLM2-135M-Instruct"), fraction 0..1.
ConvertProgress = Callable[[str, float], None]


def converted_dir(sha256: str) -> Path:
    """Named by the GGUF's hash and the conversion version, so copies of two versions (two
    checkouts sharing the data dir) coexist instead of replacing each other on every load."""
    return paths.data_dir() / "converted" / f"{sha256[:16]}-v{CONVERT_VERSION}"


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
    specials = meta.get("special_tokens") or {}
    tokenizer = HFTokenizer(tok, meta["eos_ids"], byte_level=meta.get("vocab_kind", "gpt2") == "gpt2",
                            spm=meta.get("vocab_kind") == "llama")
    chat, chat_line = _chat(meta.get("chat_template"), tokenizer, cfg.arch, specials, str(out))
    raw = split_raw(tensors, meta.get("raw_types") or {})
    model = LlamaModel(cfg, tensors, info, tokenizer, chat, str(out), raw=raw)
    # The kernels read the file's blocks; once the model is warm (warm_up starts it) they
    # move into huge pages where the system has them (same addresses, same bytes: nothing
    # waits for it).
    model.huge_pages = move_raw_into_huge_pages(raw, out / "model.safetensors")
    model.quant_mix = QuantMix.from_dict(meta.get("quant_mix"))  # for the info line and `bench engine`
    model.details = {"chat": chat_line, "rope": meta.get("rope")}
    return model


def _chat(template: str | None, tok: HFTokenizer, arch: str, specials: dict, source: str):
    """The model's own template when the file has one, else its family's turn format."""
    return chat_template_for(template, lambda t: tok.token_to_id(t) is not None, arch,
                             specials.get("bos", ""), specials.get("eos", ""), source)


def convert_gguf(path: Path, sha: str, out: Path, progress: ConvertProgress | None = None) -> None:
    """Read the GGUF once and write the converted cache directory (temp dir + rename).
    `progress` gets the share done after each step (most of the time goes to the layers'
    dequantization and to writing the copy)."""
    from safetensors.torch import save_file

    def step(fraction: float) -> None:
        if progress is not None:
            progress(path.name.split(".")[0], fraction)

    step(0.0)
    reader = _checked_reader(path)
    meta = GgufMeta(reader.fields, str(path))
    tensors_by_name = {t.name: t for t in reader.tensors}
    tokens = meta.strings("tokenizer.ggml.tokens", [])
    if not tokens:
        raise WeightsError(f"{path}: no tokenizer.ggml.tokens")
    cfg, scaling = parse_gguf_metadata(meta, set(tensors_by_name), len(tokens), str(path))
    check_gguf_shapes(cfg, tensors_by_name, str(path))  # before any tensor data is read
    step(0.05)
    tensors = gguf_tensors_to_internal(cfg, tensors_by_name, str(path), scaling,
                                       on_layer=lambda i: step(0.05 + 0.6 * (i + 1) / cfg.num_layers))
    raw, raw_types = gguf_raw_blocks(cfg, tensors_by_name, unpermute_rope_rows if gguf_permutes_qk(cfg) else _keep_rows)
    step(0.7)
    tensors.update(raw)
    vocab_kind = meta.text("tokenizer.ggml.model", "gpt2")
    tok, specials, template, chat, eos = _tokenizer_and_chat(meta, vocab_kind, tokens, cfg.arch, path)
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
            "vocab_kind": vocab_kind,
            "special_tokens": specials,
            "default_system_prompt": chat.default_system_prompt,
            "chat_template": template,
            "raw_types": raw_types,
            "rope": scaling.describe() if scaling is not None else (
                RopeScaling("rope_freqs", 1.0, None).describe() if cfg.rope_freq_factors else None),
            "quant_mix": gguf_quant_mix(reader.tensors).as_dict(),
        }
        (tmp / "meta.json").write_text(json.dumps(info, indent=1))
        _install(tmp, out, sha)
        step(1.0)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _checked_reader(path: Path):
    """gguf's reader over `path`, once the file's layout is checked: the reader trusts the
    header's counts and maps past the end of a short file."""
    import gguf

    if path.stat().st_size < 24:
        raise WeightsError(f"{path}: not a GGUF file ({path.stat().st_size} bytes)")
    with open(path, "rb") as fp, mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        layout = check_layout(buf, str(path))
    check_extents(layout, path.stat().st_size, str(path), gguf.GGML_QUANT_SIZES)
    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises ValueError/struct errors on bad files
        raise WeightsError(f"{path}: not a readable GGUF ({exc})") from None


def _tokenizer(meta: GgufMeta, vocab_kind: str, tokens: list[str], path: Path):
    """The file's tokenizer (tokenizers' own object), its per-token arrays checked against the vocab."""
    token_types = meta.integers("tokenizer.ggml.token_type", [])
    scores = meta.numbers("tokenizer.ggml.scores", [])
    for key, values in (("tokenizer.ggml.token_type", token_types), ("tokenizer.ggml.scores", scores)):
        if values and len(values) != len(tokens):
            raise WeightsError(f"{path}: {key} has {len(values)} entries for {len(tokens)} tokens")
    return build_gguf_tokenizer(vocab_kind, tokens, token_types, merges=meta.strings("tokenizer.ggml.merges", []),
                                scores=scores, pre=meta.text("tokenizer.ggml.pre", "default"),
                                add_space_prefix=meta.flag("tokenizer.ggml.add_space_prefix", False), source=str(path))


def _tokenizer_and_chat(meta: GgufMeta, vocab_kind: str, tokens: list[str], arch: str, path: Path):
    """(tokenizer, {"bos", "eos"} pieces, the file's chat template or None, the chat template
    used, the EOS ids: the declared one and the chat format's turn end, Gemma's <end_of_turn>)."""
    tok = _tokenizer(meta, vocab_kind, tokens, path)
    wrapped = HFTokenizer(tok, [], byte_level=vocab_kind == "gpt2", spm=vocab_kind == "llama")
    eos_id = meta.integer("tokenizer.ggml.eos_token_id", None, low=0, high=len(tokens) - 1)
    bos_id = meta.integer("tokenizer.ggml.bos_token_id", None, low=0, high=len(tokens) - 1)
    specials = {"bos": _piece(tokens, bos_id), "eos": _piece(tokens, eos_id)}
    template = meta.text("tokenizer.chat_template", None)
    chat, _ = _chat(template, wrapped, arch, specials, str(path))
    eos = sorted(eos_ids_for(wrapped, [eos_id, wrapped.token_to_id(chat.stop_strings[0])]))
    return tok, specials, template, chat, eos


def _install(tmp: Path, out: Path, sha: str) -> None:
    """The finished copy `tmp` renamed to `out`, unless another process finished first (its
    copy is kept); an outdated or damaged copy at `out` is replaced."""
    if _read_meta(out, sha) is not None:
        return
    if out.exists():
        shutil.rmtree(out, ignore_errors=True)
    try:
        os.rename(tmp, out)
    except OSError:
        if _read_meta(out, sha) is None:
            raise


def _piece(tokens: list[str], token_id) -> str:
    return tokens[int(token_id)] if token_id is not None and 0 <= int(token_id) < len(tokens) else ""


def _keep_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    return w


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of q/k rows, per head.

    The converter reorders each head's rows from HF's [first half | second half]
    to interleaved pairs (so ggml rotates adjacent pairs): reshape(heads, 2, D/2, in)
    .swapaxes(1, 2). We invert it to rotate halves like HF. For k, `n_heads` is the
    number of KV heads: w [heads * D, in] -> [heads, D/2, 2, in] -> [heads, 2, D/2, in]."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def check_gguf_shapes(cfg: LlamaConfig, by_name: dict, source: str) -> None:
    """Every tensor the config reads is in the file's index with the shape the config gives it
    (and a rope_freqs tensor has one divisor per frequency): a header that disagrees with its
    tensors is refused before anything is dequantized or sized by it."""
    want = gguf_expected_shapes(cfg)
    if "rope_freqs.weight" in by_name:
        want["rope_freqs.weight"] = (cfg.head_dim // 2,)
    for name, shape in want.items():
        t = by_name.get(name)
        if t is None:
            raise WeightsError(f"{source}: tensor {name} is missing")
        got = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions innermost first
        if got != shape:
            raise WeightsError(f"{source}: tensor {name} has shape {got}, config needs {shape}")


def gguf_tensors_to_internal(cfg: LlamaConfig, by_name: dict, source: str, scaling: RopeScaling | None = None,
                             on_layer: Callable[[int], None] | None = None) -> dict[str, torch.Tensor]:
    """The internal fp32 tensors (config.py's layout); `rope_freqs` is the file's own tensor
    times the divisors of the scaling its keys describe."""
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
        except ValueError as exc:  # data that is not whole blocks of its type
            raise WeightsError(f"{source}: tensor {name} cannot be read as {t.tensor_type.name} ({exc})") from None
        # A copy: F32/F16 tensors come back as read-only views of the memory-mapped file.
        return np.array(arr, dtype=np.float32, order="C", copy=True)

    def t(arr: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(arr))

    shapes = expected_shapes(cfg)

    qk_rows = unpermute_rope_rows if gguf_permutes_qk(cfg) else _keep_rows
    out = {"embed": t(get("token_embd.weight")), "norm": t(get("output_norm.weight"))}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = t(get("output.weight"))
    divisors = combined_divisors(scaling, get("rope_freqs.weight") if "rope_freqs.weight" in by_name else None, source)
    if divisors is not None:  # Llama 3's rope_freqs tensor, as llama.cpp's converter writes it, and the keys' scaling
        out["rope_freqs"] = torch.tensor(divisors, dtype=torch.float32)
    for i in range(cfg.num_layers):
        b = f"blk.{i}."
        q = qk_rows(get(b + "attn_q.weight"), cfg.num_heads)
        k = qk_rows(get(b + "attn_k.weight"), cfg.num_kv_heads)
        out[f"layers.{i}.wqkv"] = t(np.concatenate([q, k, get(b + "attn_v.weight")]))
        if cfg.attn_bias:
            qb = qk_rows(get(b + "attn_q.bias")[:, None], cfg.num_heads)[:, 0]
            kb = qk_rows(get(b + "attn_k.bias")[:, None], cfg.num_kv_heads)[:, 0]
            out[f"layers.{i}.bqkv"] = t(np.concatenate([qb, kb, get(b + "attn_v.bias")]))
        out[f"layers.{i}.wo"] = t(get(b + "attn_output.weight"))
        for ours, theirs in GGUF_LAYER_NORMS.items():
            if f"layers.{i}.{ours}" in shapes:
                out[f"layers.{i}.{ours}"] = t(get(b + theirs + ".weight"))
        out[f"layers.{i}.w13"] = t(np.concatenate([get(b + "ffn_gate.weight"), get(b + "ffn_up.weight")]))
        out[f"layers.{i}.w2"] = t(get(b + "ffn_down.weight"))
        if on_layer is not None:
            on_layer(i)
    for name, shape in shapes.items():
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
