"""Restore and forward at once (LlamaSession.load_payload_ahead): the same bits as a restore
followed by the prefill, the forward waiting for each layer's rows, and every failure of
the read leaving an empty session."""

from __future__ import annotations

import io
import time

import pytest
import torch

from ds4tui.engine.errors import PayloadError
from ds4tui.engine.kernels import qgemv
from ds4tui.engine.loader import load_model
from tests.engine.llama.payload_orders import as_token_major

CHUNK = 24


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-llama")


@pytest.fixture(scope="module")
def text(model):
    """(prefix tokens, the follow-up's tokens)."""
    chat = model.chat
    first = [{"role": "user", "content": "Tell me about the weather today, please."},
             {"role": "assistant", "content": "It is sunny with a light breeze."}]
    head = chat.render(first)
    whole = chat.render(first + [{"role": "user", "content": "And tomorrow, in the hills?"}], add_generation_prompt=True)
    prefix, follow = model.tokenizer.encode(head), model.tokenizer.encode(whole[len(head):])  # as the chat does
    assert 6 <= len(follow) <= CHUNK and len(prefix) > 2 * CHUNK
    return prefix[:CHUNK * (len(prefix) // CHUNK) - 4], follow  # 4 tokens before a chunk boundary


def _session(model, kv_dtype, ctx=256):
    s = model.new_session(ctx, kv_dtype=kv_dtype)
    s.chunk_size = CHUNK
    return s


def _payload(model, tokens, kv_dtype) -> bytes:
    s = _session(model, kv_dtype)
    s.prefill(tokens)
    buf = io.BytesIO()
    s.save_payload(buf)
    return buf.getvalue()


def _state(session) -> tuple:
    n = len(session.tokens)
    return list(session.tokens), session.logits.clone(), session.kv[:, :, :, :n].clone()


def _assert_same(a: tuple, b: tuple) -> None:
    assert a[0] == b[0]
    assert torch.equal(a[1], b[1])  # bit for bit: the same calls on the same inputs
    assert torch.equal(a[2], b[2])


class Forwards:
    """Counts the model's forwards, and those run alongside a restore (given a before_layer)."""

    def __init__(self, model, monkeypatch) -> None:
        self.calls: list[bool] = []
        inner = model.forward

        def forward(*args, **kwargs):
            self.calls.append(kwargs.get("before_layer") is not None)
            return inner(*args, **kwargs)

        monkeypatch.setattr(model, "forward", forward)


def _sequential(model, data, follow, kv_dtype):
    s = _session(model, kv_dtype)
    s.load_payload(io.BytesIO(data), len(data))
    s.prefill(follow)
    return s


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("shape", ["one chunk", "across a chunk boundary"])
def test_overlapped_restore_and_prefill_equal_sequential_bit_for_bit(model, text, kv_dtype, shape, monkeypatch):
    prefix, follow = text
    if shape == "across a chunk boundary":  # the restore runs the chunk up to the boundary, the prefill the rest
        assert len(follow) > 4  # 4 tokens to the boundary, then more
    else:
        prefix = prefix[:CHUNK * (len(prefix) // CHUNK)]  # the follow-up fits the chunk after it
        follow = follow[:CHUNK - 2]
    data = _payload(model, prefix, kv_dtype)
    want = _sequential(model, data, follow, kv_dtype)

    forwards = Forwards(model, monkeypatch)
    s = _session(model, kv_dtype)
    s.load_payload_ahead(io.BytesIO(data), len(data), follow)
    assert forwards.calls == [True]  # the first chunk, run while reading
    assert s.tokens == prefix  # and not yet part of the session
    s.prefill(follow)
    assert forwards.calls == [True] + [False] * (shape != "one chunk")
    _assert_same(_state(s), _state(want))
    # The session goes on exactly like the sequential one.
    tok = int(want.logits.argmax())
    assert torch.equal(s.decode(tok), want.decode(tok))
    assert torch.equal(s.kv[:, :, :, :len(s.tokens)], want.kv[:, :, :, :len(want.tokens)])


def test_a_chunk_run_ahead_is_dropped_by_anything_else(model, text, monkeypatch):
    """Another prefill, a decode or a rewind after the restore computes afresh: the result is
    the sequential one."""
    prefix, follow = text
    data = _payload(model, prefix, "f16")
    other = list(reversed(follow))
    for act in (lambda s: s.prefill(other), lambda s: s.decode(follow[0]), lambda s: (s.rewind(len(prefix) - 3), s.prefill(follow))):
        want = _session(model, "f16")
        want.load_payload(io.BytesIO(data), len(data))
        act(want)
        s = _session(model, "f16")
        s.load_payload_ahead(io.BytesIO(data), len(data), follow)
        act(s)
        _assert_same(_state(s), _state(want))


class SlowStream(io.BytesIO):
    """A payload stream that sleeps in every readinto (the rows' reads) and notes how far it got."""

    def __init__(self, data: bytes, delay: float) -> None:
        super().__init__(data)
        self.delay, self.delivered = delay, 0

    def readinto(self, buf) -> int:
        time.sleep(self.delay)
        n = super().readinto(buf)
        self.delivered = self.tell()
        return n


def test_the_forward_waits_for_each_layer_of_a_slow_reader(model, text, monkeypatch):
    prefix, follow = text
    follow = follow[:4]
    data = _payload(model, prefix, "f16")
    cfg = model.cfg
    layer_bytes = 2 * cfg.num_kv_heads * len(prefix) * cfg.head_dim * 2
    layer_end = [len(data) - (cfg.num_layers - 1 - i) * layer_bytes for i in range(cfg.num_layers)]
    stream = SlowStream(data, 0.03)
    seen: list[tuple[int, int]] = []  # (layer the forward enters, bytes read by then)
    inner = model.forward

    def forward(*args, before_layer=None, **kwargs):
        def hook(i):
            before_layer(i)
            seen.append((i, stream.delivered))
        return inner(*args, before_layer=hook, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    s = _session(model, "f16")
    s.load_payload_ahead(stream, len(data), follow)
    assert [i for i, _ in seen] == list(range(cfg.num_layers))
    for i, delivered in seen:
        assert delivered >= layer_end[i]  # every row of layer i was in before the layer ran
    assert seen[0][1] < len(data)  # and layer 0 ran while later layers were still on their way
    monkeypatch.undo()
    s.prefill(follow)
    _assert_same(_state(s), _state(_sequential(model, data, follow, "f16")))


def _assert_left_empty_then_cold(model, s, follow, prefix) -> None:
    assert s.tokens == [] and s.logits is None
    s.prefill(prefix + follow)  # the session still works, and nothing of the failed read is used
    cold = _session(model, "f16")
    cold.prefill(prefix + follow)
    _assert_same(_state(s), _state(cold))


def _rows_at(model, data, prefix) -> int:
    cfg = model.cfg
    return len(data) - cfg.num_layers * 2 * cfg.num_kv_heads * len(prefix) * cfg.head_dim * 2


@pytest.mark.parametrize("how", ["size promises more than the file", "header promises more than the size",
                                 "NaN in the last layer", "trailing bytes"])
def test_a_bad_payload_fails_the_overlapped_restore_cleanly(model, text, how, monkeypatch):
    prefix, follow = text
    data = _payload(model, prefix, "f16")
    nbytes = len(data)
    if how == "size promises more than the file":
        data, match = data[:len(data) - 100], "file ended inside layer 1 V rows"
    elif how == "header promises more than the size":
        data, nbytes, match = data[:len(data) - 100], len(data) - 100, "truncated: layer 1 V rows .* needs"
    elif how == "NaN in the last layer":
        bad = bytearray(data)
        bad[-4:-2] = b"\x00\x7e"  # f16 NaN in the last head's last V row
        data, match = bytes(bad), "layer 1 V rows of head 1: NaN or infinite"
    else:
        data, nbytes, match = data + b"\0\0", nbytes + 2, "2 trailing bytes"
    forwards = Forwards(model, monkeypatch)
    s = _session(model, "f16")
    with pytest.raises(PayloadError, match=match):
        s.load_payload_ahead(io.BytesIO(data), nbytes, follow)
    assert forwards.calls and forwards.calls[0]  # the forward had started alongside
    monkeypatch.undo()
    _assert_left_empty_then_cold(model, s, follow, prefix)


def test_a_failing_forward_stops_the_reader(model, text, monkeypatch):
    prefix, follow = text
    data = _payload(model, prefix, "f16")
    stream = SlowStream(data, 0.03)

    def forward(*args, before_layer=None, **kwargs):
        before_layer(0)
        raise RuntimeError("out of memory in layer 0")

    monkeypatch.setattr(model, "forward", forward)
    s = _session(model, "f16")
    with pytest.raises(RuntimeError, match="out of memory"):
        s.load_payload_ahead(stream, len(data), follow)
    stopped_at = stream.delivered
    assert stopped_at < len(data)  # the reader stopped instead of reading the rest
    time.sleep(0.05)
    assert stream.delivered == stopped_at  # and has ended: nothing writes into the buffers any more
    monkeypatch.undo()
    _assert_left_empty_then_cold(model, s, follow, prefix)


def test_no_overlap_where_it_does_not_apply(model, text, monkeypatch):
    """One token (the fused step: no layer to wait for), a follow-up that overflows the
    context, a file in the token-major order of old (read through a staging buffer), a
    follow-up longer than a chunk (a long prefill: its progress and cancel points stay):
    a plain restore, the prefill does the work, with the sequential result."""
    prefix, follow = text
    data = _payload(model, prefix, "f16")
    old = as_token_major(data, model.cfg)
    forwards = Forwards(model, monkeypatch)
    longer = (follow * 3)[:CHUNK + 1]
    for payload, ahead, ctx in ((data, follow[:1], 256), (data, follow, len(prefix) + len(follow) - 1),
                                (old, follow, 256), (data, longer, 256)):
        s = _session(model, "f16", ctx=ctx)
        s.load_payload_ahead(io.BytesIO(payload), len(payload), ahead)
        assert s.tokens == prefix and forwards.calls == []
    s.prefill(longer)
    monkeypatch.undo()
    _assert_same(_state(s), _state(_sequential(model, data, longer, "f16")))


@pytest.mark.parametrize("good", [True, False])
def test_the_reader_holds_a_kernel_thread_only_while_it_reads(model, text, good, monkeypatch):
    """While the reader copies and checks rows, the forward's kernels leave it a core
    (qgemv.reserve_threads); it gives it back when it ends, read through or failed."""
    prefix, follow = text
    data = _payload(model, prefix, "f16")
    if not good:
        bad = bytearray(data)
        bad[-4:-2] = b"\x00\x7e"  # f16 NaN in the last row
        data = bytes(bad)
    stream = SlowStream(data, 0.03)
    during: list[int] = []
    inner = model.forward

    def forward(*args, before_layer=None, **kwargs):
        def hook(i):
            before_layer(i)
            during.append(qgemv.reserved_threads())
        return inner(*args, before_layer=hook, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    assert qgemv.reserved_threads() == 0
    s = _session(model, "f16")
    if good:
        s.load_payload_ahead(stream, len(data), follow)
    else:
        with pytest.raises(PayloadError, match="NaN"):
            s.load_payload_ahead(stream, len(data), follow)
    assert during and during[0] == 1  # layer 0 ran while later layers were still being read
    assert qgemv.reserved_threads() == 0
