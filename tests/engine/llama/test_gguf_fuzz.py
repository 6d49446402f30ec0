"""A fuzz of GGUF files against the llama loader: every damaged file is refused in one line.

1,000 seeded cases, each a small valid file of one architecture (llama, qwen2, qwen3, gemma3)
and RoPE scaling (none, linear, yarn, a rope_freqs tensor) with one to three mutations: a key
removed, a value of another type (including text that is not UTF-8 and arrays of arrays),
numbers at the edges of their type, contradictory keys (heads that do not divide, a context
past the RoPE tables, a scaling kind llama.cpp has no name for), a tensor's shape that
disagrees with the config, a tensor removed or retyped, its data offset past the end, the
file truncated or its header's bytes flipped. `load_llama_gguf` must then either load the file
(and run one decode step) or raise WeightsError with a one-line message: the error the CLI,
the chat and `serve` print as one line. Anything else fails the test, naming the case's seed.

The files are serialized here byte by byte (GGUF v3: header, key/values, tensor infos,
aligned data) so that a mutation can write what gguf.GGUFWriter refuses to.
"""

from __future__ import annotations

import functools
import math
import random
import struct

import numpy as np
import pytest
import torch

from ds4tui.engine.errors import WeightsError
from ds4tui.engine.llama.gguf import load_llama_gguf
from ds4tui.engine.llama.tiny import CHAT_TEMPLATE, SPECIALS

CASES = 1000
SEED = 37

# GGUF value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
         U64: "<Q", I64: "<q", F64: "<d"}
_RANGE = {U8: (0, 255), I8: (-128, 127), U16: (0, 65535), I16: (-32768, 32767), U32: (0, 2**32 - 1),
          I32: (-2**31, 2**31 - 1), U64: (0, 2**64 - 1), I64: (-2**63, 2**63 - 1)}
# ggml tensor types used here (and an id that is none).
T_F32, T_F16, T_Q8_0, T_Q4_K, T_BOGUS = 0, 1, 8, 12, 99
ALIGN = 32

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, CTX = 32, 2, 1, 16, 64, 64
TOKENS = list(SPECIALS) + [chr(c) for c in range(ord("a"), ord("a") + 26)] + ["ab", "cd", "abcd"]  # 32 tokens


def _string(data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: int, value) -> bytes:
    if vtype == STR:
        return _string(value)
    if vtype == ARR:
        sub, items = value
        return struct.pack("<IQ", sub, len(items)) + b"".join(_value(sub, v) for v in items)
    return struct.pack(_PACK[vtype], value)


def serialize(kv: list, tensors: list, *, bogus_offset: str | None = None) -> bytes:
    """kv: [(key, type, value)] (an ARR value is (element type, items)); tensors:
    [(name, ne (ggml order: innermost first), ggml type, data bytes)]."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for key, vtype, value in kv:
        out += _string(key) + struct.pack("<I", vtype) + _value(vtype, value)
    offset, blobs = 0, []
    for name, ne, ttype, data in tensors:
        at = 2**62 if name == bogus_offset else offset
        out += _string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", ttype, at)
        blobs.append(data + b"\0" * (-len(data) % ALIGN))
        offset += len(blobs[-1])
    out += b"\0" * (-len(out) % ALIGN)
    return bytes(out) + b"".join(blobs)


def _f32(rng: np.random.Generator, *ne: int) -> tuple[tuple[int, ...], int, bytes]:
    return ne, T_F32, (rng.standard_normal(tuple(reversed(ne))) * 0.3).astype(np.float32).tobytes()


@functools.lru_cache(maxsize=None)
def _base(arch: str, scaling: str, template: bool) -> tuple[tuple, tuple]:
    kv, tensors = base_file(random.Random(0), arch, scaling, template)
    return tuple(kv), tuple(tensors)


def base_file(rng: random.Random, arch: str, scaling: str, template: bool = False) -> tuple[list, list]:
    """A valid file: 1 layer (gemma3: 2, one sliding), F32 tensors (the FFN's gate in Q8_0);
    without a chat template the built-in ChatML turns stand in (<|im_end|> is in the vocabulary)."""
    nrng = np.random.default_rng(rng.randrange(2**32))
    layers = 2 if arch == "gemma3" else 1
    a = arch + "."
    kv = [("general.architecture", STR, arch), (a + "block_count", U32, layers), (a + "context_length", U32, CTX),
          (a + "embedding_length", U32, HIDDEN), (a + "feed_forward_length", U32, FFN),
          (a + "attention.head_count", U32, HEADS), (a + "attention.head_count_kv", U32, KV_HEADS),
          (a + "attention.key_length", U32, HEAD_DIM), (a + "attention.value_length", U32, HEAD_DIM),
          (a + "rope.freq_base", F32, 10000.0), (a + "attention.layer_norm_rms_epsilon", F32, 1e-6),
          ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "default"),
          ("tokenizer.ggml.tokens", ARR, (STR, TOKENS)),
          ("tokenizer.ggml.token_type", ARR, (I32, [3 if t in SPECIALS else 1 for t in TOKENS])),
          ("tokenizer.ggml.merges", ARR, (STR, ["a b", "c d", "ab cd"])), ("tokenizer.ggml.eos_token_id", U32, 2)]
    if template:
        kv.append(("tokenizer.chat_template", STR, CHAT_TEMPLATE))
    if arch == "gemma3":
        kv += [(a + "attention.sliding_window", U32, 8), (a + "attention.sliding_window_pattern", U32, 2),
               (a + "rope.freq_base_swa", F32, 10000.0)]
    if scaling == "linear":
        kv += [(a + "rope.scaling.type", STR, "linear"), (a + "rope.scaling.factor", F32, 4.0)]
    elif scaling == "yarn":
        kv += [(a + "rope.scaling.type", STR, "yarn"), (a + "rope.scaling.factor", F32, 4.0),
               (a + "rope.scaling.original_context_length", U32, 16),
               (a + "rope.scaling.yarn_beta_fast", F32, 32.0), (a + "rope.scaling.yarn_beta_slow", F32, 1.0)]
    n = len(TOKENS)
    tensors = [("token_embd.weight", *_f32(nrng, HIDDEN, n)), ("output_norm.weight", *_f32(nrng, HIDDEN))]
    if arch != "qwen2":
        tensors.append(("output.weight", *_f32(nrng, HIDDEN, n)))
    if scaling == "rope_freqs":
        tensors.append(("rope_freqs.weight", (HEAD_DIM // 2,), T_F32,
                        np.linspace(1.0, 8.0, HEAD_DIM // 2, dtype=np.float32).tobytes()))
    q, kvw = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(layers):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", *_f32(nrng, HIDDEN)), (b + "attn_q.weight", *_f32(nrng, HIDDEN, q)),
                    (b + "attn_k.weight", *_f32(nrng, HIDDEN, kvw)), (b + "attn_v.weight", *_f32(nrng, HIDDEN, kvw)),
                    (b + "attn_output.weight", *_f32(nrng, q, HIDDEN)), (b + "ffn_norm.weight", *_f32(nrng, HIDDEN)),
                    (b + "ffn_up.weight", *_f32(nrng, HIDDEN, FFN)), (b + "ffn_down.weight", *_f32(nrng, FFN, HIDDEN))]
        gate = (nrng.standard_normal((FFN, HIDDEN)) * 0.3).astype(np.float32)
        tensors.append((b + "ffn_gate.weight", (HIDDEN, FFN), T_Q8_0, _q8_0(gate)))
        if arch == "qwen2":
            tensors += [(b + "attn_q.bias", *_f32(nrng, q)), (b + "attn_k.bias", *_f32(nrng, kvw)),
                        (b + "attn_v.bias", *_f32(nrng, kvw))]
        if arch in ("qwen3", "gemma3"):
            tensors += [(b + "attn_q_norm.weight", *_f32(nrng, HEAD_DIM)), (b + "attn_k_norm.weight", *_f32(nrng, HEAD_DIM))]
        if arch == "gemma3":
            tensors += [(b + "post_attention_norm.weight", *_f32(nrng, HIDDEN)),
                        (b + "post_ffw_norm.weight", *_f32(nrng, HIDDEN))]
    return kv, tensors


def _q8_0(w: np.ndarray) -> bytes:
    import gguf

    return gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0).tobytes()


# ---------------------------------------------------------------- mutations

_NUMBERS = [0, 1, -1, 2, 3, 7, 2**31 - 1, 2**32 - 1, 2**63 - 1, -2**63, 10**6, 2**21 + 1,
            math.nan, math.inf, -math.inf, 1e-40, 1e38, 0.5, -4.0]
_TEXTS = ["", "none", "linear", "yarn", "llama3", "longrope", "dynamic", "YARN", "llama", "gpt2", "qwen2",
          "gemma3", "phi3", "\u00e9\u4e2d", "x" * 300]


def _random_value(rng: random.Random):
    """(type, value) of any kind, including arrays of arrays and text that is not UTF-8."""
    kind = rng.randrange(8)
    if kind == 0:
        vtype = rng.choice(list(_RANGE))
        lo, hi = _RANGE[vtype]
        return vtype, rng.choice([lo, hi, 0, 1, min(hi, 64)])
    if kind == 1:
        return rng.choice([F32, F64]), rng.choice(_NUMBERS[-7:] + [4.0, 10000.0])
    if kind == 2:
        return BOOL, rng.random() < 0.5
    if kind == 3:
        return STR, rng.choice(_TEXTS)
    if kind == 4:
        return STR, bytes(rng.randrange(128, 256) for _ in range(rng.randrange(1, 6)))  # not UTF-8
    if kind == 5:
        return ARR, (I32, [rng.randrange(-3, 50) for _ in range(rng.randrange(0, 40))])
    if kind == 6:
        return ARR, (STR, [rng.choice(_TEXTS) for _ in range(rng.randrange(0, 40))])
    return ARR, (ARR, [(U8, [1, 2]), (U8, [3])])


def _numeric_edge(rng: random.Random, vtype: int):
    if vtype in _RANGE:
        lo, hi = _RANGE[vtype]
        return vtype, max(lo, min(hi, int(rng.choice([n for n in _NUMBERS if isinstance(n, int)]))))
    if vtype in (F32, F64):
        return vtype, rng.choice(_NUMBERS)
    return _random_value(rng)


def _set(kv: list, key: str, vtype: int, value) -> None:
    for i, (k, _, _) in enumerate(kv):
        if k == key:
            kv[i] = (key, vtype, value)
            return
    kv.append((key, vtype, value))


def mutate(rng: random.Random, kv: list, tensors: list, arch: str) -> dict:
    """One mutation in place; returns options for serialize / the bytes (truncate, flip)."""
    a = arch + "."
    kind = rng.randrange(14)
    if kind == 0 and kv:  # a key removed
        kv.pop(rng.randrange(len(kv)))
    elif kind == 1 and kv:  # a value of any other type
        i = rng.randrange(len(kv))
        kv[i] = (kv[i][0], *_random_value(rng))
    elif kind == 2 and kv:  # a number at the edge of its type
        i = rng.randrange(len(kv))
        kv[i] = (kv[i][0], *_numeric_edge(rng, kv[i][1]))
    elif kind == 3:  # RoPE scaling keys, consistent or not
        _set(kv, a + "rope.scaling.type", STR, rng.choice(_TEXTS[:8]))
        for name in ("factor", "original_context_length", "yarn_beta_fast", "yarn_beta_slow", "yarn_attn_factor",
                     "yarn_ext_factor", "attn_factor", "yarn_log_multiplier"):
            if rng.random() < 0.3:
                _set(kv, a + "rope.scaling." + name, *(_numeric_edge(rng, rng.choice([F32, U32]))))
        if rng.random() < 0.2:
            _set(kv, a + "rope.scale_linear", F32, rng.choice([0.0, 2.0, -1.0, math.nan]))
    elif kind == 4:  # contradictory sizes
        key = rng.choice(["attention.head_count", "attention.head_count_kv", "attention.key_length",
                          "attention.value_length", "embedding_length", "feed_forward_length", "block_count",
                          "context_length", "vocab_size", "rope.dimension_count", "attention.sliding_window"])
        _set(kv, a + key, U32, rng.choice([0, 1, 3, 5, 8, 12, 24, 33, 48, 64, 128, 2**21 + 1, 2**31]))
    elif kind == 5:  # a sliding-window pattern of the wrong length or type
        _set(kv, a + "attention.sliding_window_pattern", *rng.choice(
            [(ARR, (BOOL, [True] * rng.randrange(0, 5))), (ARR, (I32, [1, 0])), (U32, rng.randrange(0, 9))]))
    elif kind == 6 and tensors:  # a tensor shape that disagrees with the config
        i = rng.randrange(len(tensors))
        name, ne, _, _ = tensors[i]
        ne = list(ne)
        op = rng.randrange(3)
        if op == 0:
            ne[rng.randrange(len(ne))] += rng.choice([-1, 1, 16])
        elif op == 1:
            ne.append(rng.choice([1, 2]))
        else:
            ne = ne[::-1] if len(ne) > 1 else ne + [2]
        ne = [max(1, n) for n in ne]
        count = int(np.prod(ne))
        tensors[i] = (name, tuple(ne), T_F32, np.zeros(count, dtype=np.float32).tobytes())
    elif kind == 7 and tensors:  # a tensor removed
        tensors.pop(rng.randrange(len(tensors)))
    elif kind == 8 and tensors:  # a tensor retyped, its bytes left as they were
        i = rng.randrange(len(tensors))
        tensors[i] = (tensors[i][0], tensors[i][1], rng.choice([T_F16, T_Q8_0, T_Q4_K, T_BOGUS]), tensors[i][3])
    elif kind == 9 and tensors:
        return {"bogus_offset": rng.choice(tensors)[0]}
    elif kind == 10:
        return {"truncate": rng.random()}
    elif kind == 11:
        return {"flip": rng.randrange(1, 8)}
    elif kind == 12:  # the vocabulary
        key, value = rng.choice([
            ("tokenizer.ggml.tokens", (ARR, (STR, TOKENS[:rng.randrange(0, len(TOKENS))]))),
            ("tokenizer.ggml.tokens", (ARR, (STR, TOKENS + ["extra"] * rng.randrange(1, 5)))),
            ("tokenizer.ggml.token_type", (ARR, (I32, [1] * rng.randrange(0, 40)))),
            ("tokenizer.ggml.merges", (ARR, (STR, ["a b c", "", "zz"]))),
            ("tokenizer.ggml.eos_token_id", (I32, rng.choice([-1, 31, 32, 10**6]))),
            ("tokenizer.ggml.bos_token_id", (U32, rng.choice([0, 32, 2**32 - 1]))),
            ("tokenizer.ggml.model", (STR, rng.choice(["llama", "bert", "gpt2"]))),
            ("tokenizer.ggml.scores", (ARR, (F32, [0.0] * rng.randrange(0, 40)))),
            ("tokenizer.chat_template", (STR, rng.choice(["{% for", "{{ raise_exception('x') }}", "plain text"]))),
        ])
        _set(kv, key, *value)
    elif kind == 13 and kv:  # a key written twice (the second with another value)
        key, _, _ = rng.choice(kv)
        kv.append((key, *_random_value(rng)))
    return {}


def _damage(data: bytes, rng: random.Random, opts: dict) -> bytes:
    if "truncate" in opts:
        return data[:int(len(data) * opts["truncate"])]
    if "flip" in opts:
        out = bytearray(data)
        header = min(len(out), 2048)
        for _ in range(opts["flip"]):
            out[rng.randrange(header)] = rng.randrange(256)
        return bytes(out)
    return data


def _case(seed: int) -> tuple[str, bytes]:
    rng = random.Random(seed)
    arch = rng.choice(["llama", "qwen2", "qwen3", "gemma3"])
    scaling = rng.choice(["none", "linear", "yarn", "rope_freqs"])
    kv, tensors = (list(part) for part in _base(arch, scaling, rng.random() < 0.25))
    opts: dict = {}
    for _ in range(rng.choice([1, 1, 2, 3])):
        opts.update(mutate(rng, kv, tensors, arch))
    data = serialize(kv, tensors, bogus_offset=opts.get("bogus_offset"))
    return f"{arch}/{scaling}", _damage(data, rng, opts)


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


def _load_and_step(path) -> None:
    model = load_llama_gguf(path, "fuzz")
    n = min(16, model.cfg.max_position_embeddings)  # a context as short as the file's
    session = model.new_session(n)
    session.prefill([3, 4, 5][:n - 1] or [3])
    if n > 1:
        session.decode(6)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("scaling", ["none", "linear", "yarn", "rope_freqs"])
def test_the_unmutated_files_load_and_run(data_dir, arch, scaling):
    """The fuzz starts from files that load: a refusal then comes from the mutation."""
    path = data_dir / "base.gguf"
    path.write_bytes(serialize(*base_file(random.Random(0), arch, scaling, template=arch == "gemma3")))
    model = load_llama_gguf(path, "fuzz")
    assert model.cfg.arch == arch and model.cfg.rope_freq_factors == (scaling != "none")
    session = model.new_session(16)
    session.prefill([3, 4, 5])
    assert torch.isfinite(session.decode(6)).all()


@pytest.mark.usefixtures("one_torch_thread")
def test_damaged_metadata_is_refused_in_one_line_never_a_traceback(data_dir):
    outcomes = {"loaded": 0, "refused": 0}
    failures = []
    with torch.inference_mode():
        for seed in range(SEED * CASES, SEED * CASES + CASES):
            what, data = _case(seed)
            path = data_dir / f"case-{seed}.gguf"
            path.write_bytes(data)
            try:
                _load_and_step(path)
                outcomes["loaded"] += 1
            except WeightsError as exc:
                message = str(exc)
                if "\n" in message or not message:
                    failures.append(f"seed {seed} ({what}): a refusal of {message.count(chr(10)) + 1} lines: {message!r}")
                outcomes["refused"] += 1
            except Exception as exc:  # noqa: BLE001 - what the fuzz is for
                failures.append(f"seed {seed} ({what}): {type(exc).__name__}: {exc}"[:300])
            path.unlink()
    assert not failures, f"{len(failures)} of {CASES} cases: " + "\n".join(failures[:20])
    # Both outcomes occur (a fuzz whose every case is refused at the magic tests nothing).
    assert outcomes["refused"] > CASES // 2 and outcomes["loaded"] > CASES // 20, outcomes
