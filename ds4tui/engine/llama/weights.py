"""Files -> LlamaModel: Hugging Face directories, the weights identity and the fingerprint.

Owns: reading a HF-style llama checkpoint (config.json, *.safetensors, tokenizer.json,
tokenizer_config.json) into the internal fused layout of engine/llama/config.py; the SHA-256 of
weight files, memoized by (path, size, mtime) in `data_dir()/converted/sha256-memo/`
so a start does not re-hash hundreds of MB (a file edited in place within the same
mtime tick with the same size would be missed: acceptable for model files); and the
model fingerprint: SHA-256 over family, config and weights identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Iterable

import torch
from safetensors import safe_open

from ds4tui import paths
from ds4tui.format.payload import DS4TUI_PAYLOAD_ABI, MODEL_ID_LLAMA
from ds4tui.engine.text.chat_templates import chat_template_for
from ds4tui.engine.text.hf_tokenizer import IM_END, HFTokenizer
from ds4tui.engine.llama.arch import hf_layer_norms, hf_norm_offset
from ds4tui.engine.llama.config import parse_hf_config
from ds4tui.engine.llama.config import LlamaConfig
from ds4tui.engine.llama.model import LlamaModel
from ds4tui.engine.errors import WeightsError
from ds4tui.engine.model import ModelInfo

FAMILY = "llama"


def memo_path(path: Path) -> Path:
    """One small JSON per hashed file (named by the hash of its path): concurrent processes
    never lose each other's entries, as they could rewriting one shared memo file."""
    name = hashlib.sha256(str(path).encode()).hexdigest()[:32]
    return paths.data_dir() / "converted" / "sha256-memo" / f"{name}.json"


def file_sha256(path: Path) -> str:
    """SHA-256 hex of a file, memoized by (resolved path, size, mtime_ns)."""
    path = path.resolve()
    st = path.stat()
    stamp = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    memo = memo_path(path)
    try:
        entry = json.loads(memo.read_text())
    except (OSError, ValueError):
        entry = None
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()):
        sha = entry.get("sha256")
        if isinstance(sha, str) and len(sha) == 64:
            return sha
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for block in iter(lambda: fp.read(1 << 22), b""):
            h.update(block)
    sha = h.hexdigest()
    atomic_write_bytes(memo, json.dumps({**stamp, "sha256": sha}).encode())
    return sha


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a unique temp file beside `path`, then rename: readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as fp:
        fp.write(data)
    os.replace(tmp, path)


def fingerprint(cfg: LlamaConfig, weights_identity: str) -> bytes:
    h = hashlib.sha256()
    h.update(f"ds4tui/{FAMILY}\0".encode())
    h.update(cfg.canonical_json())
    h.update(b"\0")
    h.update(weights_identity.encode())
    return h.digest()


def make_info(name: str, cfg: LlamaConfig, weights_identity: str, quant_bits: int) -> ModelInfo:
    return ModelInfo(
        name=name,
        family=FAMILY,
        model_id=MODEL_ID_LLAMA,
        quant_bits=quant_bits,
        fingerprint=fingerprint(cfg, weights_identity),
        n_ctx=cfg.max_position_embeddings,
        payload_abi=DS4TUI_PAYLOAD_ABI,
    )


def eos_ids_for(tok: HFTokenizer, extra: Iterable[int | None]) -> set[int]:
    """Stop ids: the declared EOS ids plus <|im_end|> (ChatML ends every turn with it)."""
    ids = {int(i) for i in extra if i is not None and 0 <= int(i) < tok.vocab_size}
    im_end = tok.token_to_id(IM_END)
    if im_end is not None:
        ids.add(im_end)
    if not ids:
        raise WeightsError("the tokenizer declares no EOS token and has no <|im_end|>")
    return ids


def load_llama_hf(path: str | Path, name: str) -> LlamaModel:
    """A Hugging Face style directory: config.json + *.safetensors + tokenizer.json."""
    path = Path(path)
    try:
        raw_cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{path}/config.json: {exc}") from None
    cfg, scaling = parse_hf_config(raw_cfg)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{path}: no *.safetensors files")
    hf: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    hf[key] = st.get_tensor(key)
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise WeightsError(f"{f}: unreadable safetensors ({exc})") from None
    tensors = hf_to_internal(cfg, hf, str(path))
    if scaling is not None:
        tensors["rope_freqs"] = torch.tensor(scaling.divisors, dtype=torch.float32)
    identity = "safetensors:" + ",".join(file_sha256(f) for f in files)
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        raise WeightsError(f"{path}: no tokenizer.json")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_file))
    tcfg: dict = {}
    if (path / "tokenizer_config.json").is_file():
        try:
            tcfg = json.loads((path / "tokenizer_config.json").read_text())
        except (OSError, ValueError) as exc:
            raise WeightsError(f"{path}/tokenizer_config.json: {exc}") from None
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    chat, chat_line = chat_template_for(template, lambda t: tok.token_to_id(t) is not None, cfg.arch,
                                        _token_text(tcfg.get("bos_token")), _token_text(tcfg.get("eos_token")), str(path))
    declared = raw_cfg.get("eos_token_id")
    declared = list(declared) if isinstance(declared, list) else [declared]
    declared.append(tok.token_to_id(_token_text(tcfg.get("eos_token"))) if _token_text(tcfg.get("eos_token")) else None)
    declared.append(tok.token_to_id(chat.stop_strings[0]))  # the turn end stops a reply
    spm = _is_sentencepiece(tok)
    hf_tok = HFTokenizer(tok, eos_ids_for(HFTokenizer(tok, []), declared), byte_level=not spm, spm=spm)
    bits = {torch.float32: 32, torch.float16: 16, torch.bfloat16: 16}.get(hf["model.embed_tokens.weight"].dtype, 32)
    info = make_info(name, cfg, identity, bits)
    model = LlamaModel(cfg, tensors, info, hf_tok, chat, str(path))
    model.details = {"weights": _DTYPE_NAMES.get(hf["model.embed_tokens.weight"].dtype, "F32"), "chat": chat_line,
                     "rope": scaling.describe() if scaling is not None else None}
    return model


_DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def _is_sentencepiece(tok) -> bool:
    """A SentencePiece-style vocabulary ("▁" for spaces, <0xXX> byte pieces: Gemma, Llama 2)
    rather than a byte-level one: its model falls back to bytes."""
    try:
        return bool(json.loads(tok.to_str()).get("model", {}).get("byte_fallback"))
    except ValueError:
        return False


def _token_text(value) -> str:
    """A tokenizer_config special token: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def hf_to_internal(cfg: LlamaConfig, hf: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    def get(key: str) -> torch.Tensor:
        t = hf.get(key)
        if t is None:
            raise WeightsError(f"{source}: tensor {key} is missing")
        return t.to(torch.float32)

    offset = hf_norm_offset(cfg)

    def norm(key: str) -> torch.Tensor:
        return (get(key) + offset).contiguous() if offset else get(key)

    out = {"embed": get("model.embed_tokens.weight"), "norm": norm("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get("lm_head.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        for ours, theirs in hf_layer_norms(cfg).items():
            out[f"layers.{i}.{ours}"] = norm(p + theirs)
        out[f"layers.{i}.wo"] = get(p + "self_attn.o_proj.weight")
        out[f"layers.{i}.w2"] = get(p + "mlp.down_proj.weight")
        out[f"layers.{i}.wqkv"] = torch.cat([get(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
        if cfg.attn_bias:
            out[f"layers.{i}.bqkv"] = torch.cat([get(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
        out[f"layers.{i}.w13"] = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
    return out
