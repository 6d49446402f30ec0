"""tiny-llama: session invariants (restore exactness, chunking, payload framing) and ChatML."""

from __future__ import annotations

import io

import jinja2  # a test-only dependency: the engine renders ChatML itself
import pytest
import torch

from ds4tui.format.payload import DS4TUI_PAYLOAD_ABI, MODEL_ID_LLAMA, unpack_dsv4_header
from ds4tui.engine.llama.model import LlamaConfig, LlamaModel
from ds4tui.engine.llama.weights import hf_to_internal, make_info
from ds4tui.engine.loader import load_model
from ds4tui.engine.errors import PayloadError
from ds4tui.engine.llama.tiny import CHAT_TEMPLATE, CONFIG, random_llama_weights
from tests.engine.llama.payload_orders import as_token_major

CHUNK = 16  # small chunks so a 50-token prompt crosses several aligned boundaries


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-llama")


@pytest.fixture(scope="module")
def prompt(model):
    text = model.chat.render([{"role": "user", "content": "Tell me about the weather today, please."}])
    ids = model.tokenizer.encode(text)
    assert len(ids) > 3 * CHUNK
    return ids


def _session(model, ctx=256, kv_dtype="f16"):
    s = model.new_session(ctx, kv_dtype=kv_dtype)
    s.chunk_size = CHUNK
    return s


def _payload(session) -> bytes:
    buf = io.BytesIO()
    session.save_payload(buf)
    return buf.getvalue()


def _greedy(session, n):
    steps = []
    for _ in range(n):
        tok = int(session.logits.argmax())
        steps.append((tok, session.decode(tok).clone()))
    return steps


def test_info(model):
    assert model.info.family == "llama"
    assert model.info.model_id == MODEL_ID_LLAMA
    assert model.info.payload_abi == DS4TUI_PAYLOAD_ABI
    assert len(model.info.fingerprint) == 32
    assert model.tokenizer.eos_ids == {2}


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_restore_then_continue_is_bit_exact(model, prompt, kv_dtype):
    a = _session(model, kv_dtype=kv_dtype)
    a.prefill(prompt)
    data = _payload(a)
    expected = _greedy(a, 8)
    b = _session(model, kv_dtype=kv_dtype)
    b.load_payload(io.BytesIO(data), len(data))
    assert b.tokens == prompt
    got = _greedy(b, 8)
    assert [t for t, _ in got] == [t for t, _ in expected]
    for (_, la), (_, lb) in zip(expected, got):
        assert torch.equal(la, lb)
    # The greedy continuation of a random model is varied, not one token repeated.
    assert len({t for t, _ in expected}) > 2


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_token_by_token_matches_chunked_prefill(model, prompt, kv_dtype):
    chunked = _session(model, kv_dtype=kv_dtype)
    chunked.prefill(prompt)
    streamed = _session(model, kv_dtype=kv_dtype)
    for tok in prompt:
        streamed.decode(tok)
    # Different matmul shapes round differently in fp32; the documented tolerance is 1e-4. In
    # f16 a row the two orders put either side of a rounding boundary differs by one f16 step.
    tol = 1e-4 if kv_dtype == "f32" else 2e-3
    assert torch.allclose(streamed.logits, chunked.logits, atol=tol, rtol=tol)
    assert int(streamed.logits.argmax()) == int(chunked.logits.argmax())
    n = len(prompt)
    assert torch.allclose(streamed.kv[..., :n, :].float(), chunked.kv[..., :n, :].float(), atol=tol, rtol=tol)


def test_chunked_prefill_after_cached_tokens_uses_offset_mask(model, prompt):
    whole = _session(model)
    whole.prefill(prompt)
    split = _session(model)
    split.prefill(prompt[:21])  # ends mid-chunk: the next call's first chunk starts at 21
    split.prefill(prompt[21:])
    assert torch.allclose(split.logits, whole.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_payload_round_trip_is_byte_identical(model, prompt, kv_dtype):
    a = _session(model, kv_dtype=kv_dtype)
    a.prefill(prompt)
    data = _payload(a)
    assert len(data) == a.payload_bytes()
    h = unpack_dsv4_header(data)
    cfg = model.cfg
    assert (h.token_count, h.live_raw_rows, h.layer_count) == (len(prompt), len(prompt), cfg.num_layers)
    assert (h.raw_capacity, h.raw_window, h.compressed_capacity, h.indexer_head_dim) == (256, 256, 0, 0)
    assert h.head_dim == 2 * cfg.num_kv_heads * cfg.head_dim and h.vocab_size == cfg.vocab_size
    # KV_F16 bit (f16 sessions) | KV_HEAD_MAJOR bit | the full layout
    assert h.payload_version == (0xC1 if kv_dtype == "f16" else 0x41)
    rows = len(prompt) * cfg.num_layers * h.head_dim * (2 if kv_dtype == "f16" else 4)
    framing = 52 + 32 + 4 * len(prompt) + 4 * cfg.vocab_size + 8 * cfg.num_layers
    assert len(data) - rows == framing
    # Head-major: per layer, K then V, per KV head that head's rows in token order, exactly
    # the buffer's [2, Hkv, :T, D] (so a load reads each run straight into its slice).
    assert data[framing:] == a.kv[:, :, :, :len(prompt)].contiguous().numpy().tobytes()
    b = _session(model, ctx=512, kv_dtype=kv_dtype)  # a bigger context can take it
    b.load_payload(io.BytesIO(data), len(data))
    assert _payload(b)[52 + 32 :] == data[52 + 32 :]  # only saved_ctx etc. in the header differ
    c = _session(model, kv_dtype=kv_dtype)
    c.load_payload(io.BytesIO(data), len(data))
    assert _payload(c) == data


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_a_token_major_payload_still_loads_exactly(model, prompt, kv_dtype):
    """Files written before the head-major order hold token-major rows (no KV_HEAD_MAJOR bit):
    they load into the same buffers, continue bit-exact, and save again as head-major."""
    a = _session(model, kv_dtype=kv_dtype)
    a.prefill(prompt)
    data = _payload(a)
    old = as_token_major(data, model.cfg)
    assert old != data and len(old) == len(data)
    b = _session(model, kv_dtype=kv_dtype)
    b.load_payload(io.BytesIO(old), len(old))
    n = len(prompt)
    assert b.tokens == prompt and torch.equal(b.logits, a.logits)
    assert torch.equal(b.kv[:, :, :, :n], a.kv[:, :, :, :n])
    assert _payload(b) == data
    expected, got = _greedy(a, 4), _greedy(b, 4)
    assert all(ta == tb and torch.equal(la, lb) for (ta, la), (tb, lb) in zip(expected, got))


def test_a_truncated_or_non_finite_head_major_payload_is_rejected(model, prompt):
    """The reason names the run of rows where the file went wrong; the session is left empty."""
    a = _session(model)
    a.prefill(prompt)
    data = _payload(a)
    cfg, n = model.cfg, len(prompt)
    run = n * cfg.head_dim * 2  # one head's K (or V) rows of one layer, f16
    rows_at = len(data) - cfg.num_layers * 2 * cfg.num_kv_heads * run
    # The second layer's V rows of its last head start here.
    last_v = rows_at + (2 * cfg.num_kv_heads + 2 * cfg.num_kv_heads - 1) * run
    cut = data[:last_v + run // 2]
    _assert_rejected_and_usable(model, prompt, cut, f"truncated: layer 1 V rows of head {cfg.num_kv_heads - 1} needs")
    s = _session(model)
    with pytest.raises(PayloadError, match=f"file ended inside layer 1 V rows of head {cfg.num_kv_heads - 1}"):
        s.load_payload(io.BytesIO(cut), len(data))  # the size promised more than the file holds
    assert s.tokens == [] and s.logits is None
    bad = bytearray(data)
    bad[rows_at + run + 6:rows_at + run + 8] = b"\x00\xfc"  # f16 -inf in layer 0's K rows of head 1
    _assert_rejected_and_usable(model, prompt, bytes(bad), "layer 0 K rows of head 1: NaN or infinite")


def test_interrupted_prefill_saves_without_logits(model, prompt):
    a = _session(model)
    calls = iter([False, True])
    assert a.prefill(prompt, should_stop=lambda: next(calls)) is False
    assert len(a.tokens) == CHUNK and a.logits is None
    data = _payload(a)
    b = _session(model)
    b.load_payload(io.BytesIO(data), len(data))
    assert b.tokens == prompt[:CHUNK] and b.logits is None
    b.prefill(prompt[CHUNK:])
    full = _session(model)
    full.prefill(prompt)
    assert torch.equal(b.logits, full.logits)


def _other_model(model) -> LlamaModel:
    """A model with another config (one layer): its payloads must not load into tiny-llama."""
    raw = dict(CONFIG, num_hidden_layers=1)
    cfg = LlamaConfig.from_hf(raw)
    tensors = hf_to_internal(cfg, random_llama_weights(raw, seed=7), "test")
    info = make_info("other", cfg, "test-weights", 32)
    return LlamaModel(cfg, tensors, info, model.tokenizer, model.chat, "test")


def _assert_rejected_and_usable(model, prompt, data, match):
    s = _session(model)
    s.prefill(prompt[:5])
    with pytest.raises(PayloadError, match=match):
        s.load_payload(io.BytesIO(data), len(data))
    assert s.tokens == [] and s.logits is None
    s.prefill(prompt)
    fresh = _session(model)
    fresh.prefill(prompt)
    assert torch.equal(s.logits, fresh.logits)


def test_foreign_truncated_and_trailing_payloads_are_rejected(model, prompt):
    a = _session(model)
    a.prefill(prompt)
    data = _payload(a)
    flipped = bytearray(data)
    flipped[52] ^= 0xFF  # first fingerprint byte
    _assert_rejected_and_usable(model, prompt, bytes(flipped), "another model")
    other = _other_model(model).new_session(256)
    other.prefill(prompt)
    _assert_rejected_and_usable(model, prompt, _payload(other), "another model")
    _assert_rejected_and_usable(model, prompt, data[:-4], "truncated")
    _assert_rejected_and_usable(model, prompt, data + b"\0" * 4, "trailing")
    bad_rows = bytearray(data)
    bad_rows[4 * 8 : 4 * 9] = (1).to_bytes(4, "little")  # header field 8, layer_count: 2 -> 1
    _assert_rejected_and_usable(model, prompt, bytes(bad_rows), "layer_count")


def test_payload_bigger_than_context_is_rejected(model, prompt):
    a = _session(model)
    a.prefill(prompt)
    data = _payload(a)
    small = _session(model, ctx=len(prompt) - 1)
    with pytest.raises(PayloadError, match="context"):
        small.load_payload(io.BytesIO(data), len(data))
    assert small.tokens == []


def test_chatml_matches_jinja_and_parses_back(model):
    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    chats = [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
         {"role": "user", "content": "Two\nlines"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Yo"}],
    ]
    for msgs in chats:
        for gen in (True, False):
            assert model.chat.render(msgs, gen) == template.render(messages=msgs, add_generation_prompt=gen)
    text = model.chat.render(chats[0], add_generation_prompt=False)
    parsed = model.chat.parse(text)
    assert parsed[0] == {"role": "system", "content": model.chat.default_system_prompt}
    assert parsed[1:] == chats[0]
    assert model.chat.render(parsed, add_generation_prompt=False) == text
    assert model.chat.parse(model.chat.render(chats[1])) == chats[1]


def test_token_bytes_rebuild_the_text(model):
    text = "<|im_start|>user\nhéllo wörld, 42 € ✓<|im_end|>"
    ids = model.tokenizer.encode(text)
    assert ids[0] == 1 and ids[-1] == 2
    assert b"".join(model.tokenizer.token_bytes(i) for i in ids) == text.encode()
    assert model.tokenizer.decode(ids) == text


def test_storage_policy_does_not_apply_to_full_attention(model):
    """The Session contract's default: no sliding-window layers, so no policy to set."""
    s = model.new_session(64)
    assert s.set_storage_policy("zero") is False
