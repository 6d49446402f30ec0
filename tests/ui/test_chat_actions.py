"""A message's actions on screen (issue 34): export to a folder of its own, ..."""

from __future__ import annotations

import os
from pathlib import Path

from ds4tui import paths
from tests.ui.chat_app import SIZE, ChatHost, chat_config, send


def test_the_export_folder_is_never_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("DS4TUI_EXPORT_DIR")
    monkeypatch.setattr(paths.platformdirs, "user_documents_dir", lambda: str(tmp_path / "Documents"))
    monkeypatch.setenv("DS4TUI_DATA_DIR", str(tmp_path / "data"))
    assert paths.export_dir() == tmp_path / "data" / "exports"  # no Documents folder
    (tmp_path / "Documents").mkdir()
    assert paths.export_dir() == tmp_path / "Documents" / "ds4tui"
    assert paths.export_dir("~/x") == Path("~/x").expanduser()  # the config's export_dir


async def test_export_writes_to_the_export_dir_says_the_full_path_and_keeps_earlier_files(
        tiny_llama, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "exports"
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv"), export_dir=str(out)))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Export me.")
        app.chat.action_export_chat()  # the palette's "Export chat"
        app.chat.action_export_chat()  # again: a second pair, the first kept
        await pilot.pause()
        toasts = [n.message for n in app.toasts if n.title == "Export"]
    assert sorted(os.listdir(out)) == ["Export-me-2.json", "Export-me-2.md", "Export-me.json", "Export-me.md"]
    assert not list(tmp_path.glob("*.md"))  # nothing in the working directory
    assert toasts[0] == f"Wrote {out / 'Export-me.md'} and Export-me.json"
    md = (out / "Export-me.md").read_text()
    assert "last used ?" not in md and "last used 2" in md  # a date, not "?"
    assert "## user\n\nExport me." in md
