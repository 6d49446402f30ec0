"""One layer of the llama-family forward: its weights and its math over a chunk, or over
several sessions' decode rows at once.

Owns `Linear` (the only place a layer multiplies by a weight: the fp32 copy or the file's
blocks), `LlamaLayer` (attention with RoPE, the K/V rows into the session's buffers, a
sliding layer's ring, the gated FFN), the torch attention used without the C library, and
the ring and RoPE helpers. The model (model.py) runs the layers in order and owns what
they share: the embedding, the RoPE tables, the final norm and the logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F

from ds4tui.engine.kernels import qgemv
from ds4tui.engine.kernels.attn import attend
from ds4tui.engine.kernels.qgemm import make_blocks
from ds4tui.engine.kernels.rows import glu, qk_rope, rms_norm
from ds4tui.engine.llama.config import LlamaConfig


class Linear:
    """y = x W^T (+ b) with W float32 [out, in]: the only place a layer multiplies by a weight.

    `blocks`, when set (LlamaModel attaches the GGUF's own blocks), takes the
    products the forward marks `small` (every chunk with the AVX-512 kernels, chunks of at
    most _SMALL_ROWS rows with the others): a short prefill (the new message after a
    disk-cache restore) then reads 5x fewer weight bytes than the fp32 copy, a long one runs
    qgemm.c's register tiles instead of torch's fp32 GEMM; the same values up to summation order.
    """

    __slots__ = ("weight", "bias", "blocks")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.blocks = None

    def __call__(self, x: torch.Tensor, small: bool = False) -> torch.Tensor:
        if small and self.blocks is not None:
            y = self.blocks.matmul(x)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    return Linear(weight, bias)


class LlamaLayer:
    __slots__ = ("attn_norm", "wqkv", "qk_norm", "wo", "post_attn_norm", "ffn_norm", "w13", "w2",
                 "post_ffn_norm", "sliding")

    def __init__(self, cfg: LlamaConfig, tensors: Mapping[str, torch.Tensor], i: int) -> None:
        p = f"layers.{i}."
        self.attn_norm = tensors[p + "attn_norm"]
        self.wqkv = make_linear(tensors[p + "wqkv"], tensors.get(p + "bqkv") if cfg.attn_bias else None)
        # One [Hq + Hkv, D] weight for the per-head q and k norms (q heads first, as in wqkv).
        self.qk_norm = None
        if cfg.qk_norm:
            self.qk_norm = torch.cat([tensors[p + "q_norm"].expand(cfg.num_heads, -1),
                                      tensors[p + "k_norm"].expand(cfg.num_kv_heads, -1)]).contiguous()
        self.wo = make_linear(tensors[p + "wo"])
        self.ffn_norm = tensors[p + "ffn_norm"]
        self.w13 = make_linear(tensors[p + "w13"])
        self.w2 = make_linear(tensors[p + "w2"])
        self.post_attn_norm = tensors[p + "post_attn_norm"] if cfg.post_norms else None
        self.post_ffn_norm = tensors[p + "post_ffn_norm"] if cfg.post_norms else None
        self.sliding = cfg.is_sliding(i)

    def run_chunk(self, x: torch.Tensor, buf: torch.Tensor, chunk: ChunkPass, last: bool,
                  want_logits: bool) -> torch.Tensor | None:
        """This layer over a chunk's activations x [S, H] (the last layer: x [1, H] out, only
        the last position is used after it), writing the chunk's K/V rows into `buf`
        [2, Hkv, rows, D]; None from the last layer when no logits are wanted (its rows are
        in, nothing else is computed).

        Long because it is one layer's math in the order transformers and llama.cpp write it; split, its
        parts would pass a dozen tensors between them."""
        cfg, pos, end = chunk.cfg, chunk.pos, chunk.end
        s = x.shape[0]
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        nqk, eps, w, scale = (hq + hkv) * d, cfg.rms_norm_eps, cfg.sliding_window, cfg.attn_scale
        small, c_kernels, torch_attn, frozen_global = chunk.small, chunk.c_kernels, chunk.torch_attn, chunk.frozen_global
        h = chunk.norm(x, self.attn_norm)
        qkv = self.wqkv(h, small)  # [S, (Hq + 2 Hkv) D]
        cos, sin = chunk.ropes[self.sliding]
        if c_kernels:
            qk = qk_rope(qkv, hq + hkv, d, cos, sin, self.qk_norm, eps)  # [S, Hq + Hkv, D]
        else:
            qk = qkv[:, :nqk].view(s, hq + hkv, d)
            if self.qk_norm is not None:
                qk = F.rms_norm(qk, (d,), None, eps) * self.qk_norm
            qk = _rope(qk, cos.unsqueeze(1), sin.unsqueeze(1))  # [S, Hq + Hkv, D]
        k_new = qk[:, hq:].transpose(0, 1)  # [Hkv, S, D]
        v_new = qkv[:, nqk:].view(s, hkv, d).transpose(0, 1)
        k_all, v_all = buf[0], buf[1]  # [Hkv, rows, D] each
        if k_all.dtype != torch.float32:
            # f16 KV: each row is rounded once, here; the chunk's own rows are read back
            # rounded too, as a later token reads them (and as the C step does).
            k_new, v_new = k_new.to(k_all.dtype), v_new.to(k_all.dtype)
        if not self.sliding and not frozen_global:
            k_all[:, pos:end] = k_new
            v_all[:, pos:end] = v_new
        q = qk[:, :hq]  # [S, Hq, D]
        if last:
            # Only the last position's output is ever used after the final layer: its K/V
            # are stored above; skip the rest unless logits are wanted, then do one row.
            if not want_logits:
                if self.sliding:
                    _ring_write(k_all, v_all, k_new, v_new, pos)
                return None
            x, q = x[-1:], q[-1:]
        # A sliding layer's ring is read before the chunk's rows go in: they may overwrite
        # ring rows the chunk's first queries still see.
        if torch_attn is not None:
            o = torch_attn(self.sliding, q, k_all, v_all, k_new, v_new)
        elif self.sliding:
            o = attend(q, k_all, v_all, qpos=end - q.shape[0], kbase=pos, k_new=k_new, v_new=v_new,
                       window=w, scale=scale)
        else:
            o = attend(q, k_all, v_all, qpos=end - q.shape[0], kbase=end, scale=scale)  # [S, Hq D]
        if self.sliding:
            _ring_write(k_all, v_all, k_new, v_new, pos)
        o = self.wo(o, small)
        if self.post_attn_norm is not None:
            o = chunk.norm(o, self.post_attn_norm)
        x = x + o
        h = chunk.norm(x, self.ffn_norm)
        gu = self.w13(h, small)  # [S, 2F]
        if c_kernels:
            a = glu(gu, cfg.act)  # one pass: act(gate) * up
        else:
            f = cfg.intermediate_size
            a = (F.silu(gu[:, :f]) if cfg.act == "silu" else F.gelu(gu[:, :f], approximate="tanh")) * gu[:, f:]
        o = self.w2(a, small)
        if self.post_ffn_norm is not None:
            o = chunk.norm(o, self.post_ffn_norm)
        x = x + o
        return x

    def decode_rows(self, x: torch.Tensor, bufs: list[torch.Tensor], positions: list[int],
                    ropes: dict[bool, tuple[torch.Tensor, torch.Tensor]], cfg: LlamaConfig,
                    small: bool) -> torch.Tensor:
        """This layer over B decode rows x [B, H] at once: row r at positions[r] of its own
        buffers bufs[r] (LlamaModel.decode_batch); the products over all rows, RoPE and
        attention per row."""
        b = x.shape[0]
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        nqk, eps, w, scale = (hq + hkv) * d, cfg.rms_norm_eps, cfg.sliding_window, cfg.attn_scale
        h = rms_norm(x, self.attn_norm, eps)
        qkv = self.wqkv(h, small)  # [B, (Hq + 2 Hkv) D]
        cos, sin = ropes[self.sliding]
        qk = qk_rope(qkv, hq + hkv, d, cos, sin, self.qk_norm, eps)  # [B, Hq + Hkv, D]
        v_all_new = qkv[:, nqk:].view(b, hkv, d)
        outs = []
        for r in range(b):
            pos, buf = positions[r], bufs[r]
            k_all, v_all = buf[0], buf[1]
            k_new = qk[r, hq:].unsqueeze(1).to(k_all.dtype)  # [Hkv, 1, D]
            v_new = v_all_new[r].unsqueeze(1).to(k_all.dtype)
            q = qk[r:r + 1, :hq]
            if self.sliding:
                outs.append(attend(q, k_all, v_all, qpos=pos, kbase=pos, k_new=k_new, v_new=v_new,
                                   window=w, scale=scale))
                _ring_write(k_all, v_all, k_new, v_new, pos)
            else:
                k_all[:, pos] = k_new[:, 0]
                v_all[:, pos] = v_new[:, 0]
                outs.append(attend(q, k_all, v_all, qpos=pos, kbase=pos + 1, scale=scale))
        o = self.wo(torch.cat(outs), small)
        if self.post_attn_norm is not None:
            o = rms_norm(o, self.post_attn_norm, eps)
        x = x + o
        h = rms_norm(x, self.ffn_norm, eps)
        o = self.w2(glu(self.w13(h, small), cfg.act), small)
        if self.post_ffn_norm is not None:
            o = rms_norm(o, self.post_ffn_norm, eps)
        x = x + o
        return x


PRODUCTS = ("wqkv", "wo", "w13", "w2")  # a layer's Linears


def attach_blocks(layers: list[LlamaLayer], lm_head: Linear, raw: Mapping, tie_word_embeddings: bool) -> bool:
    """Give each Linear the file's own blocks of its weight where the kernels read their type
    (raw: {name: (type, uint8 blocks) or row parts}, kernels/raw_weights.py); the rest multiply
    by the fp32 copy. Whether any got blocks."""
    used = False
    for i, layer in enumerate(layers):
        for name in PRODUCTS:
            lin = getattr(layer, name)
            lin.blocks = make_blocks(raw.get(f"layers.{i}.{name}"), lin.weight)
            used |= lin.blocks is not None
    lm_head.blocks = make_blocks(raw.get("embed" if tie_word_embeddings else "lm_head"), lm_head.weight)
    return used or lm_head.blocks is not None


def blocks_match_table(layers: list[LlamaLayer], fast) -> bool:
    """Whether the C step's table (kernels/llama_step.py) holds, for every layer, the same parts
    as the layers' Linear.blocks (same blocks, types and rows): then chunk.c's layer computes
    exactly what the forward's per-layer steps compute."""
    for i, layer in enumerate(layers):
        held = fast.layer_mats(i)
        for name in PRODUCTS:
            blocks = getattr(layer, name).blocks
            if blocks is None:
                return False
            mats = [(b.data_ptr(), qgemv.TYPE_IDS[t], b.shape[0]) for t, b in blocks.parts]
            if mats != held[name]:
                return False
    return True


@dataclass(frozen=True)
class ChunkPass:
    """What every layer of one chunked forward shares (LlamaModel.forward makes it once)."""

    cfg: LlamaConfig
    pos: int  # the chunk's first absolute position
    end: int  # pos + S
    ropes: dict[bool, tuple[torch.Tensor, torch.Tensor]]  # sliding? -> (cos, sin) [S, D/2]
    # Attention, RMSNorm, q/k RoPE and the gated activation in C (kernels/attn.c, rows.c);
    # without the C library, torch's SDPA over additive masks (torch_attn).
    c_kernels: bool
    torch_attn: TorchAttention | None
    small: bool  # the products through the file's blocks (Linear.blocks)
    frozen_global: bool  # global layers read their rows but write none (a restore's replay)

    def norm(self, t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.c_kernels:
            return rms_norm(t, weight, self.cfg.rms_norm_eps)
        return F.rms_norm(t, (self.cfg.hidden_size,), weight, self.cfg.rms_norm_eps)


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))


class TorchAttention:
    """Attention of one forward's chunk in torch (no C library): SDPA over additive masks
    built once per forward (SDPA would convert a bool mask in every layer), batched matmuls
    for one query row without a mask."""

    def __init__(self, cfg: LlamaConfig, pos: int, s: int) -> None:
        self.cfg, self.pos, self.s = cfg, pos, s
        end, g, w = pos + s, cfg.group, cfg.sliding_window
        # Rows are (group member g, position s), g-major, matching the grouped q below.
        # Global: query s (absolute pos+s) sees keys 0..pos+s. SDPA's is_causal would align the
        # diagonal to the top-left and hide the cached rows.
        self.mask = self.swa_mask = None
        if s > 1:
            allowed = torch.arange(end).unsqueeze(0) <= torch.arange(pos, end).unsqueeze(1)  # [S, end]
            self.mask = _additive(allowed).repeat(g, 1)  # [G*S, end]
        # Sliding: keys are the `past` ring rows before pos (oldest first), then the chunk's own;
        # query pos+s sees absolute keys pos+s-W+1..pos+s.
        self.past = min(pos, w - 1) if cfg.sliding_layers else 0
        if cfg.sliding_layers and s > 1:
            key_pos = torch.arange(pos - self.past, end).unsqueeze(0)
            q_pos = torch.arange(pos, end).unsqueeze(1)
            self.swa_mask = _additive((key_pos <= q_pos) & (key_pos > q_pos - w)).repeat(g, 1)  # [G*S, past+S]

    def __call__(self, sliding: bool, q: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor,
                 k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """o [S', Hq D] for q [S', Hq, D] (S' = 1: only the chunk's last query)."""
        cfg, pos, s = self.cfg, self.pos, self.s
        hq, hkv, d, g = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.group
        end = pos + s
        if sliding:
            k, v = _ring_keys(k_all, v_all, k_new, v_new, pos, self.past)
            mask = self.swa_mask
        else:
            k, v = k_all[:, :end], v_all[:, :end]  # [Hkv, end, D]: per-head rows contiguous
            mask = self.mask
        if k.dtype != torch.float32:
            k, v = k.float(), v.float()  # the used range only, once per layer and forward
        n = q.shape[0]
        if mask is not None and n < s:
            # The chunk's last query alone: a global layer's sees every key (no mask), a
            # sliding layer's keeps its band.
            mask = mask.view(g, s, -1)[:, -n:].reshape(g * n, -1) if sliding else None
        # Grouped GQA: the G query heads sharing a KV head become G*S query rows of that
        # head, so K/V are never repeated: q [S, Hq, D] -> [Hkv, G*S, D].
        qg = q.reshape(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
        if n == 1 and mask is None:
            # Decode: plain batched matmuls beat SDPA's CPU kernel for G query rows.
            att = torch.bmm(qg * cfg.attn_scale, k.transpose(1, 2))  # [Hkv, G, keys]
            o = torch.bmm(att.softmax(-1), v)  # [Hkv, G, D]
        else:
            # 4-D inputs: with 3-D ones SDPA falls back to its slower math path on CPU
            # (docs/perf-archive.md, "SDPA input rank"). None: SDPA's own 1/sqrt(D), as before.
            sdpa_scale = cfg.attn_scale if cfg.query_pre_attn_scalar else None
            o = F.scaled_dot_product_attention(qg[None], k[None], v[None], attn_mask=mask, scale=sdpa_scale)[0]
        return o.view(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, hq * d)


def _ring_keys(k_ring: torch.Tensor, v_ring: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
               pos: int, past: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys/values of a chunk on a sliding layer: the `past` ring rows before pos (oldest
    first) then the chunk's own rows."""
    slots = torch.arange(pos - past, pos) % k_ring.shape[1]
    k = torch.cat([k_ring.index_select(1, slots), k_new], dim=1)
    v = torch.cat([v_ring.index_select(1, slots), v_new], dim=1)
    return k, v


def _ring_write(k_ring: torch.Tensor, v_ring: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                pos: int) -> None:
    """The chunk's last rows into a sliding layer's ring (position p at slot p % capacity)."""
    cap, s = k_ring.shape[1], k_new.shape[1]
    keep = min(s, cap)
    dst = torch.arange(pos + s - keep, pos + s) % cap
    k_ring.index_copy_(1, dst, k_new[:, s - keep:])
    v_ring.index_copy_(1, dst, v_new[:, s - keep:])


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (HF `rotate_half` convention). x [S, heads, D]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
