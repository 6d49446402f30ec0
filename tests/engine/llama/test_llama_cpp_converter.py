"""Files made by llama.cpp's own converter and quantizer, run by ds4tui against transformers
and against llama.cpp.

The other tests write their GGUF files themselves with llama.cpp's names, so a misreading of
the converter's metadata shared by writer and reader could not show there. Here tiny seeded
llama, qwen2, qwen3 and gemma3 models with each RoPE scaling (none, linear, yarn; llama3 for
llama) are saved by transformers with a SentencePiece vocabulary, converted by
`convert_hf_to_gguf.py` (F32) and re-typed by `llama-quantize` (F16, BF16, Q8_0, Q4_K_M).
Then, for every file:
- ds4tui's logits within 1e-4 of transformers run on the file's own dequantized weights (the
  exact reference), through the chunk path and decode steps;
- on the float files, ds4tui's 32 greedy tokens equal llama.cpp's on the same token ids (a
  divergence passes only at a near tie of ours, and the comparison stops there), and the two
  next-token distributions are within KL 1e-3 at the first step (5e-3 on BF16, where ggml
  rounds the activations to bf16).

Where llama.cpp is: DS4TUI_LLAMA_CPP_DIR names a llama.cpp source tree (the llama-cpp-python
0.3.36 sdist's `vendor/llama.cpp`: its `convert_hf_to_gguf.py` runs with its own `gguf-py`);
its binaries (`llama-quantize`, `libllama.so`) are taken from DS4TUI_LLAMA_CPP_BIN, else
`$DS4TUI_LLAMA_CPP_DIR/build/bin`. docs/llama-engine.md ("Against llama.cpp's converter")
says how to build them. Without the source tree every test here is skipped with that reason;
without a binary, the tests that need it.
"""

from __future__ import annotations

import functools
import io
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ds4tui.engine.llama.gguf import load_llama_gguf
from ds4tui.engine.llama.session import LlamaSession
from ds4tui.engine.llama.tiny import CHAT_TEMPLATE
from tests.engine.llama.arch_models import VOCAB, WINDOW, hf_model, reference_logits, scaled

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

SRC = Path(os.environ["DS4TUI_LLAMA_CPP_DIR"]) if os.environ.get("DS4TUI_LLAMA_CPP_DIR") else None
if SRC is None or not (SRC / "convert_hf_to_gguf.py").is_file():
    pytest.skip("llama.cpp's converter is not here: set DS4TUI_LLAMA_CPP_DIR to a llama.cpp source tree "
                "(docs/llama-engine.md, 'Against llama.cpp's converter')", allow_module_level=True)
BIN = Path(os.environ.get("DS4TUI_LLAMA_CPP_BIN") or SRC / "build" / "bin")
QUANTIZE = BIN / "llama-quantize"

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CASES = [(arch, kind) for arch in ("llama", "qwen2", "qwen3", "gemma3") for kind in (None, "linear", "yarn")]
CASES.insert(3, ("llama", "llama3"))
IDS = [f"{a}-{k or 'none'}" for a, k in CASES]
FTYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_K_M"]
FLOAT = ("F32", "F16", "BF16")
TOL = 1e-4
GREEDY = 32
# ggml multiplies F16 and BF16 weights by activations rounded to the weights' type, ds4tui by
# fp32 activations: measured first-step KL up to 3e-5 on F32 and F16 files, 1.6e-3 on BF16 (Qwen 2).
KL_BOUND = {"F32": 1e-3, "F16": 1e-3, "BF16": 5e-3}
PROMPT = torch.randint(5, VOCAB, (3 * WINDOW + 5,), generator=torch.Generator().manual_seed(3)).tolist()
SPLIT = 2 * WINDOW + 3


@functools.lru_cache(maxsize=None)
def spm_model() -> bytes:
    """A seeded SentencePiece BPE vocabulary of VOCAB pieces with byte fallback and the ChatML
    markers: what llama.cpp's converter reads for every one of these architectures."""
    import sentencepiece as spm

    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly bakers and "
             "many other small things happen in a tiny test model").split()
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=VOCAB,
                                   model_type="bpe", byte_fallback=True, num_threads=1, hard_vocab_limit=False,
                                   user_defined_symbols=["<|im_start|>", "<|im_end|>"], character_coverage=1.0,
                                   minloglevel=2)
    proto = out.getvalue()
    assert spm.SentencePieceProcessor(model_proto=proto).vocab_size() <= VOCAB  # the converter pads to VOCAB
    return proto


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama-cpp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_DATA_DIR", str(root / "data"))
        yield root


@pytest.fixture(scope="module")
def files(workdir):
    """(arch, kind) -> {"model": transformers model, ftype: GGUF path}, built on first use."""
    cache: dict = {}

    def get(arch: str, kind: str | None) -> dict:
        if (arch, kind) not in cache:
            cache[(arch, kind)] = _convert(workdir / f"{arch}-{kind or 'none'}", hf_model(scaled(arch, kind)))
        return cache[(arch, kind)]

    return get


def _convert(out: Path, model) -> dict:
    hf = out / "hf"
    model.save_pretrained(str(hf), safe_serialization=True)
    (hf / "tokenizer.model").write_bytes(spm_model())
    (hf / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>"}))
    f32 = out / "F32.gguf"
    env = dict(os.environ, PYTHONPATH=str(SRC / "gguf-py"))  # the converter's own gguf-py
    run = subprocess.run([sys.executable, str(SRC / "convert_hf_to_gguf.py"), str(hf), "--outfile", str(f32),
                          "--outtype", "f32"], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"convert_hf_to_gguf.py failed: {run.stderr[-2000:]}"
    return {"model": model, "F32": f32, "dir": out}


def _file(entry: dict, ftype: str) -> Path:
    if ftype not in entry:
        if not QUANTIZE.is_file():
            pytest.skip(f"no llama-quantize at {QUANTIZE} (DS4TUI_LLAMA_CPP_BIN)")
        path = entry["dir"] / f"{ftype}.gguf"
        run = subprocess.run([str(QUANTIZE), str(entry["F32"]), str(path), ftype, "1"], capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, f"llama-quantize {ftype} failed: {run.stderr[-2000:]}"
        entry[ftype] = path
    return entry[ftype]


def dequantized_state(path: Path, model) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict a GGUF holds, dequantized by gguf and mapped back by hand
    (llama's q/k rows un-interleaved, Gemma's 1 + w norms less 1): transformers on it is the
    exact reference for that file."""
    import gguf

    cfg = model.config
    kind = cfg.model_type.split("_")[0]
    shift = 1.0 if kind == "gemma3" else 0.0
    by_name = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}

    def get(name: str) -> np.ndarray:
        t = by_name[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
            tuple(int(n) for n in reversed(t.shape)))

    def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
        if kind != "llama":
            return w
        rows = w.shape[0]  # llama_cpp_permute's inverse: [heads, D/2, 2, ...] -> [heads, 2, D/2, ...]
        return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    norms = {"attn_norm": "input_layernorm", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
    if kind == "gemma3":
        norms.update({"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm"})
    else:
        norms["ffn_norm"] = "post_attention_layernorm"
    out = {"model.embed_tokens.weight": get("token_embd.weight"), "model.norm.weight": get("output_norm.weight") - shift}
    if "output.weight" in by_name:
        out["lm_head.weight"] = get("output.weight")
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    for i in range(cfg.num_hidden_layers):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = unpermute(get(b + "attn_q.weight"), heads)
        out[p + "self_attn.k_proj.weight"] = unpermute(get(b + "attn_k.weight"), kv)
        out[p + "self_attn.v_proj.weight"] = get(b + "attn_v.weight")
        out[p + "self_attn.o_proj.weight"] = get(b + "attn_output.weight")
        for x in "qkv":
            if b + f"attn_{x}.bias" in by_name:
                bias = get(b + f"attn_{x}.bias")
                out[p + f"self_attn.{x}_proj.bias"] = unpermute(bias[:, None], heads if x == "q" else kv)[:, 0] \
                    if x != "v" else bias
        for theirs, ours in norms.items():
            if b + theirs + ".weight" in by_name:
                out[p + ours + ".weight"] = get(b + theirs + ".weight") - shift
        for x in ("gate", "up", "down"):
            out[p + f"mlp.{x}_proj.weight"] = get(b + f"ffn_{x}.weight")
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, copy=True)) for k, v in out.items()}


def _reference(model, path: Path):
    import copy

    ref = copy.deepcopy(model)
    state = dequantized_state(path, model)
    missing = set(dict(ref.named_parameters())) - set(state) - {"lm_head.weight"}
    assert not missing, f"the file lacks {sorted(missing)}"
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name in state:
                p.copy_(state[name])
    return ref


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = float((got - want).abs().max())
    assert err <= TOL * max(1.0, float(want.abs().max())), f"{what}: max |dlogit| {err:.3g}"


@pytest.mark.parametrize("ftype", FTYPES)
@pytest.mark.parametrize(("arch", "kind"), CASES, ids=IDS)
def test_converted_files_match_transformers_on_their_weights(files, arch, kind, ftype):
    entry = files(arch, kind)
    path = _file(entry, ftype)
    if ftype == "F32":  # the hand mapping is the converter's inverse: F32 gives the model back
        for name, t in dequantized_state(path, entry["model"]).items():
            assert torch.equal(t, entry["model"].state_dict()[name].float()) or name.endswith("norm.weight"), name
    ours = load_llama_gguf(path, f"{arch}-{kind}-{ftype}")
    if kind is not None:
        assert "RoPE" in ours.describe()
    ref = reference_logits(_reference(entry["model"], path), PROMPT)
    s = LlamaSession(ours, 256, 7, kv_dtype="f32")
    s.prefill(PROMPT[:SPLIT])
    _close(s.logits, ref[SPLIT - 1], "prefill")
    for pos in range(SPLIT, len(PROMPT)):
        _close(s.decode(PROMPT[pos]), ref[pos], f"decode at {pos}")


@functools.lru_cache(maxsize=None)
def greedy_harness(build_dir: str) -> Path:
    """llama_cpp_greedy.c compiled against the tree's llama.h and the built libllama."""
    cc = shutil.which("cc") or shutil.which("gcc")
    lib = next((p for p in (BIN / "libllama.so", BIN.parent / "lib" / "libllama.so") if p.is_file()), None)
    if cc is None or lib is None:
        pytest.skip(f"no C compiler or no libllama.so in {BIN} (DS4TUI_LLAMA_CPP_BIN)")
    exe = Path(build_dir) / "llama_cpp_greedy"
    run = subprocess.run([cc, "-O1", "-o", str(exe), str(Path(__file__).with_name("llama_cpp_greedy.c")),
                          f"-I{SRC / 'include'}", f"-I{SRC / 'ggml' / 'include'}", f"-L{lib.parent}", "-lllama",
                          f"-Wl,-rpath,{lib.parent}"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"the harness does not build against {SRC}: {run.stderr[-2000:]}"
    return exe


def llama_cpp_greedy(exe: Path, path: Path, ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    run = subprocess.run([str(exe), str(path), str(n), *map(str, ids)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"llama.cpp failed on {path.name}: {run.stderr[-2000:]}"
    rows = [line.split() for line in run.stdout.splitlines()]
    return [int(r[0]) for r in rows], torch.tensor([[float(v) for v in r[1:]] for r in rows])


@pytest.mark.parametrize("ftype", FLOAT)
@pytest.mark.parametrize(("arch", "kind"), CASES, ids=IDS)
def test_greedy_tokens_match_llama_cpp_on_float_files(files, workdir, arch, kind, ftype):
    exe = greedy_harness(str(workdir))
    entry = files(arch, kind)
    path = _file(entry, ftype)
    prompt = PROMPT[:SPLIT]
    theirs, their_logits = llama_cpp_greedy(exe, path, prompt, GREEDY)
    ours = load_llama_gguf(path, f"{arch}-{kind}-{ftype}")
    s = ours.new_session(256, kv_dtype="f32")
    s.prefill(prompt)
    logits = s.logits
    kl = float(torch.nn.functional.kl_div(their_logits[0].log_softmax(-1), logits.log_softmax(-1),
                                          log_target=True, reduction="sum"))
    assert kl < KL_BOUND[ftype], f"first step: KL(ours || llama.cpp) {kl:.3g}"
    same = 0
    for step, token in enumerate(theirs):
        mine = int(logits.argmax())
        if mine != token:
            gap = float(logits[mine] - logits[token])
            assert gap <= 1e-3 * float(logits.abs().max()), \
                f"step {step}: ours {mine}, llama.cpp {token}, {gap:.3g} apart in our logits (no tie)"
            break  # a near tie: past it the two continue from different tokens
        same += 1
        if step + 1 < len(theirs):
            logits = s.decode(token)
    print(f"{arch}-{kind}-{ftype}: {same}/{GREEDY} greedy tokens equal, first-step KL {kl:.2e}")
