"""FastDecoder: llama-family decode (one token at a time) through the fused C step in llama_step.c.

Owns: the ctypes mirror of ds4k.h's model table, choosing per matrix between the GGUF's raw
blocks (any type of quants.BLOCK_TYPES, possibly in row parts of different types) and the
model's fp32 weight, the per-layer K/V pointers of a call, the step's workspace, and
`step()`, which matches the llama-family forward (llama, qwen2, qwen3, gemma3) for one token
up to float rounding order. Leaves to the model: when to use it (batch-1 forwards; prefill
is torch, with qgemm.py products for short chunks) and the fallback: without the compiled
library `make_fast_decoder` returns None and the torch forward runs.

Input is a config and tensors, never a model object: `make_fast_decoder(cfg, tensors, rope,
raw, local_rope)` with the weights by their internal names (see `FastDecoder.__init__`). Every
pointer the C table holds belongs to a tensor this object keeps a reference to, so the table
stays valid for the decoder's lifetime; the tensors are never written.
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
        ("bqkv", ctypes.c_void_p), ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
        ("post_attn_norm", ctypes.c_void_p), ("post_ffn_norm", ctypes.c_void_p),
        ("sliding", ctypes.c_int32), ("reserved", ctypes.c_int32),
    ]


class _Llama(ctypes.Structure):
    _fields_ = [
        ("n_layers", ctypes.c_int32), ("hidden", ctypes.c_int32), ("inter", ctypes.c_int32),
        ("n_heads", ctypes.c_int32), ("n_kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
        ("vocab", ctypes.c_int32), ("rope_rows", ctypes.c_int32),
        ("eps", ctypes.c_float), ("embed_scale", ctypes.c_float), ("attn_scale", ctypes.c_float),
        ("softcap", ctypes.c_float), ("act", ctypes.c_int32), ("window", ctypes.c_int32),
        ("embed", ctypes.c_void_p), ("norm", ctypes.c_void_p), ("head", Mat),
        ("rope_cos", ctypes.c_void_p), ("rope_sin", ctypes.c_void_p),
        ("local_cos", ctypes.c_void_p), ("local_sin", ctypes.c_void_p),
        ("layers", ctypes.POINTER(_Layer)),
    ]


ACTS = {"silu": 0, "gelu_tanh": 1}  # ds4k.h's DS4K_ACT_*
FROZEN_GLOBAL = 1  # ds4k.h's DS4K_STEP_FROZEN_GLOBAL
# chunk.c's llama_layer flags
LAYER_KV_ONLY = 1  # write the chunk's K/V rows, nothing after (the last layer, no logits wanted)
LAYER_LAST_ROW = 2  # after the K/V rows only the last position goes on (the last layer, logits wanted)
# Rows the chunk layer's workspace holds at least (~32 KB a row on SmolLM2).
LAYER_WS_ROWS = 64


def _bind(lib: ctypes.CDLL) -> None:
    if getattr(lib, "_ds4k_step_bound", False):
        return
    # Each entry point takes the caller's configuration word first (qgemv.config()).
    lib.ds4k_llama_workspace.argtypes = [ctypes.c_int, ctypes.POINTER(_Llama), ctypes.c_int64]
    lib.ds4k_llama_workspace.restype = ctypes.c_int64
    lib.ds4k_llama_step.argtypes = [
        ctypes.c_int, ctypes.POINTER(_Llama), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int32,
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
    ]
    lib.ds4k_llama_step.restype = ctypes.c_int
    lib.ds4k_llama_layer_workspace.argtypes = [ctypes.c_int, ctypes.POINTER(_Llama), ctypes.c_int64]
    lib.ds4k_llama_layer_workspace.restype = ctypes.c_int64
    lib.ds4k_llama_layer.argtypes = [
        ctypes.c_int, ctypes.POINTER(_Llama), ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
    ]
    lib.ds4k_llama_layer.restype = ctypes.c_int
    lib._ds4k_step_bound = True


class FastDecoder:
    """Batch-1 decode for one llama-family model; shared by its sessions (calls are serialized)."""

    def __init__(self, cfg, tensors: Mapping[str, torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor],
                 raw: Mapping[str, Part | Sequence[Part]], lib: ctypes.CDLL,
                 local_rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """cfg: a LlamaConfig (engine/llama/config.py: its shapes and architecture fields).
        tensors: fp32 CPU tensors by internal name (config.py): "embed" [V, H], "norm" [H],
        "lm_head" [V, H] unless tied, and per layer i "layers.{i}.attn_norm"/"ffn_norm" [H],
        "wqkv" [(Hq + 2 Hkv) D, H] (q rows, k rows un-permuted to HF's half-split order, v
        rows), "wo" [H, Hq D], "w13" [2F, H] (gate rows, up rows), "w2" [H, F], and those the
        config asks for: "bqkv" (attn_bias), "q_norm"/"k_norm" [D] (qk_norm),
        "post_attn_norm"/"post_ffn_norm" [H] (post_norms). Norm weights are final (Gemma's
        1 + w already folded in by the loader). rope: the (cos, sin) tables [positions, D/2] of
        global layers; local_rope: those of sliding layers (default: rope).
        raw: matrix name ("layers.{i}.wqkv", ..., "lm_head", or "embed" for a tied head) ->
        the file's blocks, (type, uint8 [rows, row_bytes]) or a list of row parts."""
        _bind(lib)
        self._lib = lib
        self.cfg = cfg
        self._keep: list[object] = []  # every tensor/matrix the table points into
        self._weights: list[torch.Tensor] = []  # the matrices among them
        self.types: dict[str, str] = {}  # weight name -> type the step reads (for reports)

        def ptr(t: torch.Tensor | None) -> int | None:
            if t is None:
                return None
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
            if cfg.attn_bias:
                L.bqkv = ptr(tensors[p + "bqkv"])
            if cfg.qk_norm:
                L.q_norm, L.k_norm = ptr(tensors[p + "q_norm"]), ptr(tensors[p + "k_norm"])
            if cfg.post_norms:
                L.post_attn_norm, L.post_ffn_norm = ptr(tensors[p + "post_attn_norm"]), ptr(tensors[p + "post_ffn_norm"])
            L.sliding = int(cfg.is_sliding(i))
        head_name = "embed" if cfg.tie_word_embeddings else "lm_head"
        head = matrix(head_name, tensors[head_name])
        if len(head.parts) != 1:
            raise ValueError(f"{head_name}: one part expected, got {len(head.parts)}")
        cos, sin = rope
        local_cos, local_sin = local_rope if local_rope is not None else rope
        if local_cos.shape != cos.shape or local_sin.shape != sin.shape:
            raise ValueError("local RoPE tables must have the global tables' shape")
        self._layers = layers
        self._table = _Llama(
            cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
            cfg.head_dim, cfg.vocab_size, cos.shape[0], cfg.rms_norm_eps, cfg.embed_scale,
            # 0: the step's own 1/sqrtf(D), which a plain llama has always used
            cfg.attn_scale if cfg.query_pre_attn_scalar else 0.0,
            cfg.final_logit_softcapping, ACTS[cfg.act], cfg.sliding_window if cfg.sliding_layers else 0,
            ptr(tensors["embed"]), ptr(tensors["norm"]), head._mats[0], ptr(cos), ptr(sin),
            ptr(local_cos), ptr(local_sin), ctypes.cast(layers, ctypes.POINTER(_Layer)),
        )
        self._ws = torch.empty(0)
        self._ws_rows = 0
        self._layer_ws = torch.empty(0)
        self._layer_ws_rows = 0

    def layer_mats(self, i: int) -> dict[str, list[tuple[int, int, int]]]:
        """(blocks address, type id, rows) of each part of layer i's four matrices as the table
        holds them: the chunk layer (`layer`) gives the forward's results only where these are
        the parts its Linear.blocks multiply by (LlamaModel checks)."""
        L = self._layers[i]
        def parts(mats) -> list[tuple[int, int, int]]:
            return [(m.w or 0, m.type, m.rows) for m in mats if m.rows > 0]
        return {"wqkv": parts(L.qkv), "wo": parts([L.o]), "w13": parts(L.w13), "w2": parts([L.w2])}

    def layer(self, kv: torch.Tensor, i: int, x: torch.Tensor, pos: int, flags: int,
              qk_norm: torch.Tensor | None, scale: float) -> None:
        """Layer i of the llama forward for the chunk x [S, H] (float32, contiguous, updated in
        place) at positions pos..pos+S-1: chunk.c's llama_layer, the forward's per-layer steps
        in one call. kv: layer i's own buffer [2, Hkv, rows, D] (a global layer's context, whose
        rows pos.. are written; a sliding layer's ring of min(window, ctx) rows). flags:
        LAYER_*; qk_norm: the forward's [Hq + Hkv, D] per-head norm weights or None; scale: the
        forward's query scale."""
        cfg = self.cfg
        hkv, d = cfg.num_kv_heads, cfg.head_dim
        if not 0 <= i < cfg.num_layers:
            raise ValueError(f"layer {i} outside 0..{cfg.num_layers - 1}")
        if (kv.dim() != 4 or tuple(kv.shape[:2]) != (2, hkv) or kv.shape[3] != d or kv.shape[2] < 1
                or kv.dtype not in (torch.float32, torch.float16) or not kv.is_contiguous()):
            raise ValueError(f"kv must be a contiguous float32 or float16 (2, {hkv}, rows, {d}) buffer")
        s = x.shape[0] if x.dim() == 2 else 0
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != cfg.hidden_size or not x.is_contiguous() or not s:
            raise ValueError(f"x must be a contiguous float32 [S, {cfg.hidden_size}] tensor")
        if qk_norm is not None and (qk_norm.dtype != torch.float32 or not qk_norm.is_contiguous()
                                    or qk_norm.numel() != (cfg.num_heads + hkv) * d):
            raise ValueError("qk_norm must be contiguous float32 [Hq + Hkv, D]")
        rows = kv.shape[2]
        cfg_word = qgemv.config()
        with qgemv.kernel_lock:
            if s > self._layer_ws_rows:  # grows to the longest chunk seen, then stays
                # At least LAYER_WS_ROWS rows, written through now: warm_up's short chunk then
                # leaves room, already faulted in, for a message's chunk after a restore.
                n = max(s, LAYER_WS_ROWS)
                count = self._lib.ds4k_llama_layer_workspace(cfg_word, ctypes.byref(self._table), n)
                self._layer_ws, self._layer_ws_rows = torch.zeros(count, dtype=torch.float32), n
            rc = self._lib.ds4k_llama_layer(
                cfg_word, ctypes.byref(self._table), i, kv.data_ptr(), rows, int(kv.dtype == torch.float16),
                pos, s, x.data_ptr(), flags, None if qk_norm is None else qk_norm.data_ptr(), scale,
                self._layer_ws.data_ptr(), qgemv.num_threads(),
            )
        if rc != 0:
            raise RuntimeError(f"ds4k_llama_layer rejected layer {i}, {s} tokens at position {pos} ({rows} rows)")

    def _kv_table(self, kv) -> tuple[ctypes.Array, ctypes.Array, torch.dtype, int]:
        """(per-layer pointers, per-layer row counts, dtype, rows of a global layer or 0) of a
        session's K/V: one [layers, 2, Hkv, ctx, D] tensor (no sliding layers) or one
        [2, Hkv, rows, D] per layer (a sliding layer's ring: min(window, ctx) rows)."""
        cfg = self.cfg
        n, hkv, d = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
        if isinstance(kv, torch.Tensor):
            shape = (n, 2, hkv, kv.shape[3] if kv.dim() == 5 else -1, d)
            if (cfg.sliding_layers or kv.dtype not in (torch.float32, torch.float16) or tuple(kv.shape) != shape
                    or not kv.is_contiguous()):
                raise ValueError(f"kv must be a contiguous float32 or float16 {shape} buffer, "
                                 f"got {kv.dtype} {tuple(kv.shape)}")
            ctx = kv.shape[3]
            layer_bytes = 2 * hkv * ctx * d * kv.element_size()
            base = kv.data_ptr()
            return ((ctypes.c_void_p * n)(*[base + i * layer_bytes for i in range(n)]),
                    (ctypes.c_int64 * n)(*[ctx] * n), kv.dtype, ctx)
        if len(kv) != n:
            raise ValueError(f"kv must hold one buffer per layer ({n}), got {len(kv)}")
        dtype, ctx, rows = kv[0].dtype, 0, []
        for i, t in enumerate(kv):
            r = t.shape[2] if t.dim() == 4 else -1
            if (t.dtype != dtype or dtype not in (torch.float32, torch.float16) or tuple(t.shape) != (2, hkv, r, d)
                    or not t.is_contiguous() or r <= 0):
                raise ValueError(f"kv layer {i} must be a contiguous float32 or float16 (2, {hkv}, rows, {d}) "
                                 f"buffer like layer 0, got {t.dtype} {tuple(t.shape)}")
            if not cfg.is_sliding(i):
                if ctx and r != ctx:
                    raise ValueError(f"kv layer {i} holds {r} rows, the other global layers {ctx}")
                ctx = r
            rows.append(r)
        for i in cfg.sliding_layers:  # a ring of another size would put positions in other slots
            want = min(cfg.sliding_window, ctx) if ctx else rows[i]
            if rows[i] != want or rows[i] > cfg.sliding_window:
                raise ValueError(f"kv layer {i} (sliding) holds {rows[i]} rows, expected {want}")
        return ((ctypes.c_void_p * n)(*[t.data_ptr() for t in kv]), (ctypes.c_int64 * n)(*rows), dtype, ctx)

    def step(self, kv, token: int, pos: int, want_logits: bool, frozen_global: bool = False) -> torch.Tensor | None:
        """`LlamaModel.forward(kv, [token], pos, want_logits, frozen_global)` for one token.
        kv: a session's buffers (see _kv_table), float32 or float16 (the new rows are rounded to
        f16 as they are written; attention converts the rows it reads, never the whole buffer).
        frozen_global: global layers read their rows and write none (a restore's replay)."""
        cfg = self.cfg
        ptrs, rows, dtype, ctx = self._kv_table(kv)
        if not 0 <= pos < self._table.rope_rows or (ctx and pos >= ctx):
            raise ValueError(f"position {pos} outside the session's {ctx or self._table.rope_rows} rows")
        if not 0 <= token < cfg.vocab_size:
            raise ValueError(f"token id {token} outside vocab of {cfg.vocab_size}")
        logits = torch.empty(cfg.vocab_size, dtype=torch.float32) if want_logits else None
        most = max(rows)
        cfg_word = qgemv.config()
        with qgemv.kernel_lock:
            if most > self._ws_rows:  # grows to the largest session seen, then stays
                n = self._lib.ds4k_llama_workspace(cfg_word, ctypes.byref(self._table), most)
                self._ws, self._ws_rows = torch.empty(n, dtype=torch.float32), most
            rc = self._lib.ds4k_llama_step(
                cfg_word, ctypes.byref(self._table), ptrs, rows, int(dtype == torch.float16), pos, token,
                FROZEN_GLOBAL if frozen_global else 0,
                None if logits is None else logits.data_ptr(), self._ws.data_ptr(), qgemv.num_threads(),
            )
        if rc != 0:
            raise RuntimeError(f"ds4k_llama_step rejected token {token} at position {pos} (rows {list(rows)})")
        return logits


def make_fast_decoder(cfg, tensors: Mapping[str, torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor],
                      raw: Mapping[str, Part | Sequence[Part]] | None,
                      local_rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> FastDecoder | None:
    """A FastDecoder (arguments as for FastDecoder), or None when the kernels run on the
    torch backend or the shapes are outside what llama_step.c handles."""
    lib = qgemv.library()
    if lib is None or not supported(cfg):
        return None
    return FastDecoder(cfg, tensors, rope, raw or {}, lib, local_rope)


def supported(cfg) -> bool:
    """Shapes llama_step.c handles (its MAX_GROUP, MAX_HEAD_DIM and qgemv.c's MAX_COLS)."""
    return (cfg.head_dim % 2 == 0 and cfg.head_dim <= 256 and cfg.num_heads // cfg.num_kv_heads <= 16
            and max(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim) <= qgemv.GEMV_MAX_COLS)
