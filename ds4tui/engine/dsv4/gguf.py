"""ds4's DeepSeek V4 GGUF -> Dsv4Model, memory-mapped, every matrix left in the file's blocks.

Owns reading a `general.architecture = "deepseek4"` GGUF in ds4's layout (gguf_layout.py):
the config from the `deepseek4.*` keys, the values ds4 fixes checked, every tensor's name,
type and shape validated (one WeightsError line naming the first problem: anything ds4
would refuse, this refuses too), and the weights bound without copying: matrices become
`QuantMatrix` views of the file mapping (F16, Q8_0), each layer's routed experts an
`ExpertBank` (IQ2_XXS, Q2_K or Q4_K rows, one expert's rows read only when it is selected),
vectors float32 views; only small tensors are converted (the compressors' position biases
and tid2eid, to float32 / int64). The tokenizer is the file's (`tokenizer.ggml.*`, byte-level
BPE with the joyai-llm split of DeepSeek V3/V4), the chat format DeepSeek V4's turns
(text/dsv4_chat.py, ds4's layout; the file's own template is not run: ds4 does not run it
either). The fingerprint hashes the file's tensor directory and a sample of each tensor's
bytes (hashing 80 GB at every start is not an option).
Leaves to linear.py the products, to net.py the math.
"""

from __future__ import annotations

import hashlib
import struct
import warnings
from pathlib import Path

import numpy as np
import torch

from ds4tui.engine.dsv4 import gguf_layout as L
from ds4tui.engine.dsv4 import paging
from ds4tui.engine.dsv4.attention import AttnWeights, IndexerWeights
from ds4tui.engine.dsv4.compressor import CompressorWeights
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.dsv4.hc import HcHeadWeights, HcWeights
from ds4tui.engine.dsv4.linear import ExpertBank
from ds4tui.engine.dsv4.moe import MoeWeights
from ds4tui.engine.dsv4.weights import Dsv4Weights, LayerWeights, expected_shapes
from ds4tui.engine.errors import WeightsError
from ds4tui.engine.kernels import qgemv
from ds4tui.engine.kernels.qdot import Q8Matrix
from ds4tui.engine.kernels.qgemv import QuantMatrix

GGUF_MAGIC = 0x46554747  # "GGUF"
# The tokens ds4's vocab_load requires (its chat prompt and DSML tool calls are built from them).
REQUIRED_TOKENS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                   "<think>", "</think>", "｜DSML｜")
_EXPERT_BITS = {"IQ2_XXS": 2, "Q2_K": 2, "Q4_K": 4}


def gguf_architecture(path: Path) -> str | None:
    """`general.architecture` of a GGUF from its first metadata entries (no tokenizer parse);
    None when the file is not a GGUF or the key is not among the first 16."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return None
    if len(head) < 24 or struct.unpack_from("<I", head, 0)[0] != GGUF_MAGIC:
        return None
    n_kv = struct.unpack_from("<Q", head, 16)[0]
    pos = 24
    try:
        for _ in range(min(n_kv, 16)):
            klen = struct.unpack_from("<Q", head, pos)[0]
            key = head[pos + 8:pos + 8 + klen].decode("utf-8", "replace")
            pos += 8 + klen
            vtype = struct.unpack_from("<I", head, pos)[0]
            pos += 4
            if vtype != 8:  # not a string: the key is always one, others we cannot skip cheaply
                return None
            vlen = struct.unpack_from("<Q", head, pos)[0]
            value = head[pos + 8:pos + 8 + vlen].decode("utf-8", "replace")
            pos += 8 + vlen
            if key == "general.architecture":
                return value
    except struct.error:
        return None
    return None


def _reader(path: Path):
    import gguf

    try:
        # copy-on-write mapping: numpy gives writable views (no torch warning) and nothing is
        # ever written, so every page stays the page cache's
        return gguf.GGUFReader(str(path), "c")
    except Exception as exc:  # the gguf package raises ValueError/struct errors on bad files
        raise WeightsError(f"{path.name}: not a readable GGUF ({exc})") from None


def _field(reader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def config_from_metadata(reader, source: str, **overrides) -> Dsv4Config:
    """Dsv4Config from the `deepseek4.*` keys; WeightsError for a missing key or a value ds4 fixes."""
    kw: dict = {}
    got: dict[str, object] = {}
    for key, kind, name in L.METADATA:
        value = _field(reader, L.P + key)
        if value is None:
            raise WeightsError(f"{source}: required metadata key {L.P + key} is missing")
        try:
            if kind in ("u32", "u64"):
                value = int(value)
            elif kind == "f32":
                value = float(value)
            elif kind == "bool":
                value = bool(value)
            elif kind == "u32[]":
                value = [int(v) for v in value]
            elif kind == "f32[]":
                value = [float(v) for v in value]
        except (TypeError, ValueError):
            raise WeightsError(f"{source}: metadata key {L.P + key} has a {type(value).__name__}, expected {kind}") from None
        got[key] = value
        if name is not None:
            kw[name] = value
    n = kw["num_hidden_layers"]
    for key in ("attention.compress_ratios", "swiglu_clamp_exp"):
        if len(got[key]) < n:
            raise WeightsError(f"{source}: {L.P + key} has {len(got[key])} entries for {n} layers")
    limits = set(got["swiglu_clamp_exp"][:n])
    if len(limits) != 1:
        raise WeightsError(f"{source}: per-layer SwiGLU clamps {sorted(limits)} (one value for all layers is supported)")
    kw["swiglu_limit"] = limits.pop()
    kw["compress_ratios"] = got["attention.compress_ratios"][:n]
    fixed = [("attention.head_count_kv", got["attention.head_count_kv"], 1),
             ("attention.value_length", got["attention.value_length"], kw["head_dim"]),
             ("expert_weights_norm", got["expert_weights_norm"], True)]
    for key in L.OPTIONAL_ZERO:
        value = _field(reader, L.P + key)
        if value is not None:
            fixed.append((key, int(value), 0))
    for key, value, want in fixed:
        if value != want:
            raise WeightsError(f"{source}: {L.P + key} is {value!r}; ds4's layout has {want!r}")
    bos, eos = _field(reader, "tokenizer.ggml.bos_token_id"), _field(reader, "tokenizer.ggml.eos_token_id")
    kw["bos_token_id"] = None if bos is None else int(bos)
    kw["eos_token_id"] = None if eos is None else int(eos)
    kw.update(overrides)
    try:
        return Dsv4Config(**kw)
    except TypeError as exc:
        raise WeightsError(f"{source}: config: {exc}") from None


def _expected(cfg: Dsv4Config) -> dict[str, tuple[tuple[int, ...], str | None]]:
    """GGUF name -> (PyTorch-order shape, canonical name or None for an expert tensor);
    optional tensors (the gate bias of hash layers) are left out."""
    shapes, optional = expected_shapes(cfg)
    out: dict[str, tuple[tuple[int, ...], str | None]] = {}
    e_n = cfg.n_routed_experts
    for canon, shape in shapes.items():
        if canon in optional or canon.endswith("ffn.gate.bias"):  # ds4: optional on every layer
            continue
        g = L.gguf_name(canon)
        if g is None:
            raise AssertionError(f"no GGUF name for {canon}")
        if ".ffn.experts." in canon:
            out[g] = ((e_n, *shape), None)
        else:
            out[g] = (shape, canon)
    return out


def _check_tensors(reader, cfg: Dsv4Config, source: str) -> dict:
    by_name = {t.name: t for t in reader.tensors if not t.name.startswith("mtp.")}
    want = _expected(cfg)
    missing = [g for g in want if g not in by_name]
    if missing:
        raise WeightsError(f"{source}: required tensor {missing[0]} is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    allowed_extra = {f"blk.{i}.exp_probs_b.bias" for i in range(cfg.num_hidden_layers)}
    extra = sorted(g for g in by_name if g not in want and g not in allowed_extra)
    if extra:
        raise WeightsError(f"{source}: unexpected tensor {extra[0]} (not in ds4's DeepSeek V4 layout)")
    for g, t in by_name.items():
        kind = t.tensor_type.name
        if kind not in L.tensor_types(g):
            raise WeightsError(f"{source}: tensor {g} has type {kind}; ds4's layout has {' or '.join(L.tensor_types(g))} there")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        expect = want[g][0] if g in want else (cfg.n_routed_experts,)
        if shape != expect:
            raise WeightsError(f"{source}: tensor {g} has shape {list(shape)}, expected {list(expect)}")
    for li in range(cfg.num_hidden_layers):
        g1, g3 = by_name[f"blk.{li}.{L.EXPERTS['w1']}"], by_name[f"blk.{li}.{L.EXPERTS['w3']}"]
        if g1.tensor_type != g3.tensor_type:
            raise WeightsError(f"{source}: layer {li}'s routed gate and up experts have types {g1.tensor_type.name} "
                               f"and {g3.tensor_type.name} (ds4 needs one)")
    return by_name


def _bytes2d(t) -> torch.Tensor:
    """A tensor's data as uint8 rows [rows, row_bytes] (a view of the mapping)."""
    data = np.asarray(t.data)
    rows = int(np.prod(data.shape[:-1])) if data.ndim > 1 else 1
    return torch.from_numpy(data.reshape(rows, -1).view(np.uint8))


def _matrix(t, act_q8: bool = False) -> QuantMatrix:
    """F16 stays fp32-activation; Q8_0 becomes a Q8Matrix in ds4's mode (act_q8)."""
    kind = t.tensor_type.name.lower()
    cols = int(t.shape[0])
    m = QuantMatrix(_bytes2d(t), kind, cols)
    return Q8Matrix.of(m) if act_q8 and kind == "q8_0" else m


def _vector(t) -> torch.Tensor:
    return torch.from_numpy(np.asarray(t.data).reshape(-1))


def _small_f32(t, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(np.asarray(t.data, dtype=np.float32).reshape(shape).copy())


def _tid2eid(t, cfg: Dsv4Config, source: str) -> torch.Tensor:
    ids = torch.from_numpy(np.asarray(t.data).astype(np.int64).reshape(cfg.vocab_size, cfg.num_experts_per_tok))
    if bool((ids < 0).any()) or bool((ids >= cfg.n_routed_experts).any()):
        raise WeightsError(f"{source}: tensor {t.name}: expert ids outside 0..{cfg.n_routed_experts - 1}")
    return ids


def bind_weights(cfg: Dsv4Config, by_name: dict, source: str) -> Dsv4Weights:
    """The net's weights over the file mapping (validated by _check_tensors first)."""

    def mat(t) -> QuantMatrix:
        return _matrix(t, cfg.act_q8)

    def blk(li: int, suffix: str):
        return by_name[f"blk.{li}.{suffix}"]

    def comp(li: int, prefix: str, dim: int) -> CompressorWeights:
        r, coff = cfg.ratio(li), cfg.coff(li)
        return CompressorWeights(mat(blk(li, prefix + "kv.weight")), mat(blk(li, prefix + "gate.weight")),
                                 _small_f32(blk(li, prefix + "ape.weight"), (r, coff * dim)),
                                 _vector(blk(li, prefix + "norm.weight")))

    layers = []
    f_n, e_n, dm = cfg.moe_intermediate_size, cfg.n_routed_experts, cfg.hidden_size
    for li in range(cfg.num_hidden_layers):
        hcw = {k: HcWeights(mat(blk(li, f"hc_{k}_fn.weight")), _vector(blk(li, f"hc_{k}_base.weight")),
                            _vector(blk(li, f"hc_{k}_scale.weight"))) for k in ("attn", "ffn")}
        indexer = None
        if cfg.has_indexer(li):
            indexer = IndexerWeights(mat(blk(li, "indexer.attn_q_b.weight")), mat(blk(li, "indexer.proj.weight")),
                                     comp(li, "indexer_compressor_", cfg.index_head_dim))
        attn = AttnWeights(
            mat(blk(li, "attn_q_a.weight")), _vector(blk(li, "attn_q_a_norm.weight")),
            mat(blk(li, "attn_q_b.weight")), mat(blk(li, "attn_kv.weight")),
            _vector(blk(li, "attn_kv_a_norm.weight")), _vector(blk(li, "attn_sinks.weight")),
            mat(blk(li, "attn_output_a.weight")), mat(blk(li, "attn_output_b.weight")),
            comp(li, "attn_compressor_", cfg.head_dim) if cfg.ratio(li) else None, indexer,
        )
        banks = {}
        for w, suffix in L.EXPERTS.items():
            t = blk(li, suffix)
            rows, cols = (dm, f_n) if w == "w2" else (f_n, dm)
            banks[w] = ExpertBank(t.tensor_type.name.lower(), _bytes2d(t), e_n, rows, cols, act_q8=cfg.act_q8)
        hashed = cfg.hash_layers[li]
        bias = by_name.get(f"blk.{li}.exp_probs_b.bias")  # absent: top-k of the plain scores, as ds4
        shared = None
        if cfg.n_shared_experts:
            shared = tuple(mat(blk(li, f"ffn_{k}_shexp.weight")) for k in ("gate", "up", "down"))
        moe = MoeWeights(mat(blk(li, "ffn_gate_inp.weight")), None if hashed or bias is None else _vector(bias),
                         _tid2eid(blk(li, "ffn_gate_tid2eid.weight"), cfg, source) if hashed else None,
                         banks["w1"], banks["w3"], banks["w2"], shared)
        layers.append(LayerWeights(_vector(blk(li, "attn_norm.weight")), _vector(blk(li, "ffn_norm.weight")),
                                   hcw["attn"], hcw["ffn"], attn, moe))
    embed = torch.from_numpy(np.asarray(by_name["token_embd.weight"].data).reshape(cfg.vocab_size, dm))  # f16 rows
    hc_head = HcHeadWeights(mat(by_name["output_hc_fn.weight"]), _vector(by_name["output_hc_base.weight"]),
                            _vector(by_name["output_hc_scale.weight"]))
    return Dsv4Weights(embed, mat(by_name["output.weight"]), _vector(by_name["output_norm.weight"]), hc_head, layers)


def file_digest(by_name: dict) -> bytes:
    """Identity of the weights: every tensor's name, type and shape, and 4096 bytes from it
    (evenly spaced 64-byte runs)."""
    h = hashlib.sha256()
    for name in sorted(by_name):
        t = by_name[name]
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)
        h.update(f"{name}:{t.tensor_type.name}:{t.shape.tolist()};".encode())
        step = max(64, raw.size // 64)
        h.update(b"".join(raw[i:i + 64].tobytes() for i in range(0, raw.size, step))[:4096])
    return h.digest()


def gguf_tokenizer(reader, cfg: Dsv4Config, source: str):
    from ds4tui.engine.text.gguf_vocab import build_gguf_tokenizer
    from ds4tui.engine.text.hf_tokenizer import HFTokenizer

    tokens = _field(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise WeightsError(f"{source}: no tokenizer.ggml.tokens")
    kind = str(_field(reader, "tokenizer.ggml.model") or "gpt2")
    if kind != "gpt2":
        raise WeightsError(f"{source}: tokenizer model {kind!r} (ds4's files hold a byte-level BPE, gpt2)")
    if len(tokens) > cfg.vocab_size:
        raise WeightsError(f"{source}: {len(tokens)} tokens, more than the model's vocab_size {cfg.vocab_size}")
    known = set(tokens)
    for t in REQUIRED_TOKENS:
        if t not in known:
            raise WeightsError(f"{source}: required tokenizer token {t} is missing")
    tok = build_gguf_tokenizer(kind, tokens, _field(reader, "tokenizer.ggml.token_type") or [],
                               merges=_field(reader, "tokenizer.ggml.merges") or [],
                               pre=_field(reader, "tokenizer.ggml.pre"), source=source)
    return HFTokenizer(tok, eos_ids=cfg.eos_ids)


def load_dsv4_gguf(path: str | Path, name: str, **config_overrides):
    """A ds4 DeepSeek V4 GGUF as a Dsv4Model (nothing dequantized, the file mapped)."""
    from ds4tui.engine.dsv4.model import Dsv4Model
    from ds4tui.engine.text.dsv4_chat import Dsv4ChatTemplate

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such GGUF file")
    source = path.name
    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    if arch != L.ARCH:
        raise WeightsError(f"{source}: general.architecture is {arch!r}, not ds4's {L.ARCH!r} (DeepSeek V4)")
    # ds4's arithmetic (8-bit activations for the Q8_0 and expert products) where the C
    # kernels are; act_q8=False keeps fp32 activations
    config_overrides.setdefault("act_q8", qgemv.library() is not None)
    cfg = config_from_metadata(reader, source, **config_overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # numpy views of a read-only-in-spirit mapping
        by_name = _check_tensors(reader, cfg, source)
        weights = bind_weights(cfg, by_name, source)
        digest = file_digest(by_name)
    tokenizer = gguf_tokenizer(reader, cfg, source)
    bits = _EXPERT_BITS[by_name[f"blk.0.{L.EXPERTS['w1']}"].tensor_type.name]
    model = Dsv4Model.from_weights(name, cfg, weights, digest, tokenizer, Dsv4ChatTemplate(), bits,
                                   ds4_file=True)
    from ds4tui.engine.kernels.quants import quant_mix

    # the matrices the kernels read (not tid2eid, the f16 embedding rows or the position biases)
    model.quant_mix = quant_mix((t.tensor_type.name, int(t.shape[0])) for g, t in by_name.items()
                                if len(t.shape) >= 2 and t.tensor_type.name != "I32"
                                and g != "token_embd.weight" and not g.endswith("_ape.weight"))
    # its products run on the C kernels' GEMV and block GEMM (what `bench engine` reports), over
    # the file's blocks; there is no fused decode step for this architecture
    model.use_blocks = qgemv.library() is not None
    model.source_file = str(path)
    model.reader = reader  # keeps the mapping open as long as the model lives
    try:
        budget = paging.budget_from_env()
        if budget is not None:
            model.net.observers.append(paging.ExpertPager(model, budget))
    except ValueError as exc:
        raise WeightsError(f"{source}: {exc}") from None
    return model
