"""SWA storage policies of DSV4 payloads (full, periodic:K, zero): a restored session continues
exactly like an uninterrupted one, files are never read under another policy, the replay length
is the receptive field, periodic snapshots follow the session, and the setting reaches the files
the chat controller writes."""

from __future__ import annotations

import struct

import pytest
import torch

from ds4tui.config import ConfigError, from_mapping
from ds4tui.engine.dsv4 import swa as dsv4_swa
from ds4tui.engine.dsv4.net import Dsv4Trace
from ds4tui.engine.errors import PayloadError
from ds4tui.format.swa_policy import (
    FULL_POLICY,
    SwaPolicy,
    describe_payload,
    parse_policy,
    payload_version,
    policy_of_version,
    zero_replay_start,
)
from tests.engine.dsv4.dsv4_helpers import expected_size, load, save, single_thread, tiny, tokens  # noqa: F401

CHUNK, PERIOD, CTX = 128, 128, 1024
MORE, DECODE = 40, 3  # tokens prefilled after the restore, then greedy decodes
W, L = 16, 6  # tiny-dsv4's window and layer count: zero replays L*(W-1)+1 = 91 tokens (+ grid)
POLICIES = ("full", f"periodic:{PERIOD}", "zero")
# Zero: exact in exact arithmetic, and bit-exact in every case we ran; the one coupling left
# (MoE expert groups of a chunk mixing replayed and converged tokens) could change rounding only.
ZERO_TOL = 1e-4


def _session(policy: str = "full"):
    s = tiny().new_session(CTX, chunk_size=CHUNK)
    s.set_storage_policy(policy)
    return s


def _saves(t: int, seed: int = 1) -> tuple[object, dict[str, bytes], list[int]]:
    """A cold prefill of t tokens (periodic snapshots on), saved under every policy."""
    toks = tokens(t + MORE, seed=seed)
    a = _session(f"periodic:{PERIOD}")
    a.prefill(toks[:t])
    data = {}
    for policy in (f"periodic:{PERIOD}", "zero", "full"):  # periodic first: setting others drops the snapshot
        a.set_storage_policy(policy)
        data[policy] = save(a)
    return a, data, toks


def _continue(s, toks: list[int]) -> tuple[list[torch.Tensor], Dsv4Trace]:
    s.trace = Dsv4Trace()
    s.prefill(toks)
    out = [s.logits.clone()]
    for _ in range(DECODE):
        out.append(s.decode(int(s.logits.argmax())).clone())
    trace, s.trace = s.trace, None
    return out, trace


def _close(x: torch.Tensor, y: torch.Tensor) -> None:
    assert float((x - y).abs().max()) <= ZERO_TOL * max(1.0, float(y.abs().max()))
    assert int(x.argmax()) == int(y.argmax())


@pytest.mark.parametrize("t", [1, 16, 17, 92, 128, 129, 219, 256, 300])
def test_restore_then_continue_equals_uninterrupted(t):
    """On and off the window (16), the ratios (4, 128), the chunk and period (128), zero's
    receptive field (91; 219 puts its start exactly on the grid) and past all of them."""
    a, data, toks = _saves(t)
    restored = {}
    for policy, blob in data.items():
        b = _session()
        load(b, blob)
        assert b.tokens == a.tokens
        info = b.swa.last_restore
        assert info.policy.split(":")[0] == policy.split(":")[0]
        want = {"full": 0, "zero": t - zero_replay_start(t, L, W, CHUNK), f"periodic:{PERIOD}": t % PERIOD}[policy]
        assert info.replayed == want
        if policy == "zero":
            _close(b.logits, a.logits)
            for x, y in zip(b.layers, a.layers):
                _close(x.raw, y.raw)
        else:  # the stored window, or a replay from a chunk boundary: bit for bit
            assert torch.equal(b.logits, a.logits)
            assert all(torch.equal(x.raw, y.raw) for x, y in zip(b.layers, a.layers))
        restored[policy] = b
    want, want_trace = _continue(a, toks[t:])
    for policy, b in restored.items():
        got, trace = _continue(b, toks[t:])
        # identical discrete choices: indexer top-k sets and expert ids at every position
        assert trace.indexer == want_trace.indexer and trace.experts == want_trace.experts
        if policy == "zero":
            for x, y in zip(got, want):
                _close(x, y)
        else:
            assert all(torch.equal(x, y) for x, y in zip(got, want))
            a.set_storage_policy("full")
            assert save(b) == save(a)  # the whole state, byte for byte


def test_sizes_and_header_tags():
    t = 300
    a, data, _ = _saves(t)
    cfg, row = tiny().cfg, tiny().cfg.head_dim * 4
    full = expected_size(cfg, t)
    p = t // PERIOD * PERIOD
    assert len(data["full"]) == full
    assert len(data[f"periodic:{PERIOD}"]) == full + 16 - L * row * (min(t, W) - min(p, W))
    assert len(data["zero"]) == full + 16 - L * row * min(t, W)
    for policy, blob in data.items():
        version, live = struct.unpack_from("<I", blob, 4)[0], struct.unpack_from("<I", blob, 48)[0]
        assert policy_of_version(version) == parse_policy(policy)
        assert live == {"full": W, "zero": 0}.get(policy, W)  # periodic: min(P, W) = W
    assert struct.unpack_from("<I", data["full"], 4)[0] == 1  # today's bytes: ds4's version 1
    b = _session("zero")
    b.prefill(tokens(50))
    assert b.payload_bytes() == len(save(b))


def _retag(blob: bytes, version: int, live: int) -> bytes:
    return blob[:4] + struct.pack("<I", version) + blob[8:48] + struct.pack("<I", live) + blob[52:]


@pytest.fixture(scope="module")
def saved_300():
    return _saves(300, seed=3)[1]


@pytest.mark.parametrize("written, claimed", [(w, c) for w in POLICIES for c in POLICIES if w != c])
def test_a_file_is_never_read_under_another_policy(saved_300, written, claimed):
    """Rewrite the header's tag (and live_raw_rows, to get past that check) to another policy:
    the marker block or the section sizes refuse it, and the session stays usable."""
    pol = parse_policy(claimed)
    live = {"full": W, "zero": 0}.get(pol.kind, W)
    blob = _retag(saved_300[written], payload_version(pol), live)
    s = _session()
    with pytest.raises(PayloadError, match="SWA marker|trailing bytes|truncated"):
        load(s, blob)
    assert s.tokens == [] and s.logits is None
    s.prefill(tokens(5))  # still usable


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d[:4] + struct.pack("<I", 4) + d[8:], "not a DSV4 layout"),
    (lambda d: d[:4] + struct.pack("<I", (64 << 8) | 3) + d[8:], "not a DSV4 layout"),  # zero with a period
    (lambda d: d[:4] + struct.pack("<I", (100 << 8) | 2) + d[8:], "not a multiple of the chunk"),
], ids=["unknown-code", "zero-with-period", "period-off-chunk"])
def test_unknown_tags_are_rejected(saved_300, mutate, match):
    with pytest.raises(PayloadError, match=match):
        load(_session(), mutate(saved_300["zero"]))


def test_a_damaged_marker_is_rejected(saved_300):
    blob = saved_300["zero"]
    at = 52 + 32 + 4 * 300 + 4 * tiny().cfg.vocab_size + 8 * L  # after the per-layer counts
    assert blob[at : at + 4] == b"SWAP"
    with pytest.raises(PayloadError, match="SWA marker"):
        load(_session(), blob[:at] + b"SWAQ" + blob[at + 4 :])


def test_replaying_only_the_window_is_not_enough(monkeypatch):
    """Why zero re-runs L*(W-1)+1 tokens: re-running just the last W leaves every layer above
    the first with rows computed from a wrong residual stream."""
    t = 283
    a = _session("zero")
    a.prefill(tokens(t, seed=7))
    blob = save(a)
    monkeypatch.setattr(dsv4_swa, "zero_replay_start", lambda *args: t - W)
    b = _session()
    load(b, blob)
    assert b.swa.last_restore.replayed == W
    assert float((b.logits - a.logits).abs().max()) > 100 * ZERO_TOL
    assert not torch.equal(b.layers[-1].raw, a.layers[-1].raw)


def test_periodic_snapshots_follow_the_session():
    """No snapshot at the last frontier (restored from a full file): the save is full. Decoding
    across a frontier takes one; a periodic file restores it, so a re-save is identical."""
    toks = tokens(300, seed=11)
    a = _session("full")
    a.prefill(toks[:200])
    b = _session(f"periodic:{PERIOD}")
    load(b, save(a))
    assert struct.unpack_from("<I", save(b), 4)[0] == 1  # fell back to full (no window at 128)
    for tok in toks[200:260]:  # decode across 256
        b.decode(tok)
    assert b.swa.snapshot_at == 256
    blob = save(b)
    assert policy_of_version(struct.unpack_from("<I", blob, 4)[0]) == SwaPolicy("periodic", PERIOD)
    c = _session(f"periodic:{PERIOD}")
    load(c, blob)
    assert c.swa.last_restore.replayed == 4 and c.swa.snapshot_at == 256
    assert save(c)[: 84 + 4 * 260] == blob[: 84 + 4 * 260]  # header, fingerprint, tokens
    # the 4 tokens were decoded by b and prefilled by the replay: same math, other matmul shapes
    _close(c.logits, b.logits)
    assert len(save(c)) == len(blob)
    d = _session(f"periodic:{PERIOD}")
    load(d, save(c))
    assert save(d) == save(c)  # save(load(save(s))) is byte-identical under periodic too


def test_policy_text_tags_and_inspect_line():
    assert str(parse_policy(" Periodic:4096 ")) == "periodic:4096" and parse_policy("zero").kind == "zero"
    for bad in ("periodic", "periodic:0", "periodic:x", "sometimes", ""):
        with pytest.raises(ValueError):
            parse_policy(bad)
    for pol in (FULL_POLICY, SwaPolicy("zero"), SwaPolicy("periodic", 2048)):
        assert policy_of_version(payload_version(pol)) == pol
    assert payload_version(FULL_POLICY) == 1 and SwaPolicy("periodic", 100).effective_period(128) == 128
    header = {"payload_version": payload_version(SwaPolicy("zero")), "token_count": 300,
              "prefill_chunk": CHUNK, "layer_count": L, "raw_window": W}
    assert describe_payload(header) == "zero (no raw window; a load re-runs the last 108 tokens)"
    header["payload_version"] = payload_version(SwaPolicy("periodic", 256))
    assert "token 256; a load re-runs 44 tokens" in describe_payload(header)
    assert from_mapping({"swa_policy": "periodic:512"}).swa_policy == "periodic:512"
    with pytest.raises(ConfigError, match="swa_policy"):
        from_mapping({"swa_policy": "half"})


@pytest.mark.parametrize("policy", ["zero", "periodic:64"])
def test_the_controller_writes_and_restores_files_of_its_policy(policy, tmp_path):
    """The config's swa_policy reaches the titled file; a fresh controller resumes it (with a
    replay) and gives the same next reply as the session that never left memory."""
    from ds4tui.format.kvc import read_kvc
    from ds4tui.engine.loader import load_model
    from tests.chat.conftest import Recorder, make_controller

    model = load_model("tiny-dsv4")
    first = make_controller(model, tmp_path, swa_policy=policy)
    conv = first.new_conversation()
    first.send(conv.key, "Hello there, tiny model.", Recorder())
    with open(tmp_path / f"{conv.saved_sha}.kv", "rb") as fp:
        kf = read_kvc(fp, with_trailers=False)
    assert str(policy_of_version(kf.payload_header.payload_version)).split(":")[0] == policy.split(":")[0]
    second = make_controller(model, tmp_path)  # the reader's own policy does not matter
    resumed = second.resume(conv.saved_sha[:12], Recorder())
    assert resumed.session.swa.last_restore.replayed > 0
    a, b = Recorder(), Recorder()
    first.send(conv.key, "Tell me more.", a)
    second.send(resumed.key, "Tell me more.", b)
    assert b.reply == a.reply


def test_bench_swa_runs_and_reports_each_policy(capsys):
    """`ds4tui bench swa --json` on a small variant: one row per policy and length, exact restores,
    the zero file smallest, the recomputed counts of the layouts."""
    import json

    from ds4tui.cli import main

    code = main(["bench", "swa", "--json", "--lengths", "150", "--layers", "3", "--window", "16",
                 "--period", "128", "--chunk", "128", "--suffix", "4", "--repeats", "1"])
    r = json.loads(capsys.readouterr().out)
    rows = {row["policy"]: row for row in r["rows"]}
    assert code == 0 and set(rows) == {"cold", "full", "periodic:128", "zero"}
    assert rows["zero"]["file_bytes"] < rows["periodic:128"]["file_bytes"] == rows["full"]["file_bytes"] + 16
    assert [rows[p]["recomputed"] for p in ("full", "periodic:128", "zero")] == [0, 22, 86]  # zero: 3*15+1 = 46, start 104 -> grid 64
    assert all(rows[p]["max_logit_diff"] == 0.0 for p in ("full", "periodic:128"))
    assert rows["zero"]["max_logit_diff"] <= ZERO_TOL
