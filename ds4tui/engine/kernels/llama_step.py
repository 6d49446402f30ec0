"""FastDecoder: llama decode (one token at a time) through the fused C step in llama_step.c.

Owns: the ctypes mirror of llama_step.c's model table, choosing per matrix between the
GGUF's raw blocks (Q4_1, Q8_0, F16: exact to the file) and the model's fp32 weight, the
step's workspace, and `step()`, which matches `LlamaModel.forward` for one token up to
float rounding order. Leaves to the model: when to use it (engine/llama/model.py sends batch-1
forwards here when a decoder exists; prefill is torch, with qgemm.py products for short chunks) and the fallback: without
the compiled library `make_fast_decoder` returns None and the torch forward runs.

Every pointer the C table holds belongs to a tensor this object keeps a reference to, so
the table stays valid for the decoder's lifetime; the tensors are never written.
"""

from __future__ import annotations

import ctypes
from typing import Mapping

import torch

from ds4tui.engine.kernels import qgemv

# Weight types the step reads as raw blocks; anything else decodes from the fp32 copy.
RAW_TYPES = ("q4_1", "q8_0", "f16")


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p),
        ("wqkv", ctypes.c_void_p), ("wo", ctypes.c_void_p), ("w13", ctypes.c_void_p), ("w2", ctypes.c_void_p),
        ("t_qkv", ctypes.c_int32), ("t_o", ctypes.c_int32), ("t_13", ctypes.c_int32), ("t_2", ctypes.c_int32),
    ]


class _Llama(ctypes.Structure):
    _fields_ = [
        ("n_layers", ctypes.c_int32), ("hidden", ctypes.c_int32), ("inter", ctypes.c_int32),
        ("n_heads", ctypes.c_int32), ("n_kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
        ("vocab", ctypes.c_int32), ("rope_rows", ctypes.c_int32),
        ("eps", ctypes.c_float), ("t_head", ctypes.c_int32),
        ("embed", ctypes.c_void_p), ("norm", ctypes.c_void_p), ("head", ctypes.c_void_p),
        ("rope_cos", ctypes.c_void_p), ("rope_sin", ctypes.c_void_p),
        ("layers", ctypes.POINTER(_Layer)),
    ]


def _bind(lib: ctypes.CDLL) -> None:
    if getattr(lib, "_ds4k_step_bound", False):
        return
    lib.ds4k_llama_workspace.argtypes = [ctypes.POINTER(_Llama), ctypes.c_int64]
    lib.ds4k_llama_workspace.restype = ctypes.c_int64
    lib.ds4k_llama_step.argtypes = [
        ctypes.POINTER(_Llama), ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
    ]
    lib.ds4k_llama_step.restype = ctypes.c_int
    lib._ds4k_step_bound = True


class FastDecoder:
    """Batch-1 decode for one llama-family model; shared by its sessions (calls are serialized)."""

    def __init__(self, cfg, tensors: Mapping[str, torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor],
                 raw: Mapping[str, tuple[str, torch.Tensor]], lib: ctypes.CDLL) -> None:
        """cfg: a LlamaConfig; tensors: the model's fp32 weights by internal name (see
        engine/llama/config.py); rope: the (cos, sin) tables [positions, head_dim / 2].
        raw: internal weight name ("layers.{i}.wqkv", ..., "lm_head" or "embed" for a tied
        head) -> (type, uint8 [rows, row_bytes] blocks) for the weights kept as file blocks."""
        _bind(lib)
        self._lib = lib
        self.cfg = cfg
        self._keep: list[torch.Tensor] = []  # every tensor the table points into
        self._weights: list[torch.Tensor] = []  # the matrices among them
        self.types: dict[str, str] = {}  # weight name -> type the step reads (for reports)

        def ptr(t: torch.Tensor) -> int:
            if t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError("FastDecoder needs contiguous CPU tensors")
            self._keep.append(t)
            return t.data_ptr()

        def weight(name: str, dense: torch.Tensor) -> tuple[int, int]:
            rows, cols = dense.shape
            entry = raw.get(name)
            if entry is not None and entry[0] in RAW_TYPES:
                qtype, blocks = entry
                if blocks.dtype != torch.uint8 or tuple(blocks.shape) != (rows, qgemv.row_bytes(qtype, cols)):
                    raise ValueError(f"{name}: {qtype} blocks {tuple(blocks.shape)} do not fit [{rows}, {cols}]")
                self.types[name] = qtype
                self._weights.append(blocks)
                return ptr(blocks), qgemv.TYPE_IDS[qtype]
            if dense.dtype != torch.float32:
                raise ValueError(f"{name}: expected float32, got {dense.dtype}")
            self.types[name] = "f32"
            self._weights.append(dense)
            return ptr(dense), qgemv.TYPE_IDS["f32"]

        layers = (_Layer * cfg.num_layers)()
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            wqkv, t_qkv = weight(p + "wqkv", tensors[p + "wqkv"])
            wo, t_o = weight(p + "wo", tensors[p + "wo"])
            w13, t_13 = weight(p + "w13", tensors[p + "w13"])
            w2, t_2 = weight(p + "w2", tensors[p + "w2"])
            layers[i] = _Layer(ptr(tensors[p + "attn_norm"]), ptr(tensors[p + "ffn_norm"]),
                               wqkv, wo, w13, w2, t_qkv, t_o, t_13, t_2)
        head_name = "embed" if cfg.tie_word_embeddings else "lm_head"
        head, t_head = weight(head_name, tensors[head_name])
        cos, sin = rope
        self._layers = layers
        self._table = _Llama(
            cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
            cfg.head_dim, cfg.vocab_size, cos.shape[0], cfg.rms_norm_eps, t_head,
            ptr(tensors["embed"]), ptr(tensors["norm"]), head, ptr(cos), ptr(sin),
            ctypes.cast(layers, ctypes.POINTER(_Layer)),
        )
        self._ws = torch.empty(0)
        self._ws_ctx = 0

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one step streams (raw blocks or fp32), norms and tables aside."""
        return sum(t.numel() * t.element_size() for t in self._weights)

    def step(self, kv: torch.Tensor, token: int, pos: int, want_logits: bool) -> torch.Tensor | None:
        """`LlamaModel.forward(kv, [token], pos, want_logits)` for one token."""
        cfg = self.cfg
        shape = (cfg.num_layers, 2, cfg.num_kv_heads, kv.shape[3] if kv.dim() == 5 else -1, cfg.head_dim)
        if kv.dtype != torch.float32 or tuple(kv.shape) != shape or not kv.is_contiguous():
            raise ValueError(f"kv must be a contiguous float32 {shape} buffer, got {kv.dtype} {tuple(kv.shape)}")
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
                ctypes.byref(self._table), kv.data_ptr(), ctx, pos, token,
                None if logits is None else logits.data_ptr(), self._ws.data_ptr(), qgemv.num_threads(),
            )
        if rc != 0:
            raise RuntimeError(f"ds4k_llama_step rejected token {token} at position {pos} (ctx {ctx})")
        return logits


def make_fast_decoder(cfg, tensors: Mapping[str, torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor],
                      raw: Mapping[str, tuple[str, torch.Tensor]] | None) -> FastDecoder | None:
    """A FastDecoder over these weights, or None when the kernels run on the torch backend."""
    lib = qgemv.library()
    if lib is None or not supported(cfg):
        return None
    return FastDecoder(cfg, tensors, rope, raw or {}, lib)


def supported(cfg) -> bool:
    """Shapes llama_step.c handles (its MAX_GROUP, MAX_HEAD_DIM and qgemv.c's MAX_COLS)."""
    return (cfg.head_dim % 2 == 0 and cfg.head_dim <= 256 and cfg.num_heads // cfg.num_kv_heads <= 16
            and max(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim) <= 65536)
