"""Several sessions decoded in one step (LlamaModel.decode_batch through decode_together)
against each decoded alone (the fused C step), on a tiny GGUF of Q4_1 blocks: the block GEMM
over the batch's rows is the path under test.

Tolerance: the batch's products are a GEMM over B rows where the step is a GEMV per row, so
the sums run in another order: logits agree to 1e-3 of their largest magnitude, and the
greedy tokens are the same."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ds4tui.engine.session import decode_together


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory):
    from tests.engine.llama.test_gguf import write_tiny_gguf

    from ds4tui.engine.llama.gguf import load_llama_gguf
    from ds4tui.engine.llama.tiny import ensure_tiny_llama

    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("q4")
    mp.setenv("DS4TUI_DATA_DIR", str(tmp / "data"))
    path = tmp / "tiny-q4_1.gguf"
    write_tiny_gguf(ensure_tiny_llama(), path, Q.Q4_1)
    model = load_llama_gguf(path, "tiny-q4")
    yield model
    mp.undo()


PROMPTS = ["Hi there", "A longer opening message about harbours and markets " * 3, "x", "Count: 1 2 3 4 5 6"]


def _sessions(model, n):
    out = []
    for i in range(n):
        s = model.new_session(256)
        s.prefill(model.tokenizer.encode(PROMPTS[i % len(PROMPTS)] + f" #{i}"))
        out.append(s)
    return out


def test_the_batch_runs_the_block_gemm(q4_model):
    assert q4_model.fast is not None and q4_model._block_products() and q4_model._c_kernels


@pytest.mark.parametrize("n", [2, 3, 5])
def test_batched_decode_equals_each_alone(q4_model, n):
    batch, alone = _sessions(q4_model, n), _sessions(q4_model, n)
    tokens = [int(s.logits.argmax()) for s in batch]
    for step in range(12):
        together = decode_together(batch, tokens)
        single = [s.decode(t) for s, t in zip(alone, tokens)]
        for a, b in zip(together, single):
            assert (a - b).abs().max() <= 1e-3 * b.abs().max(), step
        assert [int(x.argmax()) for x in together] == [int(x.argmax()) for x in single]
        tokens = [int(x.argmax()) for x in single]
    for a, b in zip(batch, alone):
        assert a.tokens == b.tokens and a.logits is not None
        # the K/V rows each step wrote are the ones a decode alone writes (same tolerance)
        n_tok = len(a.tokens)
        ka, kb = a.kv[:, :, :, :n_tok].float(), b.kv[:, :, :, :n_tok].float()
        assert (ka - kb).abs().max() <= 1e-3 * kb.abs().max()


def test_a_batch_with_one_session_is_its_decode(q4_model):
    (a,), (b,) = _sessions(q4_model, 1), _sessions(q4_model, 1)
    t = int(a.logits.argmax())
    assert torch.equal(decode_together([a], [t])[0], b.decode(t))


def test_a_full_session_refuses_the_batch_before_any_forward(q4_model):
    from ds4tui.engine.errors import ContextFullError

    a, b = _sessions(q4_model, 2)
    full = q4_model.new_session(4)
    full.prefill([1, 2, 3, 4])
    before = (list(a.tokens), list(b.tokens))
    with pytest.raises(ContextFullError):
        decode_together([a, full, b], [5, 6, 7])
    assert (a.tokens, b.tokens) == before
