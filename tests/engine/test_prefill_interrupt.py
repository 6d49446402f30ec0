"""A prefill stopped between two layers of a chunk (Session.prefill's `interrupt`, what the
chat's Escape / ctrl+c sets): it stops at the very next layer, the session keeps whole chunks
only, and its state is exact: continuing gives the logits and payload bytes of a twin that was
never interrupted. With sliding layers (Gemma 3) the half-run chunk has overwritten ring slots
the earlier tokens still need; they are put back. DSV4's layers have written window rows and
compressor state: put back as a mark keeps them."""

from __future__ import annotations

import io

import pytest
import torch

from ds4tui.engine.llama.session import LlamaSession
from ds4tui.engine.llama.weights import load_llama_hf
from ds4tui.engine.loader import load_model
from tests.engine.llama.arch_models import VOCAB, hf_model, save_hf_dir

CHUNK = 8
CTX = 256
TOKENS = torch.randint(3, VOCAB, (CTX,), generator=torch.Generator().manual_seed(5)).tolist()
DSV4_CHUNK = 128  # a multiple of tiny-dsv4's compression ratios
DSV4_TOKENS = torch.randint(3, VOCAB, (4 * DSV4_CHUNK,), generator=torch.Generator().manual_seed(6)).tolist()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("gemma")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_DATA_DIR", str(root / "data"))
        return load_llama_hf(save_hf_dir(hf_model("gemma3"), root / "hf"), "tiny-gemma3")


@pytest.fixture(scope="module")
def llama():
    return load_model("tiny-llama")


@pytest.fixture(scope="module")
def dsv4():
    return load_model("tiny-dsv4")


class StopAt:
    """An interrupt that says stop from its `at`-th question on, counting every question: the
    session asks before each chunk and before each layer of a chunk, so the questions asked
    after the first yes are the layers run after the cancel."""

    def __init__(self, at: int) -> None:
        self.at, self.asked, self.after = at, 0, 0

    def __call__(self) -> bool:
        self.asked += 1
        if self.asked > self.at:
            self.after += 1
        return self.asked >= self.at


def payload(s) -> bytes:
    buf = io.BytesIO()
    s.save_payload(buf)
    return buf.getvalue()


def sessions(model):
    if model.info.name == "tiny-dsv4":
        return model.new_session(4 * DSV4_CHUNK, DSV4_CHUNK), model.new_session(4 * DSV4_CHUNK, DSV4_CHUNK)
    return LlamaSession(model, CTX, CHUNK), LlamaSession(model, CTX, CHUNK)


@pytest.mark.parametrize("which", ["llama", "gemma", "dsv4"])
def test_an_interrupt_stops_at_the_next_layer_and_the_state_stays_exact(which, request):
    model = request.getfixturevalue(which)
    layers = model.cfg.num_hidden_layers if which == "dsv4" else model.cfg.num_layers
    a, twin = sessions(model)
    chunk = a.chunk_size
    tokens = DSV4_TOKENS if which == "dsv4" else TOKENS
    first = tokens[: chunk + 3]  # ends inside a chunk: the interrupted one starts mid-chunk
    a.prefill(first)
    twin.prefill(first)
    assert layers >= 2
    mid = layers // 2  # stop before this layer: the ones before it have run, it and the rest not
    # Asked before the chunk (1), then before each of its layers (layer i: question 2 + i).
    stop = StopAt(2 + mid)
    more = tokens[chunk + 3 : 3 * chunk + 5]
    assert not a.prefill(more, interrupt=stop)
    assert stop.after == 0  # not one layer ran once it said stop
    assert a.tokens == first  # the half-run chunk is not kept
    assert torch.equal(a.logits, twin.logits)
    assert payload(a) == payload(twin)

    # Stopped in the second chunk of the call: the first stays, whole.
    stop = StopAt(1 + layers + 2 + mid)
    assert not a.prefill(more, interrupt=stop)
    assert stop.after == 0
    done = chunk - 3  # from chunk + 3 up to the boundary at 2 * chunk
    assert a.tokens == first + more[:done]

    a.prefill(more[done:])
    twin.prefill(more)
    assert a.tokens == twin.tokens
    assert torch.equal(a.logits, twin.logits)
    assert payload(a) == payload(twin)
    for token in tokens[100:104]:  # decode steps read every ring slot
        assert torch.equal(a.decode(token), twin.decode(token))


def test_without_the_undo_a_sliding_layer_would_be_torn(gemma, monkeypatch):
    """The check above fails when the ring slots are not put back (so it tests the undo)."""
    monkeypatch.setattr(LlamaSession, "_ring_slots", lambda self, pos, n: None)
    a, twin = sessions(gemma)
    a.prefill(TOKENS[:20])
    twin.prefill(TOKENS[:20])
    assert not a.prefill(TOKENS[20:40], interrupt=StopAt(1 + 5))
    assert a.tokens == twin.tokens
    assert payload(a) != payload(twin)  # slots of the ring hold the half-run chunk's rows


def test_a_single_token_prefill_is_never_cut(llama):
    """One token runs as the fused step (all layers in one call): only the check before it."""
    a, _ = sessions(llama)
    stop = StopAt(2)
    assert a.prefill(TOKENS[:1], interrupt=stop)
    assert stop.asked == 1 and a.tokens == TOKENS[:1]
