"""DeepSeek V4 family: the loaded model (`Dsv4Model`) and `load_dsv4(path, name)`.

Owns model identity and assembly: config.json -> Dsv4Config, *.safetensors ->
validated, dequantized weights (weights.py), tokenizer.json -> the generic
HFTokenizer, the DeepSeek V4 chat template (engine/text/dsv4_chat.py), the fingerprint and
the KVC identity bytes. The math is in net.py and its parts; sessions in
session.py.

Fingerprint: SHA-256 over the family tag, the config's canonical JSON (QAT
switches included, since they change the cached numbers) and a digest of the
weights' values (weights.weights_digest), so a payload is never restored
into another model or config, while the same weights stored under official or
HF names, or in another file layout, stay the same model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ds4tui.format.payload import DS4_PAYLOAD_ABI, DS4TUI_PAYLOAD_ABI, MODEL_ID_DS4_FLASH, MODEL_ID_DSV4_CUSTOM
from ds4tui.engine.text.dsv4_chat import Dsv4ChatTemplate
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.dsv4.net import Dsv4Net
from ds4tui.engine.dsv4.session import Dsv4Session
from ds4tui.engine.dsv4.weights import (
    Dsv4Weights,
    build_weights,
    resolve,
    sources_from_dict,
    sources_from_safetensors,
    weights_digest,
)
from ds4tui.engine.errors import WeightsError
from ds4tui.engine.defaults import DEFAULT_CTX
from ds4tui.engine.model import ChatTemplate, Model, ModelInfo, Tokenizer

MAX_CHUNK = 2048  # ds4's prefill chunk: large enough for efficient matmuls, a multiple of 128

_EXPERT_BITS = {"I8": 4, "F8_E4M3": 8, "BF16": 16, "F16": 16, "F32": 32, "F64": 64}


def default_chunk(ctx_size: int, ratio_lcm: int) -> int:
    """MAX_CHUNK, or the context rounded up to a multiple of the compression ratios when smaller."""
    chunk = min(MAX_CHUNK, ctx_size)
    return -(-chunk // ratio_lcm) * ratio_lcm


def fingerprint_of(cfg: Dsv4Config, digest: bytes) -> bytes:
    return hashlib.sha256(b"ds4tui-dsv4\0" + cfg.canonical_json() + b"\0" + digest).digest()


class Dsv4Model(Model):
    """Weights (in `net`) loaded once; every session shares them."""

    def __init__(
        self,
        name: str,
        cfg: Dsv4Config,
        tensors: dict[str, torch.Tensor],
        tokenizer: Tokenizer,
        chat: ChatTemplate,
        quant_bits: int,
    ) -> None:
        self._setup(name, cfg, build_weights(cfg, tensors), weights_digest(tensors), tokenizer, chat, quant_bits)

    @classmethod
    def from_weights(cls, name: str, cfg: Dsv4Config, weights: Dsv4Weights, digest: bytes, tokenizer: Tokenizer,
                     chat: ChatTemplate, quant_bits: int, ds4_file: bool = False) -> "Dsv4Model":
        """A model over weights already bound (a GGUF's blocks: gguf.py), identified by `digest`.
        ds4_file: the weights are ds4's own GGUF, so a V4 Flash shape (any layer count, as a
        ds4 build with that count runs it) is model id 0 and keeps its sessions in ds4's
        payload (ABI 2)."""
        self = cls.__new__(cls)
        self._setup(name, cfg, weights, digest, tokenizer, chat, quant_bits, ds4_file)
        return self

    def _setup(self, name: str, cfg: Dsv4Config, weights: Dsv4Weights, digest: bytes, tokenizer: Tokenizer,
               chat: ChatTemplate, quant_bits: int, ds4_file: bool = False) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.chat = chat
        fingerprint = fingerprint_of(cfg, digest)
        self.net = Dsv4Net(cfg, weights)
        self.info = ModelInfo(
            name=name,
            family="dsv4",
            # ds4 writes id 0 for whatever its build runs: a slice of ds4's file is id 0 too
            model_id=MODEL_ID_DS4_FLASH if cfg.is_flash or (ds4_file and cfg.has_flash_shape) else MODEL_ID_DSV4_CUSTOM,
            quant_bits=quant_bits,
            fingerprint=fingerprint,
            n_ctx=cfg.max_position_embeddings,
            payload_abi=DS4_PAYLOAD_ABI if ds4_file and cfg.has_flash_shape else DS4TUI_PAYLOAD_ABI,
        )

    def describe(self) -> str:
        cfg = self.cfg
        ratios = sorted(set(cfg.compress_ratios))
        kinds = ", ".join("sliding" if r == 0 else f"CSA {r}" if r == 4 else f"HCA {r}" for r in ratios)
        qat = "QAT on" if cfg.qat_kv_fp8 or cfg.qat_indexer_fp4 else "QAT off"
        mix = getattr(self, "quant_mix", None)  # a GGUF's tensor types (gguf.py)
        weights = f"; weights {mix.summary()}" if mix is not None else ""
        return (f"deepseek_v4, {cfg.num_hidden_layers} layers ({kinds}; window {cfg.sliding_window}), "
                f"hidden {cfg.hidden_size}, {cfg.n_routed_experts} experts, {qat}{weights}; chat: DeepSeek V4 turns")

    @property
    def dtype(self) -> torch.dtype:
        return self.net.dtype

    def new_session(self, ctx_size: int | None = None, chunk_size: int | None = None, *,
                    kv_dtype: str | None = None) -> Dsv4Session:
        """chunk_size defaults to min(2048, ctx) rounded up to a multiple of the ratios.
        kv_dtype is ignored: the DSV4 cache keeps its own type (see its cache_f16 option)."""
        n_ctx = self.cfg.max_position_embeddings
        ctx = min(n_ctx, DEFAULT_CTX) if ctx_size is None else int(ctx_size)
        if not 0 < ctx <= n_ctx:
            raise ValueError(f"ctx_size {ctx} outside 1..{n_ctx}")
        chunk = default_chunk(ctx, self.cfg.ratio_lcm) if chunk_size is None else int(chunk_size)
        return Dsv4Session(self.net, self.info, ctx, chunk)


def read_config(path: Path, **overrides: Any) -> Dsv4Config:
    file = path / "config.json"
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{file}: unreadable config ({exc})") from None
    return Dsv4Config.from_hf(raw, **overrides)


def load_tokenizer(path: Path, cfg: Dsv4Config) -> Tokenizer:
    from tokenizers import Tokenizer as HfTok

    from ds4tui.engine.text.hf_tokenizer import HFTokenizer

    file = path / "tokenizer.json"
    try:
        tok = HfTok.from_file(str(file))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise WeightsError(f"{file}: unreadable tokenizer ({exc})") from None
    wrapped = HFTokenizer(tok, eos_ids=cfg.eos_ids)
    if wrapped.vocab_size > cfg.vocab_size:
        raise WeightsError(f"{file}: {wrapped.vocab_size} tokens, more than the model's vocab_size {cfg.vocab_size}")
    return wrapped


def expert_bits(sources: dict) -> int:
    """Bits of the routed experts' storage (KVC quant_bits): 4 for FP4, 8 for FP8, else float."""
    for name, src in sources.items():
        if name.endswith(("experts.0.w1.weight", "mlp.experts.gate_up_proj")):
            return _EXPERT_BITS.get(src.dtype, 32)
    return 32


def load_dsv4(path: str | Path, name: str, dtype: torch.dtype = torch.float32, **config_overrides: Any) -> Dsv4Model:
    """Load a checkpoint directory: config.json, *.safetensors (official or HF names), tokenizer.json.

    dtype is the compute dtype (float32; float64 for exactness tests). config_overrides
    replace config keys, e.g. qat_kv_fp8=False (a different model: another fingerprint).
    """
    path = Path(path)
    cfg = read_config(path, **config_overrides)
    sources = sources_from_safetensors(path)
    tensors = resolve(cfg, sources, dtype)
    return Dsv4Model(name, cfg, tensors, load_tokenizer(path, cfg), Dsv4ChatTemplate(), expert_bits(sources))


def model_from_tensors(
    name: str, cfg: Dsv4Config, tensors: dict[str, torch.Tensor], tokenizer: Tokenizer, dtype: torch.dtype = torch.float32
) -> Dsv4Model:
    """A model from in-memory tensors (official or HF names), validated like a checkpoint."""
    sources = sources_from_dict(tensors)
    return Dsv4Model(name, cfg, resolve(cfg, sources, dtype), tokenizer, Dsv4ChatTemplate(), expert_bits(sources))
