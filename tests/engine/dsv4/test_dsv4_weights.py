"""DSV4 checkpoints: official and HF names load the same model, an FP8 copy loads within
tolerance, and every malformed checkpoint is a WeightsError naming the tensor."""

from __future__ import annotations

import json

import pytest
import torch

from ds4tui.format.payload import MODEL_ID_DS4_FLASH, MODEL_ID_DSV4_CUSTOM
from ds4tui.engine.dsv4.model import load_dsv4, model_from_tensors
from ds4tui.engine.dsv4.config import Dsv4Config
from ds4tui.engine.loader import load_model
from ds4tui.engine.errors import WeightsError
from ds4tui.engine.dsv4.tiny import CONFIG, random_tensors, tiny_config, write_checkpoint
from tests.engine.dsv4.dsv4_helpers import single_thread, tiny, tokens  # noqa: F401 (fixture)

_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def hf_style_config() -> dict:
    """CONFIG in HF's newer spelling: layer types, MLP types, partial rotary, nested rope."""
    cfg = {k: v for k, v in CONFIG.items()
           if k not in ("compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling",
                        "rope_theta", "compress_rope_theta")}
    n = cfg["num_hidden_layers"]
    cfg["layer_types"] = [_TYPES[r] for r in CONFIG["compress_ratios"]]
    cfg["mlp_layer_types"] = ["hash_moe"] * CONFIG["num_hash_layers"] + ["moe"] * (n - CONFIG["num_hash_layers"])
    cfg["partial_rotary_factor"] = CONFIG["qk_rope_head_dim"] / CONFIG["head_dim"]
    yarn = {k: v for k, v in CONFIG["rope_scaling"].items() if k != "type"}
    cfg["rope_parameters"] = {
        "main": {"rope_type": "default", "rope_theta": CONFIG["rope_theta"]},
        "compress": {"rope_type": "yarn", "rope_theta": CONFIG["compress_rope_theta"], **yarn},
    }
    return cfg


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    tensors = random_tensors(tiny_config())
    root = tmp_path_factory.mktemp("dsv4-copies")
    hf = write_checkpoint(root / "hf", tensors, names="hf", config=hf_style_config())
    fp8 = write_checkpoint(root / "fp8", tensors, fp8=True)
    return {"hf": load_dsv4(hf, "hf"), "fp8": load_dsv4(fp8, "fp8"), "dirs": (hf, fp8)}


def _logits(model, toks):
    s = model.new_session(512)
    s.prefill(toks)
    return s.logits


def test_official_and_hf_names_are_the_same_model(copies):
    official, hf = load_model("tiny-dsv4"), copies["hf"]
    assert official.cfg.canonical_json() == hf.cfg.canonical_json()  # HF-style config keys parse alike
    assert official.info.fingerprint == hf.info.fingerprint
    names = sorted(p.name for p in copies["dirs"][0].glob("*.safetensors"))
    assert len(names) == 2  # sharded: the loader merges files
    toks = tokens(200)
    assert torch.equal(_logits(official, toks), _logits(hf, toks))
    assert official.info.quant_bits == 4 and hf.info.quant_bits == 32  # FP4 experts vs fused float


def test_fp8_copy_loads_within_tolerance(copies):
    official, fp8 = load_model("tiny-dsv4"), copies["fp8"]
    assert fp8.info.fingerprint != official.info.fingerprint  # other weights: another model
    # Weights: E4M3 keeps 3 mantissa bits, so each value is within 1/16 of itself, or of its
    # block's scale (2^ceil(log2(amax/448))) for values in the subnormal range.
    for li in range(official.cfg.num_hidden_layers):
        w, q = official.net.w.layers[li].attn.wq_b, fp8.net.w.layers[li].attn.wq_b
        assert not torch.equal(w, q)
        assert ((q - w).abs() <= w.abs() / 16 + w.abs().max() / 448 * 2**-9 + 1e-12).all()
    # Logits: the perturbation passes through QAT rounding and top-k choices, so compare
    # directions loosely; the same FP8 copy always gives the same logits.
    toks = tokens(200)
    a, b = _logits(official, toks), _logits(fp8, toks)
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.9
    assert torch.equal(b, _logits(fp8, toks))


def test_model_identity():
    info = load_model("tiny-dsv4").info
    assert info.family == "dsv4" and info.model_id == MODEL_ID_DSV4_CUSTOM
    assert info.payload_abi == 128 and len(info.fingerprint) == 32
    assert Dsv4Config().is_flash and not tiny_config().is_flash
    assert MODEL_ID_DS4_FLASH == 0


def test_flash_config_derivations():
    cfg = Dsv4Config.from_hf({"num_hidden_layers": 43, "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0]})
    assert cfg.compress_ratios.count(4) == 21 and cfg.compress_ratios.count(128) == 20  # MTP entry dropped
    assert cfg.hash_layers[:4] == [True, True, True, False] and cfg.ratio_lcm == 128
    assert cfg.n_nope == 448 and cfg.hc_mix == 24


@pytest.fixture(scope="module")
def good():
    return random_tensors(tiny_config(), seed=3)


def _load(tensors):
    return model_from_tensors("t", tiny_config(), tensors, tiny().tokenizer)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t: t.pop("layers.2.attn.indexer.wq_b.weight"), "missing tensor layers.2.attn.indexer.wq_b.weight"),
        (lambda t: t.pop("layers.4.ffn.experts.7.w2.weight"), "missing tensor layers.4.ffn.experts.7.w2.weight"),
        (lambda t: t.__setitem__("layers.0.attn.bogus", torch.zeros(3)), "unexpected tensor layers.0.attn.bogus"),
        (lambda t: t.__setitem__("layers.0.attn.compressor.ape", torch.zeros(4, 160)),
         "unexpected tensor layers.0.attn.compressor.ape"),  # a compressor on a window-only layer
        (lambda t: t.__setitem__("layers.1.attn.wkv.weight", torch.zeros(81, 128)),
         r"layers.1.attn.wkv.weight: shape \[81, 128\], expected \[80, 128\]"),
        (lambda t: t["layers.0.ffn.gate.tid2eid"].__setitem__((5, 0), 8), "expert ids outside 0..7"),
        (lambda t: t["norm.weight"].__setitem__(3, float("nan")), "norm.weight: contains NaN"),
        (lambda t: t.__setitem__("head.weight", t["head.weight"].to(torch.float8_e4m3fn)),
         "head.weight: FP8 weight without its .scale"),
        (lambda t: t.update({"head.weight": t["head.weight"].to(torch.float8_e4m3fn),
                             "head.scale": torch.ones(2, 2).to(torch.float8_e8m0fnu)}),
         r"head.weight: FP8 scale shape \(2, 2\) does not match \(4, 1\)"),
    ],
    ids=["missing", "missing-expert", "extra", "extra-compressor", "shape", "tid2eid", "nan", "fp8-no-scale",
         "fp8-scale-shape"],
)
def test_bad_tensors_are_weights_errors_naming_the_tensor(good, edit, match):
    tensors = {k: v.clone() for k, v in good.items()}
    edit(tensors)
    with pytest.raises(WeightsError, match=match):
        _load(tensors)


def test_bad_checkpoint_files(tmp_path, copies):
    hf_dir = copies["dirs"][0]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((hf_dir / "config.json").read_text())
    with pytest.raises(WeightsError, match="no \\*.safetensors"):
        load_dsv4(bad, "bad")
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(WeightsError, match="model.safetensors: not a readable safetensors file"):
        load_dsv4(bad, "bad")
    (bad / "config.json").write_text(json.dumps({**CONFIG, "scoring_func": "softmax"}))
    with pytest.raises(WeightsError, match="scoring_func"):
        load_dsv4(bad, "bad")


def _saved_names(tensors: dict) -> dict:
    """Canonical names as transformers' save_pretrained writes them: `model.` before every
    name but head.weight, embed/norm/hc_head in its module spelling, the KV norm as attn.norm."""
    top = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
           "hc_head_fn": "model.hc_head.hc_fn", "hc_head_base": "model.hc_head.hc_base",
           "hc_head_scale": "model.hc_head.hc_scale", "head.weight": "head.weight"}
    out = {}
    for name, t in tensors.items():
        saved = top.get(name) or "model." + name
        out[saved.replace(".attn.kv_norm.", ".attn.norm.")] = t
    return out


def test_transformers_saved_names_are_the_same_model(good):
    official = _load(good)
    saved = _load(_saved_names(good))
    assert saved.info.fingerprint == official.info.fingerprint
    both = dict(_saved_names(good), **{"model.layers.1.attn.kv_norm.weight": good["layers.1.attn.kv_norm.weight"]})
    with pytest.raises(WeightsError, match="layers.1.attn.kv_norm.weight is stored twice"):
        _load(both)
    with pytest.raises(WeightsError, match="unexpected tensor model.layers.0.self_attn.bogus"):
        _load(dict(good, **{"model.layers.0.self_attn.bogus": torch.zeros(2)}))


def test_ds4tui_config_keys():
    base = {**CONFIG, "head_dim": 72}  # 56 non-RoPE dims: not a whole FP8 KV block
    with pytest.raises(WeightsError, match="FP8 KV block"):
        Dsv4Config.from_hf(base)
    cfg = Dsv4Config.from_hf({**base, "ds4tui_qat": False})
    assert (cfg.qat_kv_fp8, cfg.qat_indexer_fp4, cfg.cache_f16) == (False, False, True)
    cfg = Dsv4Config.from_hf({**CONFIG, "ds4tui_cache_f16": False})
    assert (cfg.qat_kv_fp8, cfg.qat_indexer_fp4, cfg.cache_f16) == (True, True, False)
    with pytest.raises(WeightsError, match="ds4tui_qat must be true or false"):
        Dsv4Config.from_hf({**CONFIG, "ds4tui_qat": "no"})


@pytest.mark.parametrize("edit, match", [
    ({"compress_rates": {"compressed_sparse_attention": 8}}, "compressed_sparse_attention with compress rate 8"),
    ({"compress_rates": {"heavily_compressed_attention": 4}}, "heavily_compressed_attention with compress rate 4"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_key_value_heads": 2}, "one shared KV head"),
    ({"rope_parameters": {"main": {"rope_type": "default", "rope_theta": 1e4},
                          "compress": {"rope_type": "yarn", "factor": 16, "attention_factor": 1.2}}},
     "attention_factor"),
])
def test_config_outside_the_architecture_is_refused(edit, match):
    with pytest.raises(WeightsError, match=match):
        Dsv4Config.from_hf({**hf_style_config(), **edit})
