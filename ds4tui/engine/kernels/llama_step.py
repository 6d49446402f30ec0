"""FastDecoder: llama decode (one token at a time) through the fused C step in llama_step.c.

Owns: the ctypes mirror of ds4k.h's model table, choosing per matrix between the GGUF's raw
blocks (any type of quants.BLOCK_TYPES, possibly in row parts of different types) and the
model's fp32 weight, the step's workspace, and `step()`, which matches the llama forward
for one token up to float rounding order. Leaves to the model: when to use it (batch-1
forwards; prefill is torch, with qgemm.py products for short chunks) and the fallback:
without the compiled library `make_fast_decoder` returns None and the torch forward runs.

Input is a config and tensors, never a model object: `make_fast_decoder(cfg, tensors, rope,
raw)` with the weights by their internal names (see `FastDecoder.__init__`). Every pointer the C
table holds belongs to a tensor this object keeps a reference to, so the table stays valid
for the decoder's lifetime; the tensors are never written.
"""

from __future__ import annotations

import ctypes
from typing import Mapping, Sequence

import torch

from ds4tui.engine.kernels import qgemv
from ds4tui.engine.kernels.qgemv import MAX_PARTS, Mat, Part, QuantMatrix

# Weight types the step reads as raw blocks; anything else decodes from the fp32 copy.
RAW_TYPES = qgemv.quants.BLOCK_TYPES

_Parts = Mat * MAX_PARTS


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p),
        ("qkv", _Parts), ("o", Mat), ("w13", _Parts), ("w2", Mat),
    ]


class _Llama(ctypes.Structure):
    _fields_ = [
        ("n_layers", ctypes.c_int32), ("hidden", ctypes.c_int32), ("inter", ctypes.c_int32),
        ("n_heads", ctypes.c_int32), ("n_kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
        ("vocab", ctypes.c_int32), ("rope_rows", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("embed", ctypes.c_void_p), ("norm", ctypes.c_void_p), ("head", Mat),
        ("rope_cos", ctypes.c_void_p), ("rope_sin", ctypes.c_void_p),
        ("layers", ctypes.POINTER(_Layer)),
    ]


def _bind(lib: ctypes.CDLL) -> None:
    if getattr(lib, "_ds4k_step_bound", False):
        return
    lib.ds4k_llama_workspace.argtypes = [ctypes.POINTER(_Llama), ctypes.c_int64]
    lib.ds4k_llama_workspace.restype = ctypes.c_int64
    lib.ds4k_llama_step.argtypes = [
        ctypes.POINTER(_Llama), ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
    ]
    lib.ds4k_llama_step.restype = ctypes.c_int
    lib._ds4k_step_bound = True


class FastDecoder:
    """Batch-1 decode for one llama-layout model; shared by its sessions (calls are serialized)."""

    def __init__(self, cfg, tensors: Mapping[str, torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor],
                 raw: Mapping[str, Part | Sequence[Part]], lib: ctypes.CDLL) -> None:
        """cfg: a LlamaConfig (num_layers, hidden_size, intermediate_size, num_heads,
        num_kv_heads, head_dim, vocab_size, rms_norm_eps, tie_word_embeddings).
        tensors: fp32 CPU tensors by internal name (engine/llama/config.py): "embed" [V, H],
        "norm" [H], "lm_head" [V, H] unless tied, and per layer i
        "layers.{i}.attn_norm"/"ffn_norm" [H], "wqkv" [(Hq + 2 Hkv) D, H] (q rows, k rows
        un-permuted to HF's half-split order, v rows), "wo" [H, Hq D], "w13" [2F, H] (gate
        rows, up rows), "w2" [H, F]. rope: the (cos, sin) tables [positions, D/2].
        raw: matrix name ("layers.{i}.wqkv", ..., "lm_head", or "embed" for a tied head) ->
        the file's blocks, (type, uint8 [rows, row_bytes]) or a list of row parts."""
        _bind(lib)
        self._lib = lib
        self.cfg = cfg
        self._keep: list[object] = []  # every tensor/matrix the table points into
        self._weights: list[torch.Tensor] = []  # the matrices among them
        self.types: dict[str, str] = {}  # weight name -> type the step reads (for reports)

        def ptr(t: torch.Tensor) -> int:
            if t.device.type != "cpu" or not t.is_contiguous() or t.dtype != torch.float32:
                raise ValueError("FastDecoder needs contiguous CPU float32 tensors")
            self._keep.append(t)
            return t.data_ptr()

        def matrix(name: str, dense: torch.Tensor) -> QuantMatrix:
            rows, cols = dense.shape
            entry = raw.get(name)
            if entry is not None and all(t in RAW_TYPES for t, _ in qgemv.as_parts(entry)):
                m = QuantMatrix.from_parts(entry, cols)
                if m.rows != rows:
                    raise ValueError(f"{name}: blocks of {m.rows} rows do not fit [{rows}, {cols}]")
                self.types[name] = "+".join(t for t, _ in m.parts)
                self._weights.extend(b for _, b in m.parts)
            else:
                ptr(dense)
                m = QuantMatrix.from_parts(("f32", dense.contiguous().view(torch.uint8).reshape(rows, cols * 4)), cols)
                self.types[name] = "f32"
                self._weights.append(dense)
            self._keep.append(m)
            return m

        layers = (_Layer * cfg.num_layers)()
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            L = layers[i]
            L.attn_norm, L.ffn_norm = ptr(tensors[p + "attn_norm"]), ptr(tensors[p + "ffn_norm"])
            matrix(p + "wqkv", tensors[p + "wqkv"]).fill_mats(L.qkv)
            matrix(p + "w13", tensors[p + "w13"]).fill_mats(L.w13)
            for field, name in (("o", "wo"), ("w2", "w2")):
                m = matrix(p + name, tensors[p + name])
                if len(m.parts) != 1:
                    raise ValueError(f"{p}{name}: one part expected, got {len(m.parts)}")
                setattr(L, field, m._mats[0])
        head_name = "embed" if cfg.tie_word_embeddings else "lm_head"
        head = matrix(head_name, tensors[head_name])
        if len(head.parts) != 1:
            raise ValueError(f"{head_name}: one part expected, got {len(head.parts)}")
        cos, sin = rope
        self._layers = layers
        self._table = _Llama(
            cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
            cfg.head_dim, cfg.vocab_size, cos.shape[0], cfg.rms_norm_eps,
            ptr(tensors["embed"]), ptr(tensors["norm"]), head._mats[0], ptr(cos), ptr(sin),
            ctypes.cast(layers, ctypes.POINTER(_Layer)),
        )
        self._ws = torch.empty(0)
        self._ws_ctx = 0

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one step streams (raw blocks or fp32), norms and tables aside."""
        return sum(t.numel() * t.element_size() for t in self._weights)

    def step(self, kv: torch.Tensor, token: int, pos: int, want_logits: bool) -> torch.Tensor | None:
        """`LlamaModel.forward(kv, [token], pos, want_logits)` for one token. kv: float32 or
        float16 (the new rows are rounded to f16 as they are written; attention converts the
        rows it reads, never the whole buffer)."""
        cfg = self.cfg
        shape = (cfg.num_layers, 2, cfg.num_kv_heads, kv.shape[3] if kv.dim() == 5 else -1, cfg.head_dim)
        if kv.dtype not in (torch.float32, torch.float16) or tuple(kv.shape) != shape or not kv.is_contiguous():
            raise ValueError(f"kv must be a contiguous float32 or float16 {shape} buffer, got {kv.dtype} {tuple(kv.shape)}")
        ctx = kv.shape[3]
        if not 0 <= pos < min(ctx, self._table.rope_rows):
            raise ValueError(f"position {pos} outside the session's {ctx} rows")
        if not 0 <= token < cfg.vocab_size:
            raise ValueError(f"token id {token} outside vocab of {cfg.vocab_size}")
        logits = torch.empty(cfg.vocab_size, dtype=torch.float32) if want_logits else None
        with qgemv.kernel_lock:
            if ctx > self._ws_ctx:  # grows to the largest session seen, then stays
                n = self._lib.ds4k_llama_workspace(ctypes.byref(self._table), ctx)
                self._ws, self._ws_ctx = torch.empty(n, dtype=torch.float32), ctx
            rc = self._lib.ds4k_llama_step(
                ctypes.byref(self._table), kv.data_ptr(), int(kv.dtype == torch.float16), ctx, pos, token,
                None if logits is None else logits.data_ptr(), self._ws.data_ptr(), qgemv.num_threads(),
            )
        if rc != 0:
            raise RuntimeError(f"ds4k_llama_step rejected token {token} at position {pos} (ctx {ctx})")
        return logits


def make_fast_decoder(cfg, tensors: Mapping[str, torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor],
                      raw: Mapping[str, Part | Sequence[Part]] | None) -> FastDecoder | None:
    """A FastDecoder (arguments as for FastDecoder), or None when the kernels run on the
    torch backend or the shapes are outside what llama_step.c handles."""
    lib = qgemv.library()
    if lib is None or not supported(cfg):
        return None
    return FastDecoder(cfg, tensors, rope, raw or {}, lib)


def supported(cfg) -> bool:
    """Shapes llama_step.c handles (its MAX_GROUP, MAX_HEAD_DIM and qgemv.c's MAX_COLS)."""
    return (cfg.head_dim % 2 == 0 and cfg.head_dim <= 256 and cfg.num_heads // cfg.num_kv_heads <= 16
            and max(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim) <= qgemv.GEMV_MAX_COLS)
