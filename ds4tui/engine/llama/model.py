"""The llama-family model: weights and the forward pass (llama, qwen2, qwen3, gemma3).

Owns one forward over a chunk of tokens at an absolute position, written against a
session's KV buffers (the layers' math: layer.py), the decode step of several sessions at
once, and the sessions' spare KV buffers; the weights in the internal layout of config.py;
what differs between architectures is a config field (config.py). A sliding-window layer
keeps a ring of its last W rows (row of position p at slot p % W) instead of the whole
context. The session (session.py) owns state and the payload; weights.py (Hugging Face
directories) and gguf.py (GGUF files) turn files into that layout and are the entry points
`engine/loader.py` calls.
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
from ds4tui.engine.kernels.llama_step import LAYER_KV_ONLY, LAYER_LAST_ROW, make_fast_decoder
from ds4tui.engine.kernels.llama_step import supported as fast_supported
from ds4tui.engine.llama.config import LlamaConfig, expected_shapes
from ds4tui.engine.llama.layer import ChunkPass, LlamaLayer, TorchAttention, attach_blocks, blocks_match_table, make_linear
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
        self.use_blocks = bool(raw) and attach_blocks(self.layers, self.lm_head, raw or {}, cfg.tie_word_embeddings)
        # Attention and the gated activation in C whenever the library is loaded (and attn.c
        # takes the head size).
        self.use_c_kernels = attn_kernel.available() and attn_kernel.supports(cfg.head_dim)
        # A chunk's layers as one C call each (kernels/chunk.c) where that call multiplies by the
        # very blocks the layers' Linear.blocks hold; tests set it False to compare.
        self.use_c_layers = self.fast is not None and blocks_match_table(self.layers, self.fast)
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
                _warm_restore(session, tokens)
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

    @property
    def _c_kernels(self) -> bool:
        """Whether a forward's attention and gated activation run in C (kernels/attn.c,
        glu.c); tied to the C step like the block products, so `model.fast = None` keeps the
        whole forward in torch."""
        return self.use_c_kernels and (self.fast is not None or not fast_supported(self.cfg))

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
        # Multiply by the file's blocks (qgemm.c) where they win; `fast = None` keeps all-torch fp32.
        small = self._block_products() and (s <= _SMALL_ROWS or qgemv.backend() != "scalar")
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
                self.fast.layer(kv[i], i, x, pos, flags, layer.qk_norm, cfg.attn_scale)
            return self._logits(x[-1:]) if want_logits else None
        ropes = {False: (self.cos[pos:end], self.sin[pos:end]),  # [S, D/2]
                 True: (self.local_cos[pos:end], self.local_sin[pos:end])}
        # Attention in C (kernels/attn.c) reads the K/V rows in place, f16 or f32, with the causal
        # and window masks computed on the fly; without the C library, torch's SDPA over additive
        # masks. Both are deterministic for a given chunk, so a replayed chunk matches the live one.
        # The per-row steps (RMSNorm, q/k RoPE, the gated activation) run in C alongside
        # (kernels/rows.c: one pass each instead of several torch ops).
        c_kernels = self._c_kernels
        chunk = ChunkPass(cfg, pos, end, ropes, c_kernels, None if c_kernels else TorchAttention(cfg, pos, s),
                          small, frozen_global)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if before_layer is not None:
                before_layer(i)
            x = layer.run_chunk(x, kv[i], chunk, i == last, want_logits)
            if x is None:  # the last layer's K/V are in and no logits are wanted
                return None
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
        small = b <= _SMALL_ROWS or qgemv.backend() != "scalar"
        at = torch.tensor(positions, dtype=torch.long)
        ropes = {False: (self.cos[at].contiguous(), self.sin[at].contiguous()),  # [B, D/2]
                 True: (self.local_cos[at].contiguous(), self.local_sin[at].contiguous())}
        x = F.embedding(torch.tensor(tokens, dtype=torch.long), self.embed)  # [B, H]
        if cfg.embed_scale != 1.0:
            x = x * torch.tensor(cfg.embed_scale, dtype=torch.float32)
        for i, layer in enumerate(self.layers):
            x = layer.decode_rows(x, [kv[i] for kv in kvs], positions, ropes, cfg, small)
        out = F.rms_norm(x, (cfg.hidden_size,), self.norm, cfg.rms_norm_eps)
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


