"""Shared fixtures: keep the developer's own cache and config out of every test.

Models stay in the real data dir on purpose: the real SmolLM2 GGUF is installed
there by `make test` (`ds4tui models pull`), and the seeded tiny checkpoints are
deterministic, so building them once there only saves time.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_user_dirs_for_the_session(tmp_path_factory):
    """Module- and session-scoped fixtures run before a test's own fixture: they get a
    session-wide temporary place, never the user's cache, config or conversation store."""
    root = tmp_path_factory.mktemp("user-dirs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DS4TUI_CACHE_DIR", str(root / "kv"))
        patch.setenv("DS4TUI_CONFIG", str(root / "config.toml"))
        patch.setenv("DS4TUI_TRANSCRIPTS_DIR", str(root / "transcripts"))
        patch.setenv("DS4TUI_STORE", str(root / "store" / "conversations.sqlite3"))
        patch.setenv("DS4TUI_EXPORT_DIR", str(root / "exports"))
        patch.setenv("DS4TUI_CLIPBOARD_FILE", str(root / "clipboard.txt"))
        yield


@pytest.fixture(autouse=True)
def _isolated_user_dirs(_isolated_user_dirs_for_the_session, tmp_path, monkeypatch):
    monkeypatch.setenv("DS4TUI_CACHE_DIR", str(tmp_path / "kv"))
    monkeypatch.setenv("DS4TUI_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("DS4TUI_TRANSCRIPTS_DIR", str(tmp_path / "transcripts"))
    monkeypatch.setenv("DS4TUI_EXPORT_DIR", str(tmp_path.parent / f"{tmp_path.name}-exports"))
    monkeypatch.setenv("DS4TUI_CLIPBOARD_FILE", str(tmp_path.parent / f"{tmp_path.name}-clipboard.txt"))
    # Beside tmp_path, not in it: tests count the files of the directories they use.
    monkeypatch.setenv("DS4TUI_STORE", str(tmp_path.parent / f"{tmp_path.name}-store" / "conversations.sqlite3"))
    yield
