"""Session.rewind and Session.fork: back to an earlier point, bit for bit, for both families.

The reference is always a twin session that fed the same tokens by the same calls and
stopped at the rewind point: after the rewind the two hold the same tokens, the same
next-token logits and save the same payload bytes, and continuing both with the same
tokens gives identical logits. DSV4 runs under every SWA storage policy, from a live
session and from one restored from a file of that policy.
"""

from __future__ import annotations

import io

import pytest
import torch

from ds4tui.engine.loader import load_model

CTX = 1024
PROMPT, DECODED, SECOND = 150, 3, 47  # prefill 150, decode 3, prefill 47 more, decode 3
POLICIES = ("full", "periodic:128", "zero")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def toks(n: int, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(8, 512, (n,), generator=g).tolist()


T = toks(400)
END = PROMPT + DECODED + SECOND + DECODED  # 203


def payload(s) -> bytes:
    buf = io.BytesIO()
    s.save_payload(buf)
    return buf.getvalue()


def session(spec: str, policy: str = "full", kv_dtype: str | None = None):
    s = load_model(spec).new_session(CTX, kv_dtype=kv_dtype)
    s.set_storage_policy(policy)
    return s


def run(s, upto: int = END):
    """The history every test rewinds: prefill, decode steps, prefill, decode steps."""
    steps = [("prefill", 0, PROMPT), ("decode", PROMPT, PROMPT + DECODED),
             ("prefill", PROMPT + DECODED, PROMPT + DECODED + SECOND),
             ("decode", PROMPT + DECODED + SECOND, END)]
    for kind, a, b in steps:
        b = min(b, upto)
        if a >= b:
            break
        if kind == "prefill":
            s.prefill(T[a:b])
        else:
            for t in T[a:b]:
                s.decode(t)
    return s


def assert_same(a, b) -> None:
    assert a.tokens == b.tokens
    assert torch.equal(a.logits, b.logits)
    assert payload(a) == payload(b)
    for x in (a, b):
        x.prefill(T[300:330])
        x.decode(T[330])
    assert torch.equal(a.logits, b.logits)


@pytest.mark.parametrize("spec, policy, kv_dtype", [("tiny-llama", "full", "f16"), ("tiny-llama", "full", "f32")]
                         + [("tiny-dsv4", p, None) for p in POLICIES])
@pytest.mark.parametrize("n", [PROMPT, PROMPT + 2, PROMPT + DECODED + SECOND, END - 1])
def test_rewind_then_continue_equals_the_twin(spec, policy, kv_dtype, n):
    """At a prompt end (kept), after decode steps, at the end of the second prefill."""
    a = run(session(spec, policy, kv_dtype))
    cost = a.rewind_cost(n)
    got = a.rewind(n)
    assert got == cost and cost.target == n and len(a.tokens) == n
    if n in (PROMPT, PROMPT + DECODED + SECOND):
        assert cost.free and cost.how == "kept"
    assert_same(a, run(session(spec, policy, kv_dtype), upto=n))


@pytest.mark.parametrize("policy", POLICIES)
def test_dsv4_rewind_inside_a_prefill_replays_from_the_mark(policy):
    """Between marks DSV4 restores the nearest one and feeds the rest as it first came (three
    decode steps, then one prefill up to n): the same as a twin that stopped at n."""
    n = PROMPT + DECODED + 20
    a = run(session("tiny-dsv4", policy))
    cost = a.rewind(n)
    assert (cost.restore_from, cost.replay, cost.how) == (PROMPT, DECODED + 20, "mark")
    assert_same(a, run(session("tiny-dsv4", policy), upto=n))


@pytest.mark.parametrize("policy", POLICIES)
def test_dsv4_rewind_of_a_restored_session(policy):
    """A session loaded from a file of each policy (zero and periodic replay the window on
    load) continues, then rewinds to the load point: the same as a twin loaded and stopped."""
    src = run(session("tiny-dsv4", policy), upto=PROMPT)
    blob = payload(src)
    a, twin = session("tiny-dsv4", policy), session("tiny-dsv4", policy)
    for s in (a, twin):
        s.load_payload(io.BytesIO(blob), len(blob))
    assert a.marks() == [PROMPT]
    a.prefill(T[PROMPT:PROMPT + 60])
    a.decode(T[PROMPT + 60])
    assert a.rewind(PROMPT).free
    assert_same(a, twin)


def test_llama_rewind_inside_a_prefill_recomputes_one_token():
    """Inside an earlier chunk only the last position's logits are missing: one decode step
    recomputes them (rows before it are untouched), equal to the chunk's to rounding."""
    n = PROMPT + DECODED + 20
    a = run(session("tiny-llama"))
    cost = a.rewind(n)
    assert (cost.restore_from, cost.replay, cost.how) == (n - 1, 1, "recompute")
    twin = session("tiny-llama")
    twin.prefill(T[:PROMPT])
    for t in T[PROMPT:PROMPT + DECODED]:
        twin.decode(t)
    twin.prefill(T[PROMPT + DECODED:n])
    assert a.tokens == twin.tokens
    assert torch.allclose(a.logits, twin.logits, atol=1e-4, rtol=1e-4)
    assert int(a.logits.argmax()) == int(twin.logits.argmax())


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-dsv4"])
def test_fork_is_an_independent_copy(spec):
    a = run(session(spec))
    before = payload(a)
    f = a.fork(PROMPT)
    assert f.tokens == T[:PROMPT] and f.marks() == [PROMPT]
    f.prefill(T[300:340])  # the fork's writes must not reach the parent
    assert payload(a) == before
    assert_same(_rewound(f, PROMPT), run(session(spec), upto=PROMPT))
    g = a.fork()  # the whole state, logits included
    assert g.tokens == a.tokens and torch.equal(g.logits, a.logits) and payload(g) == before


def _rewound(s, n):
    s.rewind(n)
    return s


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-dsv4"])
def test_rewind_edges(spec):
    a = run(session(spec))
    with pytest.raises(ValueError):
        a.rewind_cost(END + 1)
    assert a.rewind_cost(END).how == "none" and a.rewind(END).free
    assert a.rewind(0).how == "start" and a.tokens == [] and a.logits is None and a.marks() == []
    a.prefill(T[:PROMPT])  # usable afterwards, and equal to a fresh one
    assert_same(a, run(session(spec), upto=PROMPT))


def test_marks_are_bounded():
    s = session("tiny-dsv4")
    for i in range(s.max_marks + 3):
        s.prefill(T[i * 4:(i + 1) * 4])
    assert len(s.marks()) == s.max_marks and s.marks()[-1] == len(s.tokens)
