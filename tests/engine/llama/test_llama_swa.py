"""Gemma 3 sessions: sliding layers keep a ring of W rows, and a payload stores them under the
session's SWA policy. Save at T, load, continue: bit-exact against the saver continuing, for
every policy, at T on both sides of the window W, of the period and of the zero replay field."""

from __future__ import annotations

import io

import pytest
import torch

from ds4tui.engine.errors import PayloadError
from ds4tui.engine.llama.session import LlamaSession
from ds4tui.engine.llama.weights import load_llama_hf
from tests.engine.llama.arch_models import VOCAB, WINDOW, hf_model, save_hf_dir
from tests.engine.llama.payload_orders import as_token_major

pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHUNK = 8
PERIOD = 16  # effective period 16: a multiple of the chunk
CTX = 256
TOKENS = torch.randint(3, VOCAB, (CTX,), generator=torch.Generator().manual_seed(3)).tolist()
# The zero replay field: 6 sliding layers x (W - 1) + 1 = 91 tokens (then back to a chunk start).
LENGTHS = [WINDOW - 1, WINDOW + 1, PERIOD + CHUNK, 2 * PERIOD + 1, 90, 92]
POLICIES = ["full", f"periodic:{PERIOD}", "zero"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS4TUI_DATA_DIR", str(root / "data"))
        return load_llama_hf(save_hf_dir(hf_model("gemma3"), root / "hf"), "tiny-gemma3")


def _session(model, policy: str | None, kv_dtype: str = "f16") -> LlamaSession:
    s = LlamaSession(model, CTX, CHUNK, kv_dtype=kv_dtype)
    if policy is not None:
        assert s.set_storage_policy(policy)
    return s


def _saved(s: LlamaSession) -> bytes:
    buf = io.BytesIO()
    s.save_payload(buf)
    assert len(buf.getvalue()) == s.payload_bytes()
    return buf.getvalue()


def _load(model, data: bytes, policy: str | None = None, kv_dtype: str = "f16") -> LlamaSession:
    s = _session(model, policy, kv_dtype)
    s.load_payload(io.BytesIO(data), len(data))
    return s


def _expected_replay(policy: str, t: int) -> int:
    if policy == "full":
        return 0
    if policy == "zero":
        return t - max(0, t - 91) // CHUNK * CHUNK
    return t % PERIOD


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("t", LENGTHS)
def test_save_load_continue_is_bit_exact(gemma, policy, t, kv_dtype):
    a = _session(gemma, policy, kv_dtype)
    a.prefill(TOKENS[:t])
    b = _load(gemma, _saved(a), policy, kv_dtype)
    assert b.tokens == a.tokens and torch.equal(b.logits, a.logits)
    info = b.swa.last_restore
    assert info.replayed == _expected_replay(policy, t)
    assert info.logit_delta in (None, 0.0)
    more = TOKENS[t : t + 11]
    a.prefill(more)
    b.prefill(more)
    assert torch.equal(a.logits, b.logits)
    for _ in range(3):
        tok = int(a.logits.argmax())
        assert torch.equal(a.decode(tok), b.decode(tok))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_restore_told_the_next_tokens_runs_no_forward_alongside(gemma, policy, monkeypatch):
    """Sliding layers: the rings are rebuilt after the read (and the next chunk's rows would
    share ring slots with the read's), so load_payload_ahead is a plain load; the prefill
    does the work, and the result is the sequential one."""
    a = _session(gemma, policy)
    t = 2 * PERIOD + 5
    a.prefill(TOKENS[:t])
    data, more = _saved(a), TOKENS[t:t + 6]
    want = _load(gemma, data, policy)
    want.prefill(more)
    calls = []
    inner = gemma.forward
    monkeypatch.setattr(gemma, "forward", lambda *args, **kw: (calls.append(kw.get("before_layer")), inner(*args, **kw))[1])
    b = _session(gemma, policy)
    b.load_payload_ahead(io.BytesIO(data), len(data), more)
    assert not any(calls)  # no forward alongside (the replay of a zero or periodic file ran without)
    b.prefill(more)
    assert b.tokens == want.tokens and torch.equal(b.logits, want.logits)
    assert all(torch.equal(x, y) for x, y in zip(b.kv, want.kv))


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("t", [WINDOW - 1, 2 * PERIOD + 5])
def test_a_token_major_payload_still_loads_exactly(gemma, policy, t, kv_dtype):
    """A file in the row order written before the head-major one (no KV_HEAD_MAJOR bit) restores
    the same rings and global rows, wrapped rings included (t past the window), and saves again
    as the head-major file."""
    a = _session(gemma, policy, kv_dtype)
    a.prefill(TOKENS[:t])
    data = _saved(a)
    old = as_token_major(data, gemma.cfg)
    b = _load(gemma, old, policy, kv_dtype)
    c = _load(gemma, data, policy, kv_dtype)
    assert b.tokens == c.tokens == a.tokens and torch.equal(b.logits, a.logits) and torch.equal(c.logits, a.logits)
    assert all(torch.equal(x, y) for x, y in zip(b.kv, c.kv))
    assert _saved(b) == _saved(c)
    more = TOKENS[t : t + 5]
    a.prefill(more)
    b.prefill(more)
    assert torch.equal(a.logits, b.logits)


def test_head_major_rows_of_a_wrapped_ring(gemma):
    """A sliding layer's rows in the file are, per K/V and head, the window oldest first: the
    ring's slots from (T - W) % W to its end, then from its start."""
    a = _session(gemma, None)
    t = 2 * WINDOW + 5
    a.prefill(TOKENS[:t])
    data = _saved(a)
    cfg = gemma.cfg
    layer = cfg.sliding_layers[0]
    itemsize = 2
    run = WINDOW * cfg.head_dim * itemsize
    at = 52 + 32 + 4 * t + 4 * cfg.vocab_size + 8 * cfg.num_layers
    for i in range(layer):
        rows = WINDOW if cfg.is_sliding(i) else t
        at += rows * 2 * cfg.num_kv_heads * cfg.head_dim * itemsize
    ring = a.kv[layer]
    oldest_first = torch.cat([ring[:, :, t % WINDOW:], ring[:, :, :t % WINDOW]], dim=2)
    assert data[at:at + 2 * cfg.num_kv_heads * run] == oldest_first.contiguous().numpy().tobytes()


def test_replayed_tokens_and_payload_sizes(gemma):
    a = _session(gemma, None)
    a.prefill(TOKENS[:130])
    sizes, replayed = {}, {}
    for policy in POLICIES:
        assert a.set_storage_policy(policy)
        data = _saved(a)
        b = _load(gemma, data)
        sizes[policy], replayed[policy] = len(data), b.swa.last_restore.replayed
    # A periodic file of a session that had no snapshot at its frontier (policy set late) is a
    # full one; the zero replay starts at the chunk start before 130 - 91 = 39.
    assert replayed == {"full": 0, f"periodic:{PERIOD}": 0, "zero": 130 - 32}
    row = 2 * gemma.cfg.kv_row_floats  # f16 rows
    assert sizes["full"] - sizes["zero"] == 6 * WINDOW * row - 16  # the rings, less the marker block
    p = _session(gemma, f"periodic:{PERIOD}")
    p.prefill(TOKENS[:130])
    data = _saved(p)
    assert len(data) == sizes["full"] + 16  # the window at 128 (a full ring) and the marker
    assert _load(gemma, data).swa.last_restore.replayed == 2


def test_memory_holds_global_layers_whole_and_sliding_rings(gemma):
    s = _session(gemma, None)
    full = gemma.cfg.num_layers * 2 * gemma.cfg.num_kv_heads * CTX * gemma.cfg.head_dim * 2  # f16
    assert s.kv_bytes == full * (6 * WINDOW + CTX) // (7 * CTX)
    assert _session(gemma, None, "f32").kv_bytes == 2 * s.kv_bytes


@pytest.mark.parametrize("policy", POLICIES)
def test_a_file_is_never_read_under_another_kv_dtype(gemma, policy):
    """The KV_F16 bit of payload_version says the rows' type; the other type's session rejects
    the file with that reason."""
    files = {}
    for dtype in ("f16", "f32"):
        a = _session(gemma, policy, dtype)
        a.prefill(TOKENS[:40])
        files[dtype] = _saved(a)
        other = "f32" if dtype == "f16" else "f16"
        with pytest.raises(PayloadError, match=f"payload holds {dtype} K/V rows, this session's kv_dtype is {other}"):
            _load(gemma, files[dtype], policy, other)
        assert _load(gemma, files[dtype], policy, dtype).tokens == TOKENS[:40]
    version = int.from_bytes(files["f16"][4:8], "little")
    assert version & 0x80 and not int.from_bytes(files["f32"][4:8], "little") & 0x80
    assert len(files["f32"]) > len(files["f16"])


def test_a_file_is_never_read_under_another_policy(gemma):
    a = _session(gemma, "zero")
    a.prefill(TOKENS[:40])
    data = bytearray(_saved(a))
    data[4:8] = (0xC0 | 1).to_bytes(4, "little")  # claim full (f16 head-major rows): the row count then disagrees
    with pytest.raises(PayloadError):
        _load(gemma, bytes(data))
    full = _session(gemma, None)
    full.prefill(TOKENS[:40])
    data = bytearray(_saved(full))
    data[4:8] = (0xC0 | 3).to_bytes(4, "little")  # claim zero
    with pytest.raises(PayloadError):
        _load(gemma, bytes(data))


def test_full_attention_models_ignore_the_policy(gemma, tmp_path):
    from ds4tui.engine.loader import load_model

    tiny = load_model("tiny-llama")
    s = tiny.new_session(64)
    assert s.set_storage_policy("zero") is False


@pytest.mark.parametrize("policy", ["zero", "periodic:64"])
def test_the_controller_saves_and_resumes_gemma_sessions_under_its_policy(gemma, policy, tmp_path):
    """The chat's swa_policy reaches a Gemma 3 session's titled file, smaller than a full one for
    zero; a fresh controller resumes it (replaying) and continues exactly like the live chat."""
    from ds4tui.format.kvc import read_kvc
    from ds4tui.format.swa_policy import kv_dtype_of_version, policy_of_version
    from tests.chat.conftest import Recorder, make_controller

    first = make_controller(gemma, tmp_path, swa_policy=policy)
    conv = first.new_conversation()
    first.send(conv.key, "Hello there, tiny model.", Recorder())
    with open(tmp_path / f"{conv.saved_sha}.kv", "rb") as fp:
        kf = read_kvc(fp, with_trailers=False)
    dtype, version = kv_dtype_of_version(kf.payload_header.payload_version)
    assert dtype == "f16" and policy_of_version(version).kind == policy.split(":")[0]
    second = make_controller(gemma, tmp_path)
    resumed = second.resume(conv.saved_sha[:12], Recorder())
    assert resumed.session.swa.last_restore.replayed == len(resumed.session.tokens)  # short: all of it
    a, b = Recorder(), Recorder()
    first.send(conv.key, "Tell me more.", a)
    second.send(resumed.key, "Tell me more.", b)
    assert b.reply == a.reply


def test_inspect_line_of_a_gemma_zero_file(gemma):
    """`kv inspect` and the cache browser read the policy from the header alone; for a llama-family
    file the zero replay is given as its bound (the header does not say how many layers slide)."""
    from ds4tui.format.payload import MODEL_ID_LLAMA, unpack_dsv4_header
    from ds4tui.format.swa_policy import describe_payload, payload_kv_dtype

    a = _session(gemma, "zero")
    a.prefill(TOKENS[:130])
    header = unpack_dsv4_header(_saved(a)[:52])
    line = describe_payload(header.__dict__, MODEL_ID_LLAMA)
    assert line == "zero (no sliding-window rows; a load re-runs at most the last 106 tokens)"  # 7 x 15 + 1
    assert payload_kv_dtype(header.__dict__, MODEL_ID_LLAMA) == "f16"
    assert payload_kv_dtype(unpack_dsv4_header(_saved(_session(gemma, "zero", "f32"))[:52]).__dict__, MODEL_ID_LLAMA) == "f32"
    assert _load(gemma, _saved(a)).swa.last_restore.replayed == 130 - 32  # within the bound


def _history(s: LlamaSession, upto: int) -> LlamaSession:
    """prefill 40, decode 3, prefill 30, decode 3 (76 tokens), stopped at `upto`."""
    for kind, a, b in (("p", 0, 40), ("d", 40, 43), ("p", 43, 73), ("d", 73, 76)):
        b = min(b, upto)
        if a >= b:
            break
        if kind == "p":
            s.prefill(TOKENS[a:b])
        else:
            for t in TOKENS[a:b]:
                s.decode(t)
    return s


def _same_from_here(a: LlamaSession, b: LlamaSession) -> None:
    assert a.tokens == b.tokens and torch.equal(a.logits, b.logits) and _saved(a) == _saved(b)
    for s in (a, b):
        s.prefill(TOKENS[200:220])
        s.decode(TOKENS[220])
    assert torch.equal(a.logits, b.logits)


@pytest.mark.parametrize("n, how, replay", [(40, "kept", 0), (42, "mark", 2), (60, "mark", 20), (75, "mark", 2)])
def test_rewind_of_sliding_rings_equals_the_twin(gemma, n, how, replay):
    """A mark keeps the rings with the logits; between marks the rings of the nearest one come
    back and the tokens after it are fed again as they first came."""
    a = _history(_session(gemma, None), 76)
    cost = a.rewind(n)
    assert (cost.how, cost.replay) == (how, replay)
    _same_from_here(a, _history(_session(gemma, None), n))


def test_rewind_without_a_mark_rebuilds_the_rings_like_a_zero_load(gemma):
    """No mark at or after the receptive field's start: the rings are rebuilt from zeros by
    re-running 120 - 24 tokens with the global layers frozen, bit for bit."""
    a = _session(gemma, None)
    a.prefill(TOKENS[:130])
    a.decode(TOKENS[130])
    cost = a.rewind(120)
    assert (cost.how, cost.restore_from, cost.replay) == ("rebuild", 24, 96)
    twin = _session(gemma, None)
    twin.prefill(TOKENS[:120])
    _same_from_here(a, twin)


def test_fork_copies_the_rings(gemma):
    a = _history(_session(gemma, None), 76)
    before = _saved(a)
    f = a.fork(40)
    f.prefill(TOKENS[300:320])  # the fork's writes must not reach the parent
    assert _saved(a) == before
    f.rewind(40)
    _same_from_here(f, _history(_session(gemma, None), 40))


@pytest.mark.parametrize("policy", ["zero", f"periodic:{PERIOD}"])
def test_a_released_session_s_rings_are_cleared_for_the_next_one(gemma, policy):
    """A recycled buffer set (LlamaModel.release_session) arrives with another conversation's
    ring rows, and a zero-policy load replays over rings it has not rebuilt yet, which must
    read as zeros: the restored session matches one restored into fresh memory."""
    saver = _session(gemma, policy)
    saver.prefill(TOKENS[:92])
    data = _saved(saver)
    old = LlamaSession(gemma, CTX, CHUNK)
    old.prefill(TOKENS[100:230])  # every ring full of other rows
    ptrs = [t.data_ptr() for t in old.kv]
    if gemma._preparing is not None:  # an earlier test's controller may be preparing one
        gemma._preparing.join()
    gemma._spare = None  # (this module's model is shared: a spare may be left over)
    gemma.release_session(old)
    recycled = LlamaSession(gemma, CTX, CHUNK, kv=gemma._spare)
    gemma._spare = None
    assert [t.data_ptr() for t in recycled.kv] == ptrs
    assert recycled.set_storage_policy(policy)
    recycled.load_payload(io.BytesIO(data), len(data))
    fresh = _load(gemma, data, policy)
    assert recycled.swa.last_restore.replayed == fresh.swa.last_restore.replayed > 0
    _same_from_here(recycled, fresh)
