"""The llama-family model: weights and the forward pass (SmolLM2, tiny-llama).

Owns the math of one forward over a chunk of tokens at an absolute position,
written against a session's static KV buffer, in the internal weight layout of
config.py. The session (session.py) owns state and the payload; weights.py (Hugging
Face directories) and gguf.py (GGUF files) turn files into that layout and are the
entry points `engine/loader.py` calls.
"""

from __future__ import annotations

import threading
from typing import Mapping

import torch
import torch.nn.functional as F

from ds4tui.engine.errors import WeightsError
from ds4tui.engine.kernels.llama_step import make_fast_decoder
from ds4tui.engine.kernels.qgemm import make_blocks
from ds4tui.engine.llama.config import LlamaConfig, expected_shapes
from ds4tui.engine.llama.session import LlamaSession
from ds4tui.engine.model import ChatTemplate, Model, ModelInfo, Tokenizer

# A session's context when the caller names none: SmolLM2's 8192 would pin 377 MB of fp32 KV;
# 4096 (189 MB) is plenty for a chat on a CPU, where filling it takes tens of seconds.
DEFAULT_CTX = 4096
# Products of at most this many activation rows go through the weights' file blocks when
# present (qgemm.c): the measured crossover against fp32 torch (docs/perf.md, "Short prefills").
_SMALL_ROWS = 256
# Prefill chunk: 512 tokens keep the [G*S, T] masks and activations small while matmuls stay
# large enough to run near peak; chunk ends are aligned to absolute multiples (session.py).
CHUNK_SIZE = 512


class Linear:
    """y = x W^T with W float32 [out, in]: the only place a layer multiplies by a weight.

    `blocks`, when set (LlamaModel attaches the GGUF's own blocks), takes the
    products the forward marks `small` (at most _SMALL_ROWS rows while the C kernels run):
    a short prefill (the new message after a disk-cache restore) then reads 5x fewer
    weight bytes than the fp32 copy, the same values up to summation order.
    """

    __slots__ = ("weight", "blocks")

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.blocks = None

    def __call__(self, x: torch.Tensor, small: bool = False) -> torch.Tensor:
        if small and self.blocks is not None:
            return self.blocks.matmul(x)
        return F.linear(x, self.weight)


def make_linear(weight: torch.Tensor) -> Linear:
    return Linear(weight)


class LlamaLayer:
    __slots__ = ("attn_norm", "wqkv", "wo", "ffn_norm", "w13", "w2")

    def __init__(self, tensors: Mapping[str, torch.Tensor], i: int) -> None:
        p = f"layers.{i}."
        self.attn_norm = tensors[p + "attn_norm"]
        self.wqkv = make_linear(tensors[p + "wqkv"])
        self.wo = make_linear(tensors[p + "wo"])
        self.ffn_norm = tensors[p + "ffn_norm"]
        self.w13 = make_linear(tensors[p + "w13"])
        self.w2 = make_linear(tensors[p + "w2"])


def check_tensors(cfg: LlamaConfig, tensors: Mapping[str, torch.Tensor], source: str) -> None:
    for name, shape in expected_shapes(cfg).items():
        t = tensors.get(name)
        if t is None:
            raise WeightsError(f"{source}: tensor {name} is missing")
        if tuple(t.shape) != shape:
            raise WeightsError(f"{source}: tensor {name} has shape {tuple(t.shape)}, config needs {shape}")
        if t.dtype != torch.float32:
            raise WeightsError(f"{source}: tensor {name} is {t.dtype}, expected float32")


class LlamaModel(Model):
    """Weights (float32, shared read-only by every session) and the forward pass."""

    # kernels.quants.QuantMix of the source GGUF (set by its loader), for reports; None otherwise.
    quant_mix = None

    def __init__(
        self,
        cfg: LlamaConfig,
        tensors: Mapping[str, torch.Tensor],
        info: ModelInfo,
        tokenizer: Tokenizer,
        chat: ChatTemplate,
        source: str,
        raw: Mapping[str, tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        """raw: weights also kept as the file's blocks, {name: (type, uint8 blocks) or a list of
        such row parts}, for the C kernels (kernels/raw_weights.py); absent ones use the fp32 copy."""
        check_tensors(cfg, tensors, source)
        self.cfg = cfg
        self.info = info
        self.tokenizer = tokenizer
        self.chat = chat
        self.embed = tensors["embed"]
        self.norm = tensors["norm"]
        self.lm_head = make_linear(tensors["embed"] if cfg.tie_word_embeddings else tensors["lm_head"])
        self.layers = [LlamaLayer(tensors, i) for i in range(cfg.num_layers)]
        # RoPE tables for every position, computed the way HF does (float32 inv_freq x position).
        half = cfg.head_dim // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
        freqs = torch.outer(torch.arange(cfg.max_position_embeddings, dtype=torch.float32), inv_freq)
        self.cos = freqs.cos().contiguous()  # [n_ctx, D/2]
        self.sin = freqs.sin().contiguous()
        assert self.cos.shape[1] == half
        # Batch-1 forwards (decode) run as one C call over the raw blocks (kernels/); None on
        # the torch kernel backend, and tests may set it to None to force the torch path.
        self.fast = make_fast_decoder(cfg, tensors, (self.cos, self.sin), raw)
        if self.fast is not None and raw:  # block products only where the C step runs too
            for i, layer in enumerate(self.layers):
                for name in ("wqkv", "wo", "w13", "w2"):
                    lin = getattr(layer, name)
                    lin.blocks = make_blocks(raw.get(f"layers.{i}.{name}"), lin.weight)
            self.lm_head.blocks = make_blocks(raw.get("embed" if cfg.tie_word_embeddings else "lm_head"),
                                              self.lm_head.weight)
        # One KV buffer written through by warm_up, handed to the next new_session of its size.
        self._spare: torch.Tensor | None = None
        self._spare_lock = threading.Lock()

    def _ctx(self, ctx_size: int | None) -> int:
        ctx = min(self.cfg.max_position_embeddings, DEFAULT_CTX) if ctx_size is None else int(ctx_size)
        if not 0 < ctx <= self.cfg.max_position_embeddings:
            raise ValueError(f"ctx_size {ctx} outside 1..{self.cfg.max_position_embeddings}")
        return ctx

    def new_session(self, ctx_size: int | None = None) -> LlamaSession:
        ctx = self._ctx(ctx_size)
        with self._spare_lock:
            kv, self._spare = self._spare, None
        if kv is not None and kv.shape[3] != ctx:
            kv = None  # warmed for another context size: dropped, not kept alongside
        return LlamaSession(self, ctx, CHUNK_SIZE, kv=kv)

    def warm_up(self, ctx_size: int | None = None) -> None:
        """Pay this process's first-use costs now (the app calls this in its model-loading
        worker) instead of inside the first message's time to first token.

        A fresh process pays for its first forward (page faults on the memory-mapped weights,
        oneDNN/MKL first calls) and a new session's KV buffer for its first writes (a restore,
        or a prefill); docs/perf.md, "First-use costs and warm_up", has the measurements. So:
        one short chunked forward and one decode step (every fp32 weight page, every raw block
        page, the C step's workspace and thread pool) in a session of `ctx_size`, whose buffer
        is then written through and kept for the next new_session of that size.
        """
        ctx = self._ctx(ctx_size)
        session = self.new_session(ctx)
        n = min(8, ctx - 1, self.cfg.vocab_size)
        if n >= 2:
            tokens = list(range(n))
            with torch.inference_mode():
                self.forward(session.kv, tokens, 0, True)  # the torch prefill path
                self.forward(session.kv, tokens[:1], n, True)  # the decode step (C when available)
        session.kv.numpy().fill(0.0)  # one thread: torch's fill would split over OpenMP threads
        with self._spare_lock:
            self._spare = session.kv

    def forward(self, kv: torch.Tensor, tokens: list[int], pos: int, want_logits: bool) -> torch.Tensor | None:
        """Run `tokens` at absolute positions pos..pos+S-1, writing their K/V rows into `kv`.

        kv: the session's static buffer [layers, 2 (K, V), Hkv, ctx, D], valid for positions
        < pos on entry and < pos+S on return. Returns float32 logits [V] of the last position,
        or None. Call under torch.inference_mode().
        """
        if len(tokens) == 1 and self.fast is not None:
            return self.fast.step(kv, tokens[0], pos, want_logits)
        cfg = self.cfg
        s, end = len(tokens), pos + len(tokens)
        hq, hkv, d, g = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.group
        nqk = (hq + hkv) * d
        eps = cfg.rms_norm_eps
        # Few rows: multiply by the file's blocks (qgemm.c); `fast = None` keeps all-torch fp32.
        small = self.fast is not None and s <= _SMALL_ROWS
        scale = d**-0.5
        x = F.embedding(torch.tensor(tokens, dtype=torch.long), self.embed)  # [S, H]
        cos = self.cos[pos:end].unsqueeze(1)  # [S, 1, D/2], broadcast over heads
        sin = self.sin[pos:end].unsqueeze(1)
        # Offset-aware causal mask: query s (absolute pos+s) sees keys 0..pos+s. SDPA's
        # is_causal would align the diagonal to the top-left and hide the cached rows.
        # Rows are (group member g, position s), g-major, matching the grouped q below.
        mask = None
        if s > 1:
            allowed = torch.arange(end).unsqueeze(0) <= torch.arange(pos, end).unsqueeze(1)  # [S, end]
            # Additive float mask built once: SDPA would convert a bool mask in every layer.
            mask = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf")).repeat(g, 1)  # [G*S, end]
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h = F.rms_norm(x, (cfg.hidden_size,), layer.attn_norm, eps)
            qkv = layer.wqkv(h, small)  # [S, (Hq + 2 Hkv) D]
            qk = _rope(qkv[:, :nqk].view(s, hq + hkv, d), cos, sin)  # [S, Hq + Hkv, D]
            k_all, v_all = kv[i, 0], kv[i, 1]  # [Hkv, ctx, D] each
            k_all[:, pos:end] = qk[:, hq:].transpose(0, 1)
            v_all[:, pos:end] = qkv[:, nqk:].view(s, hkv, d).transpose(0, 1)
            q = qk[:, :hq]
            layer_mask = mask
            if i == last:
                # Only the last position's output is ever used after the final layer: its K/V
                # are stored above; skip the rest unless logits are wanted, then do one row.
                if not want_logits:
                    return None
                x, q, s, layer_mask = x[-1:], q[-1:], 1, None
            k, v = k_all[:, :end], v_all[:, :end]  # [Hkv, end, D]: per-head rows contiguous
            # Grouped GQA: the G query heads sharing a KV head become G*S query rows of that
            # head, so K/V are never repeated: q [S, Hq, D] -> [Hkv, G*S, D].
            qg = q.reshape(s, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * s, d)
            if s == 1:
                # Decode: plain batched matmuls beat SDPA's CPU kernel for G query rows.
                att = torch.bmm(qg * scale, k.transpose(1, 2))  # [Hkv, G, end]
                o = torch.bmm(att.softmax(-1), v)  # [Hkv, G, D]
            else:
                # 4-D inputs: with 3-D ones SDPA falls back to its slower math path on CPU
                # (docs/perf.md, "SDPA input rank").
                o = F.scaled_dot_product_attention(qg[None], k[None], v[None], attn_mask=layer_mask)[0]  # [Hkv, G*S, D]
            o = o.view(hkv, g, s, d).permute(2, 0, 1, 3).reshape(s, hq * d)  # [S, Hq D]
            x = x + layer.wo(o, small)
            h = F.rms_norm(x, (cfg.hidden_size,), layer.ffn_norm, eps)
            gu = layer.w13(h, small)  # [S, 2F]
            f = cfg.intermediate_size
            x = x + layer.w2(F.silu(gu[:, :f]) * gu[:, f:], small)
        if not want_logits:
            return None
        out = F.rms_norm(x[-1:], (cfg.hidden_size,), self.norm, eps)
        return self.lm_head(out, self.fast is not None)[0].float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (HF `rotate_half` convention). x [S, heads, D]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
