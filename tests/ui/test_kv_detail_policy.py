"""The detail pane names the SWA storage policy of ds4tui payloads, and only of those."""

from __future__ import annotations

from pathlib import Path

from ds4tui.cache.entry import inspect_file
from ds4tui.screens.widgets.kv_detail import KvDetailInfo, payload_section
from tests.ui import kv_fixtures as fx


def _section(directory: Path, sha: str) -> str:
    entry = inspect_file(directory / f"{sha}.kv", acceptor=None)
    raw = (directory / f"{sha}.kv").read_bytes()[:52]
    return payload_section(KvDetailInfo(entry=entry, raw_header=raw, now=fx.NOW)).plain


def test_payload_section_shows_policy_for_ds4tui_files_only(tmp_path):
    """A ds4tui file (ABI 128) gets a swa_policy line; ds4's own (ABI 2) does not."""
    shas = fx.fixture_dir(tmp_path)
    ours = _section(tmp_path, shas["cold"])
    assert "swa_policy" in ours and "full" in ours
    assert "swa_policy" not in _section(tmp_path, shas["ds4"])
