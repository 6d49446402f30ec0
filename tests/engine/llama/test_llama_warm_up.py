"""LlamaModel.warm_up, release_session and prepare_session: the spare KV buffer (pre-touched,
or a released session's) is adopted by the next session of its size and changes no result;
payload restore into it is bit-exact."""

from __future__ import annotations

import io

import pytest
import torch

from ds4tui.engine.llama.model import LlamaConfig, LlamaModel
from ds4tui.engine.llama.weights import hf_to_internal, make_info
from ds4tui.engine.loader import load_model
from ds4tui.engine.llama.tiny import CONFIG, random_llama_weights


@pytest.fixture()
def model():
    """A private tiny-llama (warm_up leaves a spare on the model: not on the shared one)."""
    shared = load_model("tiny-llama")
    cfg = LlamaConfig.from_hf(CONFIG)
    tensors = hf_to_internal(cfg, random_llama_weights(CONFIG, seed=0), "test")
    return LlamaModel(cfg, tensors, make_info("warm-up", cfg, "test:warm-up", 32), shared.tokenizer, shared.chat, "test")


def _run(session, tokens):
    assert session.prefill(tokens)
    logits = [session.logits.clone()]
    for t in (5, 9, 2):
        logits.append(session.decode(t).clone())
    return logits


def test_warm_up_spare_changes_nothing(model):
    tokens = list(range(3, 40))
    reference = _run(model.new_session(64), tokens)
    model.warm_up(64)
    spare = model._spare
    assert spare is not None and spare.shape[3] == 64
    warmed = model.new_session(64)
    assert warmed.kv.data_ptr() == spare.data_ptr() and model._spare is None
    got = _run(warmed, tokens)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))
    # Restore into a spare: the same tokens, logits and KV rows as the session saved.
    buf = io.BytesIO()
    warmed.save_payload(buf)
    model.warm_up(64)
    restored = model.new_session(64)
    assert restored.kv.data_ptr() != warmed.kv.data_ptr()
    restored.load_payload(io.BytesIO(buf.getvalue()), len(buf.getvalue()))
    n = len(warmed.tokens)
    assert restored.tokens == warmed.tokens
    assert torch.equal(restored.kv[..., :n, :], warmed.kv[..., :n, :])
    assert torch.equal(restored.decode(7), warmed.decode(7))


def test_spare_of_another_size_is_dropped(model):
    model.warm_up(32)
    s = model.new_session(64)
    assert s.kv.shape[3] == 64 and model._spare is None


def test_a_spare_of_another_size_or_type_is_not_adopted(model):
    """The spare's shape, type and layout are checked whole (session.fits): a spare warmed for
    another context or K/V type is dropped, not handed to a session it does not fit."""
    from ds4tui.engine.llama.kv_buffers import fits

    model.warm_up(64)
    assert model.new_session(32).kv.shape[3] == 32 and model._spare is None  # dropped
    model.warm_up(64, kv_dtype="f16")
    assert model.new_session(64, kv_dtype="f32").kv.dtype == torch.float32 and model._spare is None
    model.warm_up(64)
    spare = model._spare
    assert model.new_session(64).kv is spare  # adopted as it is
    cfg = model.cfg
    assert fits(spare, cfg, 64, spare.dtype)
    assert not fits(spare, cfg, 63, spare.dtype) and not fits(spare, cfg, 64, torch.float32 if spare.dtype == torch.float16 else torch.float16)
    assert not fits(spare.transpose(3, 4), cfg, 64, spare.dtype)  # wrong shape
    assert not fits(spare[:, :, :, :32], cfg, 32, spare.dtype)  # right shape, not contiguous


def test_a_released_session_s_buffers_go_to_the_next_session(model):
    """Its rows still hold the old conversation: the next session's results are a fresh one's."""
    tokens = list(range(3, 40))
    reference = _run(model.new_session(64), tokens)
    old = model.new_session(64)
    _run(old, list(range(100, 160)))  # rows full of another conversation
    ptr = old.kv.data_ptr()
    model.release_session(old)
    assert model._spare is not None and model._spare.data_ptr() == ptr
    assert old.kv is None and old.tokens == [] and old.kv_bytes == 0
    with pytest.raises(RuntimeError, match="released"):
        old.prefill([5, 6])
    with pytest.raises(RuntimeError, match="released"):
        old.save_payload(io.BytesIO())
    model.release_session(old)  # twice: nothing more to hand over
    adopted = model.new_session(64)
    assert adopted.kv.data_ptr() == ptr and model._spare is None
    got = _run(adopted, tokens)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))


def test_release_keeps_one_spare_at_most(model):
    model.warm_up(64)
    spare = model._spare
    other = model.new_session(64)  # takes the warmed spare
    third = model.new_session(64)
    model.release_session(other)
    model.release_session(third)  # a spare exists: this one is dropped
    assert model._spare is spare


def test_prepare_session_makes_a_spare_in_the_background(model):
    tokens = list(range(3, 40))
    reference = _run(model.new_session(64), tokens)
    model.prepare_session(64, wait=True)
    spare = model._spare
    assert spare is not None and spare.shape[3] == 64 and model._preparing is None
    model.prepare_session(64, wait=True)  # one exists: no second one
    assert model._spare is spare
    prepared = model.new_session(64)
    assert prepared.kv is spare
    assert all(torch.equal(a, b) for a, b in zip(reference, _run(prepared, tokens)))
    with pytest.raises(ValueError):
        model.prepare_session(64, kv_dtype="f8")



def test_a_fork_copies_into_the_spare(model):
    tokens = list(range(3, 40))
    parent = model.new_session(64)
    _run(parent, tokens)
    model.prepare_session(64, wait=True)
    spare = model._spare
    child = parent.fork()
    assert child.kv is spare and model._spare is None
    n = len(parent.tokens)
    assert torch.equal(child.kv[..., :n, :], parent.kv[..., :n, :])
    assert torch.equal(child.decode(11), parent.decode(11))
    model.warm_up(32)  # a spare of another size: the fork does not take it
    other = parent.fork()
    assert other.kv.shape[3] == 64 and other.kv.data_ptr() != spare.data_ptr()
