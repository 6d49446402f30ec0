"""Snapshot of the browser over the four kinds of file: titled session, cold checkpoint, ds4's ABI 2, corrupt.

Deterministic by construction: fixed timestamps in the files, a frozen clock,
UTC local time, a relative directory name, no watcher, a fixed terminal size.
"""

from __future__ import annotations

import time

import pytest

from tests.ui import kv_fixtures as fx
from tests.ui.browser_app import BrowserHost, select, until


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_browser_snapshot(snap_compare, tmp_path, monkeypatch, utc):
    """The table lists all four files with their verdicts; the detail shows the titled session, escaped."""
    monkeypatch.chdir(tmp_path)
    shas = fx.fixture_dir(tmp_path / "kv")
    app = BrowserHost("kv", watch=False)

    async def run_before(pilot):
        await until(pilot, lambda: len(app.shown) == 4, "four rows")
        await select(pilot, shas["titled"])

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)


def test_browser_at_80x24(snap_compare, tmp_path, monkeypatch, utc):
    """80x24: title, reason, pin and status kept, the header's numbers and pinned count, the
    map of the cache, the detail stacked with the hex dump at 8 bytes a row."""
    monkeypatch.chdir(tmp_path)
    shas = fx.fixture_dir(tmp_path / "kv")
    app = BrowserHost("kv", watch=False)

    async def run_before(pilot):
        await until(pilot, lambda: len(app.shown) == 4, "four rows")
        await select(pilot, shas["titled"])

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
