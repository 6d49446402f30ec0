"""What "equal to a cold prefill" means for a shared prefix, on the real default model
(SmolLM2-135M-Instruct, installed by `make test`): a fork whose rows another prompt's prefill
computed, in that prompt's chunks, and the turns that prefill only the last token.

The tolerance (docs/chat.md, "Shared prefixes"): the next-token logits within
LOGIT_TOLERANCE of a cold prefill's, everywhere, and the greedy continuation identical.
"""

from __future__ import annotations

import pytest

from ds4tui.engine.errors import ModelNotFoundError
from ds4tui.engine.loader import load_model
from ds4tui.engine.registry import DEFAULT_MODEL

pytestmark = pytest.mark.real_model

LOGIT_TOLERANCE = 1e-2  # absolute, in logits (SmolLM2's next-token logits have a std of ~3)
GREEDY_TOKENS = 24
# ~700 tokens: the shared part spans a 512-token prefill chunk boundary.
SYSTEM = " ".join(f"Rule {i}: answer politely and cite the harbour log entry {i * 7}." for i in range(40))


@pytest.fixture(scope="module")
def smol():
    try:
        return load_model(DEFAULT_MODEL)
    except ModelNotFoundError as exc:
        pytest.fail(f"{exc} (`make test` does this before running the tests)")


def _prompt(smol, question: str) -> list[int]:
    return smol.tokenizer.encode(smol.chat.render([{"role": "system", "content": SYSTEM},
                                                   {"role": "user", "content": question}]))


def _greedy(session, n: int = GREEDY_TOKENS) -> list[int]:
    out = []
    for _ in range(n):
        t = int(session.logits.argmax())
        out.append(t)
        session.decode(t)
    return out


@pytest.fixture(scope="module")
def reference(smol):
    """A cold prefill of the second prompt: its logits and greedy continuation."""
    tokens = _prompt(smol, "Name three colours of the sea.")
    s = smol.new_session(2048)
    s.prefill(tokens)
    logits = s.logits.clone()
    return tokens, logits, _greedy(s)


def _check(session, reference) -> float:
    _, logits, greedy = reference
    diff = float((session.logits - logits).abs().max())
    assert diff <= LOGIT_TOLERANCE, diff
    assert _greedy(session) == greedy
    return diff


def test_a_fork_at_the_divergence_point_equals_a_cold_prefill(smol, reference):
    tokens = reference[0]
    other = _prompt(smol, "What is the capital of France?")
    k = next(i for i, (a, b) in enumerate(zip(other, tokens)) if a != b)
    assert k > 512  # the shared rows span two of the donor's prefill chunks
    donor = smol.new_session(2048)
    donor.prefill(other)
    fork = donor.fork(k, logits=False)
    fork.prefill(tokens[k:])
    _check(fork, reference)  # measured 0 to 4e-3: a chunk's size picks its product kernel


def test_a_prompt_split_at_its_anchor_equals_a_cold_prefill(smol, reference):
    """The cold checkpoint's split (prefill to the anchor, save, prefill the rest)."""
    tokens = reference[0]
    anchor = max(j for j, t in enumerate(tokens[:-8]) if t in smol.tokenizer.boundary_ids)
    s = smol.new_session(2048)
    s.prefill(tokens[:anchor])
    s.prefill(tokens[anchor:])
    _check(s, reference)


def test_the_same_prompt_again_prefills_its_last_token_within_the_tolerance(smol, reference):
    """The donor holds the prompt and a reply, without a mark at the prompt's end: the fork takes
    all but the last token, which runs alone (a one-token forward, not the chunk's product)."""
    tokens = reference[0]
    donor = smol.new_session(2048)
    donor.prefill(tokens[:-1])
    donor.prefill(tokens[-1:] + [198, 504])
    fork = donor.fork(len(tokens) - 1, logits=False)
    fork.prefill(tokens[-1:])
    _check(fork, reference)  # measured ~1e-3 (C and torch kernels): not the chunk's bits
