"""A message's actions on screen (issue 34): export to a folder of its own, ..."""

from __future__ import annotations

import os
from pathlib import Path

from ds4tui import paths
from ds4tui.chat import events as ev
from ds4tui.screens.chat import ChatScreen
from ds4tui.screens.widgets.chat_log import AssistantMessage, UserMessage
from ds4tui.screens.widgets.message_menu import MessageMenu
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


async def _one_exchange(pilot, app, text="Hello."):
    await send(pilot, text)
    log = app.chat._pane(app.chat._active).log
    return log, log.query(UserMessage).last(), log.query(AssistantMessage).last()


async def test_the_selected_message_is_framed_and_enter_opens_its_menu(tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv")))
    async with app.run_test(size=SIZE) as pilot:
        log, question, reply = await _one_exchange(pilot, app)
        assert question.styles.border_top[0] == "blank"  # a frame nobody sees, until selected
        question.focus()
        await pilot.pause()
        assert question.styles.border_top[0] == "round" and reply.styles.border_top[0] == "blank"
        assert "y copy" in str(question.border_subtitle)
        await pilot.press("down")  # ↓ selects the next message
        assert app.focused is reply and reply.styles.border_top[0] == "round"
        await pilot.press("enter")
        await pilot.pause()
        menu = app.chat.query_one(MessageMenu)
        assert app.focused is menu and menu.target is reply
        assert [o.id for o in menu._options] == ["copy", "fork", "regenerate"]
        assert reply.has_class("-menu-open") and reply.styles.border_top[0] == "round"  # still framed
        await pilot.press("escape")
        await pilot.pause()
        assert not app.chat.query(MessageMenu) and app.focused is reply


async def test_fork_at_the_first_message_opens_a_new_chat_with_it_in_the_box(tiny_llama, tmp_path):
    """Nothing comes before the first message: the fork is a fresh chat with the same settings
    and the message waiting in the box (main said "Error: fork cannot fork at 0 of 2 messages")."""
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv")))
    async with app.run_test(size=SIZE) as pilot:
        log, question, reply = await _one_exchange(pilot, app, "The very first question.")
        parent = app.chat._active
        app.chat.controller.set_chat_settings(parent, temperature=0.3)
        await pilot.click(question, offset=(question.outer_size.width - 3, 0))  # its ⋯
        await pilot.pause()
        menu = app.chat.query_one(MessageMenu)
        assert menu.target is question and [o.id for o in menu._options] == ["copy", "edit", "fork"]
        await pilot.press("f")  # the menu's own key for "Fork"
        for _ in range(50):
            await pilot.pause(0.02)
            if app.chat._active != parent:
                break
        fork = app.chat.controller.get(app.chat._active)
        assert fork.key != parent and fork.messages == [] and fork.overrides.get("temperature") == 0.3
        assert app.chat.query_one("#prompt").text == "The very first question."
        assert not [m for m in app.events(ev.ChatError)]
        assert any("first message is in the box" in n.message for n in app.toasts)


async def test_right_click_opens_the_menu_and_c_copies_a_code_block(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.delenv("STY", raising=False)
    monkeypatch.setenv("TERM", "xterm-kitty")  # a terminal known to take OSC 52
    for name in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv")))
    copied = []
    app.copy_to_clipboard = copied.append
    reply_text = "Two ways:\n\n```python\nprint(1)\n```\n\nor\n\n```sh\necho 1\necho 2\n```\n"
    async with app.run_test(size=SIZE) as pilot:
        await app.wait_for(ChatScreen.ModelReady)
        conv = app.chat.controller.import_messages(
            [{"role": "user", "content": "How?"}, {"role": "assistant", "content": reply_text}], "Code")
        pane = await app.chat._add_pane(conv.key)
        pane.log.show_messages(conv.visible_messages())
        app.chat._switch(conv.key)
        await pilot.pause()
        reply = pane.log.query(AssistantMessage).last()
        await pilot.click(reply, offset=(5, 2), button=3)  # a right-click
        await pilot.pause()
        menu = app.chat.query_one(MessageMenu)
        assert [o.id for o in menu._options] == ["copy", "code:0", "code:1", "fork", "regenerate"]
        assert "Copy code 2: sh, 2 lines" in str(menu.get_option_at_index(2).prompt)
        await pilot.press("escape")
        await pilot.press("c")  # two blocks: c asks which
        await pilot.pause()
        menu = app.chat.query_one(MessageMenu)
        assert [o.id for o in menu._options] == ["code:0", "code:1"]
        await pilot.press("2")
        await pilot.pause()
        assert copied == ["echo 1\necho 2\n"]
        assert app.toasts[-1].message == "Copied code block 2 (14 characters, OSC 52)"
        await pilot.press("y")  # the whole reply
        assert copied[-1] == reply_text


async def test_inside_tmux_without_set_clipboard_the_copy_goes_to_a_file_and_says_where(
        tiny_llama, tmp_path, monkeypatch):
    from ds4tui.screens import clipboard

    monkeypatch.setenv("TMUX", "/tmp/tmux-0/default,1,0")
    for name in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(clipboard, "tmux_set_clipboard", lambda: "external")  # tmux's default
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv")))
    copied = []
    app.copy_to_clipboard = copied.append
    async with app.run_test(size=SIZE) as pilot:
        log, question, reply = await _one_exchange(pilot, app, "Copy this question.")
        question.focus()
        await pilot.press("y")
        await pilot.pause()
    saved = paths.clipboard_file()
    assert copied == ["Copy this question."]  # OSC 52 is still sent
    assert saved.read_text() == "Copy this question." and saved.stat().st_mode & 0o077 == 0
    message = app.toasts[-1].message
    assert message.startswith(f"Saved the message (19 characters) to {saved}")
    assert "set-clipboard is external" in message and "OSC 52)" not in message


async def test_delete_this_version_from_the_menu_removes_it_from_the_store_too(tiny_llama, tmp_path):
    app = ChatHost(tiny_llama, config=chat_config(tiny_llama, cache_dir=str(tmp_path / "kv"), temperature=1.0, seed=3))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hello there.")
        ctl, key = app.chat.controller, app.chat._active
        first = ctl.get(key).messages[-1]["content"]
        mark = len(app.seen)
        await pilot.press("ctrl+r")
        await app.wait_for(ChatScreen.TurnEnded, after=mark)
        second = ctl.get(key).messages[-1]["content"]
        assert second != first
        reply = app.chat._pane(key).log.last_assistant
        reply.focus()
        await pilot.press("enter")
        await pilot.pause()
        menu = app.chat.query_one(MessageMenu)
        assert [o.id for o in menu._options][-3:] == ["prev", "next", "delete-version"]
        menu.highlighted = menu.option_count - 1
        await pilot.press("enter")
        await pilot.pause()
        from ds4tui.screens.widgets.confirm_dialog import ConfirmDialog

        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await pilot.pause()
        conv = ctl.get(key)
        assert conv.messages[-1]["content"] == first and reply.text == first
        assert ctl.alternatives(key, len(conv.messages) - 1) == (0, 1) and "version" not in str(
            reply.query_one(".stats").render())
        stored = ctl.history.store.load(conv.store_id)
        assert stored.messages[-1]["content"] == first
        assert second not in [v for vs in stored.alternatives.values() for v in vs]  # gone for good
        assert any(n.message.startswith("Deleted version 2 of 2") for n in app.toasts)
