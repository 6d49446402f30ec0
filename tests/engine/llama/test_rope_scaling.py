"""RoPE scaling (none, linear, yarn, llama3) against transformers, the exact reference.

Tiny seeded models of every architecture with each rope_scaling, saved as HF directories and
written as GGUF files with the keys llama.cpp's converter writes for it (conversion/base.py:
rope.scaling.type/factor/original_context_length and the yarn_* keys; llama3 as a rope_freqs
tensor). Each is run through the torch forward, the C chunk layers and the C decode step,
which all read the same cos/sin tables. Then the rules of reading the keys as llama.cpp does,
and the refusals of what is not supported: one line naming the key and its value.
"""

from __future__ import annotations

import math

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ds4tui.cli import main
from ds4tui.engine.errors import WeightsError
from ds4tui.engine.llama import rope
from ds4tui.engine.llama.config import parse_hf_config
from ds4tui.engine.llama.gguf import load_llama_gguf
from ds4tui.engine.llama.session import LlamaSession
from ds4tui.engine.llama.weights import load_llama_hf
from tests.engine.llama.arch_models import (
    VOCAB,
    WINDOW,
    hf_model,
    quantized_copy,
    reference_logits,
    save_hf_dir,
    scaled,
    write_gguf,
)

pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-4  # as test_architectures.py: max |dlogit| over the largest |logit|
PROMPT = torch.randint(3, VOCAB, (3 * WINDOW + 5,), generator=torch.Generator().manual_seed(2)).tolist()
SPLIT = 2 * WINDOW + 3  # chunks of 7 up to here, single decode steps after
# Gemma 3 has two RoPE bases: the scaling is the global layers' only (1 of its 7 layers).
CASES = [("llama", None), ("llama", "linear"), ("llama", "yarn"), ("llama", "yarn-betas"), ("llama", "llama3"),
         ("qwen2", "linear"), ("qwen2", "yarn"), ("qwen3", "linear"), ("qwen3", "yarn-betas"),
         ("gemma3", "linear"), ("gemma3", "yarn"), ("gemma3", "yarn-betas")]
IDS = [f"{a}-{k or 'none'}" for a, k in CASES]


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = float((got - want).abs().max())
    assert err <= TOL * max(1.0, float(want.abs().max())), f"{what}: max |dlogit| {err:.3g}"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("rope")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_DATA_DIR", str(path / "data"))
        yield path


@pytest.fixture(scope="module")
def models(root):
    """{case: transformers model} (built on first use)."""
    return {}


def _model(models, arch, kind):
    key = (arch, kind)
    if key not in models:
        models[key] = hf_model(scaled(arch, kind))
    return models[key]


def _run(model, what: str, ref: torch.Tensor) -> None:
    """Chunks of 7 (the chunk path: C layers where the model has blocks), then decode steps
    (the fused C step where the library is built), each position against transformers."""
    s = LlamaSession(model, 256, 7, kv_dtype="f32")
    s.prefill(PROMPT[:SPLIT])
    _close(s.logits, ref[SPLIT - 1], f"{what} prefill")
    for pos in range(SPLIT, len(PROMPT)):
        _close(s.decode(PROMPT[pos]), ref[pos], f"{what} decode at {pos}")


@pytest.mark.parametrize(("arch", "kind"), CASES, ids=IDS)
def test_gguf_as_the_converter_writes_it_matches_transformers(root, models, arch, kind):
    ref_model = _model(models, arch, kind)
    name = scaled(arch, kind)
    ours = load_llama_gguf(write_gguf(ref_model, name, root / f"{name.replace('/', '-')}-F32.gguf"), name)
    ref = reference_logits(ref_model, PROMPT)
    if kind is None:
        assert not ours.cfg.rope_freq_factors and "RoPE" not in ours.describe()
    else:  # a Llama 3 GGUF names no kind: its rope_freqs tensor holds the divisors
        words = "RoPE scaled by rope_freqs (Llama 3)" if kind == "llama3" else f"RoPE {kind.split('-')[0]} x"
        assert words in ours.describe()
        assert ours.cfg.rope_freq_factors
    _run(ours, "fused paths", ref)
    ours.fast = None  # the torch forward alone, one position at a time too
    _run(ours, "torch", ref)


@pytest.mark.parametrize(("arch", "kind"), [c for c in CASES if c[1]], ids=[i for i, c in zip(IDS, CASES) if c[1]])
def test_quantized_gguf_through_the_c_layers_matches_transformers_on_its_weights(root, models, arch, kind):
    """Q8_0: every product on the file's blocks, a chunk's layers each one C call (chunk.c)."""
    ref_model = _model(models, arch, kind)
    name = scaled(arch, kind)
    ours = load_llama_gguf(write_gguf(ref_model, name, root / f"{name.replace('/', '-')}-Q8_0.gguf", Q.Q8_0), name)
    if ours.fast is not None:
        assert ours.use_c_layers
    _run(ours, "Q8_0", reference_logits(quantized_copy(ref_model, Q.Q8_0), PROMPT))


@pytest.mark.parametrize(("arch", "kind"), [c for c in CASES if c[1]], ids=[i for i, c in zip(IDS, CASES) if c[1]])
def test_hf_directory_matches_transformers(root, models, arch, kind):
    ref_model = _model(models, arch, kind)
    name = scaled(arch, kind)
    ours = load_llama_hf(save_hf_dir(ref_model, root / f"hf-{name.replace('/', '-')}"), name)
    s = ours.new_session(256, kv_dtype="f32")
    s.prefill(PROMPT)
    _close(s.logits, reference_logits(ref_model, PROMPT)[-1], "HF directory")


def test_models_info_on_a_linear_gemma3_file_prints_its_scaling(root, models, capsys):
    """The file of the report (a gemma3 converted with rope_type linear): it crashed with a
    traceback ending in KeyError: 'rope_freqs'."""
    name = scaled("gemma3", "linear")
    path = write_gguf(_model(models, "gemma3", "linear"), name, root / "info-gemma3-linear.gguf")
    assert main(["models", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gemma3, 7 layers, hidden 64, RoPE linear x4" in out


# ---------------------------------------------------------------- the divisors themselves


def _hf_inv_freq(arch: str, rope_scaling: dict, layer_type: str | None = None):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    import transformers as tr

    name = scaled(arch, None)
    from tests.engine.llama.arch_models import CONFIGS

    cls = {"llama": tr.LlamaConfig, "qwen3": tr.Qwen3Config}[arch]
    cfg = cls(**dict(CONFIGS[name], rope_scaling=rope_scaling))
    return ROPE_INIT_FUNCTIONS[rope_scaling["rope_type"]](cfg, None), cfg


@pytest.mark.parametrize("params", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256, "beta_fast": 8.0, "beta_slow": 0.5},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "truncate": False},
    {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048, "attention_factor": 0.9},
    {"rope_type": "linear", "factor": 2.5},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
], ids=["yarn", "yarn-betas", "yarn-untruncated", "yarn-mscales", "yarn-attention", "linear", "llama3"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_config_json_scaling_is_transformers_frequencies_and_attention_factor(arch, params):
    (inv_freq, attention), cfg = _hf_inv_freq(arch, params)
    ours, scaling = parse_hf_config(cfg.to_dict())
    d, theta = ours.head_dim, ours.rope_theta
    base = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    got = base / torch.tensor(scaling.divisors, dtype=torch.float32)
    assert torch.allclose(got, inv_freq.float(), rtol=1e-6, atol=0), (got, inv_freq)
    assert math.isclose(scaling.attn_factor, attention, rel_tol=1e-6)
    assert ours.rope_attn_factor == scaling.attn_factor


def test_yarn_ramp_is_ggmls_correction_dims():
    """The ramp's ends are ggml_rope_yarn_corr_dims (floor / ceil of the dimension at which a
    frequency turns beta times over the original context), here by hand for one case."""
    d, theta, orig = 64, 10000.0, 4096
    def corr(beta):
        return d * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(theta))
    low, high = math.floor(corr(32)), math.ceil(corr(1))
    div = rope.yarn_divisors(d, theta, 8.0, orig)
    assert all(v == 1.0 for v in div[:low + 1])  # extrapolated: kept
    assert all(v == 8.0 for v in div[high:])  # interpolated: divided by the factor
    assert all(1.0 < v < 8.0 for v in div[low + 1:high])
    assert rope.yarn_mscale(8.0) == pytest.approx(0.1 * math.log(8.0) + 1)


# ---------------------------------------------------------------- GGUF keys as llama.cpp reads them


def _scaling(meta: dict, head_dim: int = 64, theta: float = 10000.0, ctx: int = 4096):
    from ds4tui.engine.llama.gguf_meta import GgufMeta

    m = GgufMeta({f"llama.{k}": v for k, v in meta.items()}, "m.gguf")
    return rope.gguf_rope_scaling(m.number, m.text, m.integer, "llama.", head_dim, theta, ctx, "m.gguf")


def test_gguf_keys_follow_llama_cpps_defaults():
    assert _scaling({}) is None
    # No type: llama.cpp's default is linear, with the factor (new or old key) or 1.
    assert _scaling({"rope.scaling.factor": 2.0}).divisors == (2.0,) * 32
    assert _scaling({"rope.scale_linear": 3.0}).divisors == (3.0,) * 32
    assert _scaling({"rope.scaling.type": "linear", "rope.scaling.factor": 0.0}) is None  # 0 means 1
    assert _scaling({"rope.scaling.type": "none", "rope.scaling.factor": 4.0}) is None  # none never scales
    # yarn without an original context: the training context.
    y = _scaling({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}, ctx=8192)
    assert y.original_context == 8192 and y.divisors == tuple(rope.yarn_divisors(64, 10000.0, 4.0, 8192))
    assert y.attn_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    y = _scaling({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 2048,
                  "rope.scaling.yarn_beta_fast": 16.0, "rope.scaling.yarn_beta_slow": 2.0,
                  "rope.scaling.yarn_attn_factor": 1.5})
    assert y.divisors == tuple(rope.yarn_divisors(64, 10000.0, 4.0, 2048, 16.0, 2.0)) and y.attn_factor == 1.5
    assert y.describe() == "RoPE yarn x4 from 2048"


@pytest.mark.parametrize(("meta", "words"), [
    ({"rope.scaling.type": "longrope"}, "llama.rope.scaling.type = 'longrope' is not supported"),
    ({"rope.scaling.type": "dynamic", "rope.scaling.factor": 2.0}, "llama.rope.scaling.type = 'dynamic'"),
    ({"rope.scaling.type": 3}, "llama.rope.scaling.type = 3 is not a string"),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": "4"}, "llama.rope.scaling.factor = '4' is not a finite number"),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": -2.0}, "llama.rope.scaling.factor = -2.0"),
    ({"rope.scaling.attn_factor": 0.5}, "llama.rope.scaling.attn_factor = 0.5 is not supported"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_ext_factor": 0.5},
     "llama.rope.scaling.yarn_ext_factor = 0.5 is not supported"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_log_multiplier": 0.1},
     "llama.rope.scaling.yarn_log_multiplier = 0.1 is not supported"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 0},
     "llama.rope.scaling.original_context_length = 0"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_beta_fast": -1.0}, "yarn betas"),
])
def test_unsupported_or_bad_gguf_scaling_is_one_line_naming_key_and_value(meta, words):
    with pytest.raises(WeightsError) as err:
        _scaling(meta)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("rope_scaling", "words"), [
    ({"rope_type": "dynamic", "factor": 2.0}, "rope_scaling.rope_type = 'dynamic' is not supported"),
    ({"rope_type": "longrope", "factor": 2.0}, "rope_scaling.rope_type = 'longrope'"),
    ({"rope_type": "linear"}, "rope_scaling.factor = None is not a number"),
    ({"rope_type": "linear", "factor": 0}, "rope_scaling.factor = 0.0 must be positive"),
])
def test_unsupported_config_json_scaling_is_one_line(rope_scaling, words):
    from tests.engine.llama.arch_models import CONFIGS

    cfg = dict(CONFIGS["qwen2"], model_type="qwen2", num_hidden_layers=2, rope_scaling=rope_scaling)
    with pytest.raises(WeightsError) as err:
        parse_hf_config(cfg)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_llama3_file_with_a_linear_key_multiplies_both(root, models):
    """ggml applies a rope_freqs tensor and the keys' scaling together (freq_factors, then
    freq_scale): the divisors are the product."""
    m = _model(models, "llama", "llama3")
    path = write_gguf(m, scaled("llama", "llama3"), root / "llama3-x.gguf")
    reader = gguf.GGUFReader(str(path))
    file_freqs = next(t for t in reader.tensors if t.name == "rope_freqs.weight").data
    both = rope.combined_divisors(_scaling({"rope.scaling.factor": 2.0}, head_dim=16), file_freqs)
    assert both == pytest.approx([2.0 * float(v) for v in file_freqs])
