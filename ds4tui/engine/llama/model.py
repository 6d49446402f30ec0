"""The llama-family model: weights and the forward pass (llama, qwen2, qwen3, gemma3).

Owns the math of one forward over a chunk of tokens at an absolute position,
written against a session's KV buffers, in the internal weight layout of
config.py; what differs between architectures is a config field (config.py).
A sliding-window layer keeps a ring of its last W rows (row of position p at slot
p % W) instead of the whole context. The session (session.py) owns state and the payload; weights.py (Hugging
Face directories) and gguf.py (GGUF files) turn files into that layout and are the
entry points `engine/loader.py` calls.
"""

from __future__ import annotations

import io
import math
import threading
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from ds4tui.engine import background
from ds4tui.engine.errors import WeightsError
from ds4tui.engine.kernels import attn as attn_kernel
from ds4tui.engine.kernels import qgemv
from ds4tui.engine.kernels.attn import attend
from ds4tui.engine.kernels.rows import glu, qk_rope, rms_norm
from ds4tui.engine.kernels.llama_step import LAYER_KV_ONLY, LAYER_LAST_ROW, make_fast_decoder
from ds4tui.engine.kernels.llama_step import supported as fast_supported
from ds4tui.engine.kernels.qgemm import make_blocks
from ds4tui.engine.llama.config import LlamaConfig, expected_shapes
from ds4tui.engine.llama.rope import rope_tables
from ds4tui.engine.llama.kv_buffers import (
    DEFAULT_KV_DTYPE,
    KV_DTYPES,
    KvBuffers,
    fits,
    kv_shapes,
    kv_torch_dtype,
    new_kv,
)
from ds4tui.engine.llama.session import LlamaSession
from ds4tui.engine.defaults import DEFAULT_CTX
from ds4tui.engine.model import ChatTemplate, Model, ModelInfo, Tokenizer
from ds4tui.engine.session import Session

TOUCH_STEP = 1 << 22  # elements prepare_session touches between checks for the process's exit
# Products of at most this many activation rows go through the weights' file blocks when
# present (qgemm.c) with the scalar kernels: the measured crossover against fp32 torch
# (docs/perf-archive.md, "Short prefills"). The AVX-512 and AVX2 variants of qgemm.c beat torch's
# fp32 GEMM at every size (docs/perf-archive.md, "Prefill: attention and GEMMs in C" and "The
# products at 512 rows, one core and two"), so there every product takes the blocks.
_SMALL_ROWS = 256
# Prefill chunk: 512 tokens keep the [G*S, T] masks and activations small while matmuls stay
# large enough to run near peak; chunk ends are aligned to absolute multiples (session.py).
CHUNK_SIZE = 512


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
        self.layers = [LlamaLayer(cfg, tensors, i) for i in range(cfg.num_layers)]
        # RoPE tables for every position (rope.py): global layers use rope_theta and the scaling
        # (divisors, attention factor); sliding layers their own base when the architecture has
        # one (Gemma 3: 10000), never scaled, as in llama.cpp and transformers.
        d, rows = cfg.head_dim, cfg.max_position_embeddings
        self.cos, self.sin = rope_tables(d, rows, cfg.rope_theta,
                                         tensors.get("rope_freqs") if cfg.rope_freq_factors else None,
                                         cfg.rope_attn_factor)
        self.local_cos, self.local_sin = self.cos, self.sin
        local_theta = cfg.rope_local_theta or cfg.rope_theta
        if cfg.sliding_layers and (local_theta != cfg.rope_theta or cfg.rope_freq_factors or cfg.rope_attn_factor != 1.0):
            self.local_cos, self.local_sin = rope_tables(d, rows, local_theta)
        # Batch-1 forwards (decode) run as one C call over the raw blocks (kernels/); None on
        # the torch kernel backend or for shapes the step does not take, and tests may set it
        # to None to force the torch path.
        self.fast = make_fast_decoder(cfg, tensors, (self.cos, self.sin), raw, (self.local_cos, self.local_sin))
        # The GGUF loader's move of the raw blocks into huge pages (kernels/huge_pages.py), which
        # warm_up starts last; None where nothing moves.
        self.huge_pages = None
        # Block products (short forwards) wherever the kernels read a matrix's type (the rest
        # multiply by the fp32 copy); see _block_products for when they are used.
        self.use_blocks = False
        if raw:
            for i, layer in enumerate(self.layers):
                for name in ("wqkv", "wo", "w13", "w2"):
                    lin = getattr(layer, name)
                    lin.blocks = make_blocks(raw.get(f"layers.{i}.{name}"), lin.weight)
                    self.use_blocks |= lin.blocks is not None
            self.lm_head.blocks = make_blocks(raw.get("embed" if cfg.tie_word_embeddings else "lm_head"),
                                              self.lm_head.weight)
            self.use_blocks |= self.lm_head.blocks is not None
        # Attention and the gated activation in C whenever the library is loaded (and attn.c
        # takes the head size).
        self.use_c_kernels = attn_kernel.available() and attn_kernel.supports(cfg.head_dim)
        # A chunk's layers as one C call each (kernels/chunk.c) where that call multiplies by the
        # very blocks the layers' Linear.blocks hold; tests set it False to compare.
        self.use_c_layers = self._table_matches_blocks()
        # What the loader knows about the file (quant_mix: {type: parameters}, chat: format line).
        self.details: dict = {}
        # At most one set of KV buffers, already touched, handed to the next new_session of its
        # shapes: warm_up's, a released session's (release_session) or prepare_session's.
        self._spare: KvBuffers | None = None
        self._spare_lock = threading.Lock()
        self._preparing: threading.Thread | None = None  # prepare_session's, while it runs

    def describe(self) -> str:
        """One line for the model info: architecture, weight types, attention layout, what
        decodes (the fused C step or the torch forward), chat format."""
        cfg = self.cfg
        rope = self.details.get("rope") or ("scaled RoPE" if cfg.rope_freq_factors else "")
        parts = [f"{cfg.arch}, {cfg.num_layers} layers, hidden {cfg.hidden_size}" + (f", {rope}" if rope else "")]
        if self.quant_mix is not None:
            parts.append(f"weights {self.quant_mix.summary()}")
        elif self.details.get("weights"):
            parts.append(f"weights {self.details['weights']}")
        parts.append(cfg.swa_layout())
        parts.append("decode: fused C step" if self.fast is not None else "decode: torch")
        if self.use_blocks and qgemv.bf16_products():
            parts.append("prefill products: bf16")
        if self.details.get("chat"):
            parts.append(f"chat: {self.details['chat']}")
        return "; ".join(parts)

    def _ctx(self, ctx_size: int | None) -> int:
        ctx = min(self.cfg.max_position_embeddings, DEFAULT_CTX) if ctx_size is None else int(ctx_size)
        if not 0 < ctx <= self.cfg.max_position_embeddings:
            raise ValueError(f"ctx_size {ctx} outside 1..{self.cfg.max_position_embeddings}")
        return ctx

    def new_session(self, ctx_size: int | None = None, *, kv_dtype: str | None = None) -> LlamaSession:
        """kv_dtype: "f16" (None: the default, as llama.cpp's cache) or "f32"."""
        ctx = self._ctx(ctx_size)
        kv_dtype = kv_dtype or DEFAULT_KV_DTYPE
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype {kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")
        return LlamaSession(self, ctx, CHUNK_SIZE, kv=self.take_spare(ctx, kv_dtype), kv_dtype=kv_dtype)

    def take_spare(self, ctx: int, kv_dtype: str) -> KvBuffers | None:
        """The spare KV buffers, handed over, when they fit a session of `ctx` and `kv_dtype`;
        None otherwise (a spare that does not fit is dropped, not kept alongside)."""
        with self._spare_lock:
            kv, self._spare = self._spare, None
        return kv if kv is not None and fits(kv, self.cfg, ctx, KV_DTYPES[kv_dtype]) else None

    def warm_up(self, ctx_size: int | None = None, *, kv_dtype: str | None = None) -> None:
        """Pay this process's first-use costs now (the app calls this in its model-loading
        worker) instead of inside the first message's time to first token.

        A fresh process pays for its first forward (page faults on the memory-mapped weights,
        oneDNN/MKL first calls) and a new session's KV buffer for its first writes (a restore,
        or a prefill); docs/perf-archive.md, "First-use costs and warm_up", has the measurements. So:
        one short chunked forward and one decode step (every fp32 weight page, every raw block
        page, the C step's workspace and thread pool) in a session of `ctx_size`, whose buffer
        is then written through and kept for the next new_session of that size. Last, it starts
        the move of the raw blocks into huge pages, which runs on behind the ready model.
        """
        ctx = self._ctx(ctx_size)
        session = self.new_session(ctx, kv_dtype=kv_dtype)
        n = min(8, ctx - 1, self.cfg.vocab_size)
        if n >= 2:
            tokens = list(range(n))
            with torch.inference_mode():
                self.forward(session.kv, tokens, 0, True)  # the chunk path (attention, per-row steps)
                self.forward(session.kv, tokens[:1], n, True)  # the decode step (C when available)
            if n + 2 < ctx:
                self._warm_restore(session, tokens)
        for t in session.kv:
            t.numpy().fill(0.0)  # one thread: torch's fill would split over OpenMP threads
        with self._spare_lock:
            self._spare = session.kv
        if self.huge_pages is not None:  # now, not alongside the forwards above
            self.huge_pages.start()

    def release_session(self, session: Session) -> None:
        """`session` is done with for good (its chat was evicted or closed, and nothing else
        will use it): its KV buffers become the spare the next new_session adopts, unless
        there is one already. That session then skips a fresh buffer's page faults on its first
        restore or prefill (~200 ms for SmolLM2's 92 MB at 4K on the Zen 4 VM against ~13 ms
        for the same restore into touched memory: docs/perf-archive.md, "Recycled and prepared KV buffers")."""
        if not isinstance(session, LlamaSession) or session.model is not self:
            return
        kv = session.release()
        with self._spare_lock:
            if kv is not None and self._spare is None:
                self._spare = kv

    def prepare_session(self, ctx_size: int | None = None, *, kv_dtype: str | None = None,
                        wait: bool = False) -> None:
        """Touch the next session's KV buffers now, on a background thread at the lowest
        priority (it takes a core only when nothing else wants one), unless a spare exists or
        is being made, or the system is short of memory (engine/background.py,
        memory_to_spare): the next new_session of this size adopts them. wait: return once done."""
        ctx = self._ctx(ctx_size)
        kv_dtype = kv_dtype or DEFAULT_KV_DTYPE
        itemsize = kv_torch_dtype(kv_dtype).itemsize  # a bad name raises here, not on the thread
        if not background.memory_to_spare(itemsize * sum(math.prod(s) for s in kv_shapes(self.cfg, ctx))):
            return  # short of memory: the next session allocates its own, as it always could
        with self._spare_lock:
            thread = self._preparing
            if thread is None and self._spare is None:
                thread = self._preparing = background.start(lambda: self._prepare(ctx, kv_dtype), "ds4tui-kv-spare")
        if wait and thread is not None:
            thread.join()

    def _prepare(self, ctx: int, kv_dtype: str) -> None:
        kv = None
        try:
            kv = new_kv(self.cfg, ctx, kv_dtype)
            for t in (kv,) if isinstance(kv, torch.Tensor) else kv:
                flat = t.numpy().reshape(-1)  # numpy: one thread, this one
                for i in range(0, flat.size, TOUCH_STEP):
                    if background.stopping():
                        kv = None
                        break
                    flat[i:i + TOUCH_STEP] = 0  # its pages faulted in here
        except Exception:  # noqa: BLE001 - only a head start: a session then allocates its own, as before
            kv = None  # (and no traceback from a background thread over the chat's screen)
        finally:
            with self._spare_lock:
                if kv is not None and self._spare is None:
                    self._spare = kv
                self._preparing = None

    @staticmethod
    def _warm_restore(session: LlamaSession, tokens: list[int]) -> None:
        """A disk hit's path once, on a few tokens: save, then load with the next two tokens'
        forward alongside the read (session.py's load_payload_ahead: the reader thread, the
        layer gate, the payload checks), then the prefill that takes that chunk. A fresh
        process's first hit ran ~1 ms slower without it (code and data not yet in the caches)."""
        session.reset()
        session.prefill(tokens)
        buf = io.BytesIO()
        session.save_payload(buf)
        data = buf.getvalue()
        session.load_payload_ahead(io.BytesIO(data), len(data), tokens[:2])
        session.prefill(tokens[:2])
        session.reset()

    @property
    def _c_kernels(self) -> bool:
        """Whether a forward's attention and gated activation run in C (kernels/attn.c,
        glu.c); tied to the C step like the block products, so `model.fast = None` keeps the
        whole forward in torch."""
        return self.use_c_kernels and (self.fast is not None or not fast_supported(self.cfg))

    def _table_matches_blocks(self) -> bool:
        """Whether the C step's table holds, for every layer, the same parts as the layers'
        Linear.blocks (same blocks, types and rows): then chunk.c's layer computes exactly what
        the forward's per-layer steps compute."""
        if self.fast is None:
            return False
        for i, layer in enumerate(self.layers):
            held = self.fast.layer_mats(i)
            for name in ("wqkv", "wo", "w13", "w2"):
                blocks = getattr(layer, name).blocks
                if blocks is None:
                    return False
                mats = [(b.data_ptr(), qgemv.TYPE_IDS[t], b.shape[0]) for t, b in blocks.parts]
                if mats != held[name]:
                    return False
        return True

    def _block_products(self) -> bool:
        """Whether short products go through the file's blocks: where the C step runs too (or
        cannot run: shapes outside llama_step.c's), so `model.fast = None` keeps the whole
        forward in torch fp32, the reference the step is tested against."""
        return self.use_blocks and (self.fast is not None or not fast_supported(self.cfg))

    def forward(self, kv: KvBuffers, tokens: list[int], pos: int, want_logits: bool,
                frozen_global: bool = False, before_layer: Callable[[int], None] | None = None) -> torch.Tensor | None:
        """Run `tokens` at absolute positions pos..pos+S-1, writing their K/V rows into `kv`.

        kv: the session's buffers (float32 or float16), one [2 (K, V), Hkv, rows, D] per layer (a global layer's
        rows are the context, valid for positions < pos on entry and < pos+S on return; a
        sliding layer's are its ring, see session.py). frozen_global: global layers read their
        rows but write none (a restore's replay: their stored rows are already exact).
        before_layer(i), when given, is called before layer i touches kv[i]: a restore that is
        still filling the rows < pos layer by layer waits there (session.py); the fused
        one-token step runs every layer in one call, so it is never given one.
        Returns float32 logits [V] of the last position, or None. Call under torch.inference_mode().
        """
        if len(tokens) == 1 and self.fast is not None:
            assert before_layer is None, "the fused step runs all layers in one call"
            return self.fast.step(kv, tokens[0], pos, want_logits, frozen_global)
        cfg = self.cfg
        s, end = len(tokens), pos + len(tokens)
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        nqk = (hq + hkv) * d
        eps = cfg.rms_norm_eps
        # Multiply by the file's blocks (qgemm.c) where they win; `fast = None` keeps all-torch fp32.
        small = self._block_products() and (s <= _SMALL_ROWS or qgemv.backend() != "scalar")
        scale = cfg.attn_scale
        x = F.embedding(torch.tensor(tokens, dtype=torch.long), self.embed)  # [S, H]
        if cfg.embed_scale != 1.0:
            x = x * torch.tensor(cfg.embed_scale, dtype=torch.float32)
        if small and self.use_c_layers and self.fast is not None and self._c_kernels and not frozen_global:
            # The same steps as the loop below, each layer in one C call (kernels/chunk.c).
            x = x.contiguous()
            last = len(self.layers) - 1
            for i, layer in enumerate(self.layers):
                if before_layer is not None:
                    before_layer(i)
                flags = 0 if i < last else LAYER_LAST_ROW if want_logits else LAYER_KV_ONLY
                self.fast.layer(kv[i], i, x, pos, flags, layer.qk_norm, scale)
            return self._logits(x[-1:]) if want_logits else None
        ropes = {False: (self.cos[pos:end], self.sin[pos:end]),  # [S, D/2]
                 True: (self.local_cos[pos:end], self.local_sin[pos:end])}
        # Attention in C (kernels/attn.c) reads the K/V rows in place, f16 or f32, with the causal
        # and window masks computed on the fly; without the C library, torch's SDPA over additive
        # masks. Both are deterministic for a given chunk, so a replayed chunk matches the live one.
        # The per-row steps (RMSNorm, q/k RoPE, the gated activation) run in C alongside
        # (kernels/rows.c: one pass each instead of several torch ops).
        w = cfg.sliding_window
        c_kernels = self._c_kernels
        torch_attn = None if c_kernels else _TorchAttention(cfg, pos, s)
        if c_kernels:
            def norm(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
                return rms_norm(t, weight, eps)
        else:
            def norm(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
                return F.rms_norm(t, (cfg.hidden_size,), weight, eps)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if before_layer is not None:
                before_layer(i)
            h = norm(x, layer.attn_norm)
            qkv = layer.wqkv(h, small)  # [S, (Hq + 2 Hkv) D]
            cos, sin = ropes[layer.sliding]
            if c_kernels:
                qk = qk_rope(qkv, hq + hkv, d, cos, sin, layer.qk_norm, eps)  # [S, Hq + Hkv, D]
            else:
                qk = qkv[:, :nqk].view(s, hq + hkv, d)
                if layer.qk_norm is not None:
                    qk = F.rms_norm(qk, (d,), None, eps) * layer.qk_norm
                qk = _rope(qk, cos.unsqueeze(1), sin.unsqueeze(1))  # [S, Hq + Hkv, D]
            k_new = qk[:, hq:].transpose(0, 1)  # [Hkv, S, D]
            v_new = qkv[:, nqk:].view(s, hkv, d).transpose(0, 1)
            k_all, v_all = kv[i][0], kv[i][1]  # [Hkv, rows, D] each
            if k_all.dtype != torch.float32:
                # f16 KV: each row is rounded once, here; the chunk's own rows are read back
                # rounded too, as a later token reads them (and as the C step does).
                k_new, v_new = k_new.to(k_all.dtype), v_new.to(k_all.dtype)
            if not layer.sliding and not frozen_global:
                k_all[:, pos:end] = k_new
                v_all[:, pos:end] = v_new
            q = qk[:, :hq]  # [S, Hq, D]
            if i == last:
                # Only the last position's output is ever used after the final layer: its K/V
                # are stored above; skip the rest unless logits are wanted, then do one row.
                if not want_logits:
                    if layer.sliding:
                        _ring_write(k_all, v_all, k_new, v_new, pos)
                    return None
                x, q = x[-1:], q[-1:]
            # A sliding layer's ring is read before the chunk's rows go in: they may overwrite
            # ring rows the chunk's first queries still see.
            if torch_attn is not None:
                o = torch_attn(layer.sliding, q, k_all, v_all, k_new, v_new)
            elif layer.sliding:
                o = attend(q, k_all, v_all, qpos=end - q.shape[0], kbase=pos, k_new=k_new, v_new=v_new,
                           window=w, scale=scale)
            else:
                o = attend(q, k_all, v_all, qpos=end - q.shape[0], kbase=end, scale=scale)  # [S, Hq D]
            if layer.sliding:
                _ring_write(k_all, v_all, k_new, v_new, pos)
            o = layer.wo(o, small)
            if layer.post_attn_norm is not None:
                o = norm(o, layer.post_attn_norm)
            x = x + o
            h = norm(x, layer.ffn_norm)
            gu = layer.w13(h, small)  # [S, 2F]
            if c_kernels:
                a = glu(gu, cfg.act)  # one pass: act(gate) * up
            else:
                f = cfg.intermediate_size
                a = (F.silu(gu[:, :f]) if cfg.act == "silu" else F.gelu(gu[:, :f], approximate="tanh")) * gu[:, f:]
            o = layer.w2(a, small)
            if layer.post_ffn_norm is not None:
                o = norm(o, layer.post_ffn_norm)
            x = x + o
        if not want_logits:
            return None
        return self._logits(x[-1:])

    def decode_batch(self, kvs: list[KvBuffers], tokens: list[int], positions: list[int]) -> list[torch.Tensor]:
        """One decode step for B sequences together: token b at position positions[b] of the
        session whose buffers are kvs[b] (each its own KV and position). The products run over
        the B rows at once (each weight read once per step for all of them, through the
        file's blocks: qgemm.c), RoPE and attention per row over that row's own buffers.
        Returns each row's float32 logits [V]. The same math as B one-token forwards up to
        float summation order (the fused step is a GEMV, this a GEMM): tests/engine/llama
        states the tolerance. Without the C kernels and blocks: B forwards, one after another.
        Call under torch.inference_mode()."""
        b = len(tokens)
        if not (self._c_kernels and self._block_products()) or b == 1:
            return [self.forward(kv, [t], pos, True) for kv, t, pos in zip(kvs, tokens, positions)]
        cfg = self.cfg
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        nqk = (hq + hkv) * d
        eps, scale, w = cfg.rms_norm_eps, cfg.attn_scale, cfg.sliding_window
        small = b <= _SMALL_ROWS or qgemv.backend() != "scalar"
        at = torch.tensor(positions, dtype=torch.long)
        ropes = {False: (self.cos[at].contiguous(), self.sin[at].contiguous()),  # [B, D/2]
                 True: (self.local_cos[at].contiguous(), self.local_sin[at].contiguous())}
        x = F.embedding(torch.tensor(tokens, dtype=torch.long), self.embed)  # [B, H]
        if cfg.embed_scale != 1.0:
            x = x * torch.tensor(cfg.embed_scale, dtype=torch.float32)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, eps)
            qkv = layer.wqkv(h, small)  # [B, (Hq + 2 Hkv) D]
            cos, sin = ropes[layer.sliding]
            qk = qk_rope(qkv, hq + hkv, d, cos, sin, layer.qk_norm, eps)  # [B, Hq + Hkv, D]
            v_all_new = qkv[:, nqk:].view(b, hkv, d)
            outs = []
            for r in range(b):
                pos, buf = positions[r], kvs[r][i]
                k_all, v_all = buf[0], buf[1]
                k_new = qk[r, hq:].unsqueeze(1).to(k_all.dtype)  # [Hkv, 1, D]
                v_new = v_all_new[r].unsqueeze(1).to(k_all.dtype)
                q = qk[r:r + 1, :hq]
                if layer.sliding:
                    outs.append(attend(q, k_all, v_all, qpos=pos, kbase=pos, k_new=k_new, v_new=v_new,
                                       window=w, scale=scale))
                    _ring_write(k_all, v_all, k_new, v_new, pos)
                else:
                    k_all[:, pos] = k_new[:, 0]
                    v_all[:, pos] = v_new[:, 0]
                    outs.append(attend(q, k_all, v_all, qpos=pos, kbase=pos + 1, scale=scale))
            o = layer.wo(torch.cat(outs), small)
            if layer.post_attn_norm is not None:
                o = rms_norm(o, layer.post_attn_norm, eps)
            x = x + o
            h = rms_norm(x, layer.ffn_norm, eps)
            o = layer.w2(glu(layer.w13(h, small), cfg.act), small)
            if layer.post_ffn_norm is not None:
                o = rms_norm(o, layer.post_ffn_norm, eps)
            x = x + o
        out = F.rms_norm(x, (cfg.hidden_size,), self.norm, eps)
        logits = self.lm_head(out, True).float()  # [B, V]
        if cfg.final_logit_softcapping:
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return list(logits.unbind(0))

    def _logits(self, last: torch.Tensor) -> torch.Tensor:
        """float32 logits [V] of the final layer's output row last [1, H]."""
        cfg = self.cfg
        out = F.rms_norm(last, (cfg.hidden_size,), self.norm, cfg.rms_norm_eps)
        logits = self.lm_head(out, self._block_products())[0].float()
        if cfg.final_logit_softcapping:
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))


class _TorchAttention:
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

