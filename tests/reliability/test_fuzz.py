"""Seeded own-format fuzz: every mutation kind, zero crashes, hangs, silent wrong loads, writes
outside the directory or leftover temp files (`ds4tui bench reliability` runs more)."""

from __future__ import annotations

import pytest

from ds4tui.bench.reliability import MUTATIONS, OUTCOMES, run


@pytest.fixture(scope="module")
def tiny_llama():
    from ds4tui.engine.loader import load_model

    return load_model("tiny-llama")


def test_every_mutation_kind_is_rejected_or_loads_intact(tiny_llama):
    report = run(4 * len(MUTATIONS), seed=7, model=tiny_llama)
    assert {o: report.bad[o] for o in OUTCOMES} == {o: 0 for o in OUTCOMES}, report.table()
    assert set(report.kinds) == set(MUTATIONS) and min(report.kinds.values()) == 4
    # Both verdicts happen: the oracle sees real loads (a strip of the checksum, a repaired
    # ds4 hit, a flipped pin bit) as well as rejections.
    assert report.results["rejected"] > 0 and report.results["loaded intact"] > 0


def test_the_oracle_catches_wrong_loads_when_the_checks_are_off(tiny_llama, monkeypatch):
    """Without the checksum and the non-finite check, payload flips load silently: counted."""
    from ds4tui.cache import loading
    from ds4tui.engine.llama import session_payload

    def unchecked(fp, kf):
        fp.seek(kf.payload_offset)
        return fp
    monkeypatch.setattr(loading, "payload_stream", unchecked)
    monkeypatch.setattr(session_payload, "check_finite", lambda t, what: None)
    report = run(2 * len(MUTATIONS), seed=7, model=tiny_llama)
    assert report.bad["silent wrong loads"] > 0
