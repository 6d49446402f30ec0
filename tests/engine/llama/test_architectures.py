"""Every architecture against transformers: tiny seeded models, as a HF directory and as GGUF
files (F32, Q8_0, Q4_0), on prompts longer than Gemma 3's sliding window."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ds4tui.engine.llama.gguf import load_llama_gguf
from ds4tui.engine.llama.session import LlamaSession
from ds4tui.engine.llama.weights import load_llama_hf
from tests.engine.llama.arch_models import VOCAB, WINDOW, hf_model, quantized_copy, reference_logits, save_hf_dir, write_gguf

pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
TOL = 1e-4
PROMPT = torch.randint(3, VOCAB, (3 * WINDOW + 5,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{arch: (transformers model, its reference logits, our model from the HF directory)}."""
    root = tmp_path_factory.mktemp("archs")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_DATA_DIR", str(root / "data"))
        for arch in ARCHS + ["gemma3-qpas"]:
            ref = hf_model(arch)
            out[arch] = (ref, reference_logits(ref, PROMPT), load_llama_hf(save_hf_dir(ref, root / arch), arch))
        yield root, out


def _close(got: torch.Tensor, want: torch.Tensor, tol: float = TOL) -> None:
    err = float((got - want).abs().max())
    assert err <= tol * max(1.0, float(want.abs().max())), f"max |dlogit| {err:.3g}"


# f16 KV rounds every K/V row once (relative error 2^-11): the logits drift by a few 1e-4 of
# their range on these random models, and the top token stays.
KV_TOL = {"f32": TOL, "f16": 3e-3}


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
@pytest.mark.parametrize("arch", ARCHS + ["gemma3-qpas"])
def test_hf_directory_matches_transformers(built, arch, kv_dtype):
    _, models = built
    _, ref, ours = models[arch]
    assert ours.cfg.arch == arch.split("-")[0]
    s = ours.new_session(256, kv_dtype=kv_dtype)
    assert s.kv[0].dtype == (torch.float16 if kv_dtype == "f16" else torch.float32)
    s.prefill(PROMPT)
    _close(s.logits, ref[-1], KV_TOL[kv_dtype])
    assert int(s.logits.argmax()) == int(ref[-1].argmax())


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_chunks_and_decode_steps_match_transformers_at_every_position(built, arch, kv_dtype):
    """Chunks of 7 (not a divisor of the window) and then single tokens: each sliding ring
    wraps several times, in both ways of feeding it."""
    _, models = built
    _, ref, ours = models[arch]
    s = LlamaSession(ours, 256, 7, kv_dtype=kv_dtype)
    split = 2 * WINDOW + 3
    s.prefill(PROMPT[:split])
    _close(s.logits, ref[split - 1], KV_TOL[kv_dtype])
    for pos in range(split, len(PROMPT)):
        _close(s.decode(PROMPT[pos]), ref[pos], KV_TOL[kv_dtype])


@pytest.mark.parametrize("arch", ARCHS)
def test_f32_gguf_matches_transformers(built, arch):
    root, models = built
    ref_model, ref, hf_dir_model = models[arch]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_DATA_DIR", str(root / "data"))
        ours = load_llama_gguf(write_gguf(ref_model, arch, root / f"{arch}-F32.gguf", Q.F32), arch)
    assert ours.cfg == hf_dir_model.cfg  # every field read from the GGUF's own metadata
    s = ours.new_session(256, kv_dtype="f32")  # the exact reference: f32 K/V like transformers
    s.prefill(PROMPT)
    _close(s.logits, ref[-1])


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0])
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_gguf_matches_transformers_on_the_same_weights(built, arch, qtype):
    """Within 1e-4 of transformers run on gguf's quantize-then-dequantize of each matrix (the
    values the file holds); against the unquantized model, Q8_0 stays within 5% of the
    largest logit and keeps the top token."""
    root, models = built
    ref_model, ref, _ = models[arch]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_DATA_DIR", str(root / "data"))
        ours = load_llama_gguf(write_gguf(ref_model, arch, root / f"{arch}-{qtype.name}.gguf", qtype), arch)
    s = ours.new_session(256, kv_dtype="f32")
    s.prefill(PROMPT)
    _close(s.logits, reference_logits(quantized_copy(ref_model, qtype), PROMPT)[-1])
    if qtype == Q.Q8_0:
        assert float((s.logits - ref[-1]).abs().max()) < 0.05 * float(ref[-1].abs().max())
        assert int(s.logits.argmax()) == int(ref[-1].argmax())


def test_sliding_layers_hold_only_their_window(built):
    _, models = built
    ours = models["gemma3"][2]
    assert ours.cfg.layer_types == ("sliding",) * 5 + ("full", "sliding")
    s = ours.new_session(256)
    rows = [t.shape[2] for t in s.kv]
    assert rows == [WINDOW] * 5 + [256, WINDOW]
    assert ours.cfg.swa_layout() == f"6 sliding (window {WINDOW}) + 1 global layers"


def test_a_plain_llama_keeps_the_fingerprint_it_had_before_the_new_fields():
    """Fields at their defaults stay out of the fingerprint's JSON (old .kv files keep loading);
    any architecture field that differs is in it."""
    import dataclasses

    from ds4tui.engine.llama.config import LlamaConfig

    cfg = LlamaConfig(vocab_size=8, hidden_size=4, intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                      head_dim=4, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=16,
                      tie_word_embeddings=True)
    assert cfg.canonical_json() == (b'{"head_dim":4,"hidden_size":4,"intermediate_size":8,"max_position_embeddings":16,'
                                    b'"num_heads":1,"num_kv_heads":1,"num_layers":1,"rms_norm_eps":1e-05,'
                                    b'"rope_theta":10000.0,"tie_word_embeddings":true,"vocab_size":8}')
    assert b'"qk_norm":true' in dataclasses.replace(cfg, qk_norm=True).canonical_json()
